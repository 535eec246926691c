"""Mutants of a torch op's VJP: the op wrapped in a custom Function whose backward is broken."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import Function

from gradtool.numerics.problem import tensor_outputs

SCALE = "x1.01 on one input"
ELEMENT = "one element off by 1 %"
TRANSPOSE = "transposed block"
DROP = "dropped double-backward term"
SHIFT = "rolled by one along a dimension"
SWAP = "gradients swapped between inputs"
CONSTANT = "constant added"
MUTATIONS = (SCALE, ELEMENT, TRANSPOSE, DROP, SHIFT, SWAP, CONSTANT)
# The seeded-bug battery's further operators (tests/test_mutant_battery.py, issue 55); the
# OpInfo benchmark keeps MUTATIONS.
NEGATE = "negated"
ZERO = "zeroed"
FINE = "x1.001 on one input"
BATTERY = (NEGATE, SHIFT, TRANSPOSE, SCALE, FINE, ZERO, ELEMENT, SWAP, DROP)
# What gradtool's diagnosis must say for a mutant to count as named (first-order mutations).
NAMES = {SCALE: ("× numerical",), ELEMENT: ("elements wrong",), TRANSPOSE: ("transposed",),
         SHIFT: ("shifted", "rolled"), SWAP: ("swapped",), CONSTANT: ("constant term",)}
ATOL, RTOL = 1e-5, 1e-3  # gradtool's (and gradcheck's) float64 tolerances

Mutation = tuple[str, int] | None  # (kind, input position), None: the unbroken wrapper


def wrap(fn: Callable[..., Any], values: Sequence[torch.Tensor], mutation: Mutation
         ) -> type[Function] | None:
    """A Function computing fn, whose backward is fn's VJP (mutated); None when fn's outputs
    are not all non-empty float64 tensors that require grad (the wrapper could not carry them)."""
    leaves = [v.detach().clone().requires_grad_(True) for v in values]
    try:
        result = fn(*leaves)
    except Exception:  # noqa: BLE001
        return None
    outs = tensor_outputs(result)
    # float64 for the OpInfo benchmark; the battery's, its inputs' floating dtype (or, where an
    # input is complex, the battery's complex mode, its complex counterpart)
    dtype = next((v.dtype for v in values if v.is_floating_point()), torch.float64)
    dtypes = {dtype, _complex(dtype)} if any(v.is_complex() for v in values) else {dtype}
    if not outs or not all(o.dtype in dtypes and o.requires_grad and o.numel() for o in outs):
        return None
    single = isinstance(result, torch.Tensor)

    class Wrapped(Function):
        @staticmethod
        def forward(ctx, *xs):
            ctx.save_for_backward(*xs)
            got = [o.clone() for o in tensor_outputs(fn(*xs))]
            return got[0] if single else tuple(got)

        @staticmethod
        def backward(ctx, *grads):
            return _vjp(fn, ctx.saved_tensors, grads, mutation)

    Wrapped.__qualname__ = Wrapped.__name__ = f"{getattr(fn, '__name__', 'op')}_vjp"
    return Wrapped


def _vjp(fn: Callable[..., Any], xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
         mutation: Mutation) -> tuple[torch.Tensor, ...]:
    create_graph = torch.is_grad_enabled()  # differentiated again (double backward)
    kind, position = mutation or ("", -1)
    with torch.enable_grad():
        inner = [x.detach().requires_grad_(True) if (kind == DROP and k == position)
                 or not x.requires_grad else x for k, x in enumerate(xs)]
        outs = tensor_outputs(fn(*inner))
        got = torch.autograd.grad(outs, inner, grads, create_graph=create_graph,
                                  allow_unused=True)
    # a sparse input's gradient densified (the battery's sparse mode): a mutation moves elements
    # anywhere, and autograd takes a strided gradient for a sparse input
    got = [torch.zeros(x.shape, dtype=x.dtype, device=x.device) if g is None else
           g.to_dense() if g.layout != torch.strided else g for g, x in zip(got, xs)]
    if kind == SCALE:
        got[position] = got[position] * 1.01
    elif kind == ELEMENT:
        bump = torch.ones_like(got[position]).reshape(-1)
        bump[bump.numel() // 2] = 1.01  # a fixed element, so the mutant stays linear
        got[position] = got[position] * bump.view_as(got[position])
    elif kind == TRANSPOSE:  # non-square: laid back into the shape (a .t().reshape slip)
        got[position] = got[position].transpose(-1, -2).reshape(got[position].shape)
    elif kind == SHIFT:
        dim = _roll_dim(got[position].shape)
        got[position] = got[position].roll(1, dims=dim)
    elif kind == SWAP:
        other = _partner(xs, position)
        got[position], got[other] = got[other], got[position]
    elif kind == CONSTANT:
        got[position] = got[position] + 0.01
    elif kind == NEGATE:
        got[position] = -got[position]
    elif kind == ZERO:
        got[position] = torch.zeros_like(got[position])
    elif kind == FINE:
        got[position] = got[position] * 1.001
    return tuple(got)


def _complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float32: torch.complex64}.get(dtype, dtype)


def _roll_dim(shape: torch.Size) -> int:
    """The last dimension longer than one (a roll along it moves every element)."""
    return max(d for d, size in enumerate(shape) if size > 1)


def _partner(xs: Sequence[torch.Tensor], position: int) -> int | None:
    """Another input of the same shape, whose gradient a swap would exchange with this one's."""
    for k, x in enumerate(xs):
        if k != position and x.shape == xs[position].shape and x.requires_grad:
            return k
    return None


def applicable(values: Sequence[torch.Tensor], kind: str, position: int) -> bool:
    shape = values[position].shape
    if kind == TRANSPOSE:
        return len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1
    if kind == SHIFT:
        return any(size > 1 for size in shape)
    if kind == SWAP:
        return _partner([v.detach().requires_grad_(True) for v in values], position) is not None
    return True


def kept(fn: Callable[..., Any], values: Sequence[torch.Tensor], kind: str, position: int,
         masks: Sequence[torch.Tensor | None] = ()) -> bool:
    """Whether the mutation moves the (first, or for DROP second) order VJP beyond tolerance;
    masks: per input, the elements compared (a sparse input's specified ones; None: all)."""
    if not applicable(values, kind, position):
        return False
    good, bad = wrap(fn, values, None), wrap(fn, values, (kind, position))
    if good is None or bad is None:
        return False
    try:
        a, b = _probe(good, values, kind == DROP), _probe(bad, values, kind == DROP)
    except Exception:  # noqa: BLE001 - e.g. torch has no double backward for the op
        return False
    masks = list(masks) + [None] * (len(a) - len(masks))
    return any(bool(((x - y).abs() > ATOL + RTOL * x.abs())[True if m is None else m].any())
               for x, y, m in zip(a, b, masks))


def _probe(cls: type[Function], values: Sequence[torch.Tensor], second: bool
           ) -> list[torch.Tensor]:
    """A VJP with a seeded random grad_output; for second, the VJP of that VJP."""
    gen = torch.Generator().manual_seed(7)
    leaves = [v.detach().clone().requires_grad_(True) for v in values]
    outs = tensor_outputs(cls.apply(*leaves))
    vs = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, vs, create_graph=second, allow_unused=True)
    if not second:
        return _filled(grads, leaves)
    pairs = [(g, torch.randn(g.shape, generator=gen, dtype=g.dtype))
             for g in grads if g is not None and g.requires_grad]
    if not pairs:
        return []
    again = torch.autograd.grad([g for g, _ in pairs], leaves, [w for _, w in pairs],
                                allow_unused=True)
    return _filled(again, leaves)


def _filled(grads: Sequence[torch.Tensor | None], like: Sequence[torch.Tensor]
            ) -> list[torch.Tensor]:
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, like)]
