"""gradcheck's batched-gradient tests for the drop-in, as torch runs them: backward (vᵀJ) and
forward (J u) mode each at two random vectors, once in a loop and once batched under vmap, the
batched results equal to the looped ones (torch.allclose). Backward batches through autograd's
public `is_grads_batched`; forward mode through the legacy vmap torch's own test uses (forward
AD inside it), which exists under this name from torch 2.4 to 2.15."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from ..numerics.batching import quiet_batching
from ..numerics.problem import split_flat
from .calls import call, grad

HOW_TO = ("gradcheck or gradgradcheck failed while testing batched gradient computation: "
          "{what}. If the function is not meant to be batched, call gradcheck/gradgradcheck "
          "with `{keyword}=False` (an OpInfo test: set `{keyword}=False` on the OpInfo); to "
          "make it batch, see NOTE: [How to write vmap-compatible backward formulas] in "
          "PyTorch's sources.")


def _zeros(x: torch.Tensor, lead: tuple[int, ...] = ()) -> torch.Tensor:
    """A missing gradient as torch's test reads it: zeros of x's (batched) shape."""
    return torch.zeros([], dtype=x.dtype, device=x.device).expand((*lead, *x.shape))


def batched_backward(args: Sequence[Any], output: torch.Tensor, k: int,
                     shared: Any = None) -> None:
    """vmap over backward at two random grad_outputs equals the two backwards, for output k.
    `shared` (lean.py:Passed): two backwards already made on this graph at random cotangents
    (the probe's), batched here in place of two more at torch's draws: the test is the same,
    vmap's against the loop's at any two vectors."""
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def vjp(v: torch.Tensor, batched: bool = False) -> list[torch.Tensor]:
        grads = grad(output, diff, v, retain_graph=True, allow_unused=True,
                      is_grads_batched=batched)
        lead = tuple(v.shape[:1]) if batched else ()
        return [g if g is not None else _zeros(x, lead) for g, x in zip(grads, diff)]

    rows = getattr(shared, "cotangents", None)
    if rows is not None and len(rows) >= 2 and rows.shape[1] == output.numel():
        vs = [row.reshape(output.shape) for row in rows[:2]]
        expected = split_flat(shared.gradients[:2], [x.shape for x in diff])
    else:
        vs = [torch.randn_like(output) for _ in range(2)]
        expected = [torch.stack(parts) for parts in zip(*(vjp(v) for v in vs))]
    try:
        with quiet_batching(legacy=True):
            result = vjp(torch.stack(vs), batched=True)
    except RuntimeError as exc:
        raise GradcheckError(HOW_TO.format(what=f"while computing batched gradients, got: "
                                           f"{exc}", keyword="check_batched_grad")) from exc
    _compare(result, expected, k, "check_batched_grad")


def batched_forward(func: Callable[..., Any], args: tuple[Any, ...], shared: Any = None) -> None:
    """vmap over forward AD at two random tangents of each float input requiring grad equals
    the two forward-mode calls. `shared` (lean_forward.py:ForwardPassed): a jvp already made
    at a random tangent of the only input requiring grad, of func's one output, batched here
    in place of one more at torch's draw (the test is the same at any two tangents)."""
    import torch.autograd.forward_ad as fwAD
    from torch._vmap_internals import _vmap

    for k, x in enumerate(args):
        if not (isinstance(x, torch.Tensor) and x.requires_grad
                and (x.is_floating_point() or x.is_complex())):
            continue

        def jvp(tangent: torch.Tensor, k: int = k, x: torch.Tensor = x) -> tuple[Any, ...]:
            with fwAD.dual_level():
                duals = [fwAD.make_dual(x.detach(), tangent) if j == k else
                         a.detach() if isinstance(a, torch.Tensor) else a
                         for j, a in enumerate(args)]
                out = call(func, *duals)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                return tuple(_tangent(o) for o in outs if o is not None)

        kept = getattr(shared, "tangent", None)
        if kept is not None and kept.shape == x.shape:
            tangents = [kept, torch.randn_like(x)]
            looped = [(shared.jvp,), jvp(tangents[1])]
        else:
            tangents = [torch.randn_like(x) for _ in range(2)]
            looped = [jvp(t) for t in tangents]
        expected = [torch.stack(parts) for parts in zip(*looped)]
        try:
            with quiet_batching(legacy=True):
                result = _vmap(jvp)(torch.stack(tangents))
        except RuntimeError as exc:
            raise GradcheckError(HOW_TO.format(
                what=f"while computing batched gradients with forward-mode AD, got: {exc}",
                keyword="check_batched_forward_grad")) from exc
        _compare(result, expected, k, "check_batched_forward_grad")


def _tangent(o: torch.Tensor) -> torch.Tensor:
    import torch.autograd.forward_ad as fwAD

    primal, tangent = fwAD.unpack_dual(o)
    return tangent if tangent is not None else _zeros(primal)


def _compare(result: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], k: int,
             keyword: str) -> None:
    for j, (res, exp) in enumerate(zip(result, expected)):
        if not (torch.equal(res, exp) or torch.allclose(res, exp)):  # equal: 1/30 the time
            raise GradcheckError(HOW_TO.format(
                what=f"for output {k} and input {j} the batched result differs from the "
                     f"looped one\nGot:\n{res}\nExpected:\n{exp}", keyword=keyword))
