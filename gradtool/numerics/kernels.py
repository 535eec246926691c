"""An op's own kernel error in a low dtype, measured against float64 on the same operands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map


@dataclass
class Measured:
    """An op's own kernel error per element: |its low-dtype result - float64's| on one input."""

    error: torch.Tensor


def kernel_error(func: Any, args: Any, kwargs: Any, out: Any, low: torch.dtype) -> Any:
    """Per result: the op's low-dtype kernel against float64 on the same (rounded) operands.

    u|result| models a correctly rounded op; a real kernel is not always one: vectorised
    erf/exp/tanh err by several ulps, and a fused kernel (gelu_backward, layer_norm) rounds
    intermediates far larger than its result, which cancel (GELU's derivative near -0.75)."""
    if any(isinstance(t, torch.Tensor) and t._is_zerotensor()
           for t in tree_flatten((args, kwargs, out))[0]):
        return None  # torch's storage-less zeros: exact, and measuring them crashes torch
    found = _kernel_runs(func, args, kwargs, low)
    if found is None:  # no kernel in that dtype: the result-only model
        return None
    lows, exacts = found
    if isinstance(out, torch.Tensor):
        return _error(lows, exacts)
    if isinstance(out, (tuple, list)) and isinstance(lows, (tuple, list)):
        return [_error(lo, ex) for lo, ex in zip(lows, exacts)]
    return None


# Per (op, low dtype): which operand must stay float32 for the op to run in that dtype (-1:
# none, None: the op has no such kernel at all), learnt on its first call.
_KEPT: dict[tuple[Any, torch.dtype], int | None] = {}
MAX_KEPT = 8  # operands tried one by one


def _kernel_runs(func: Any, args: Any, kwargs: Any, low: torch.dtype) -> tuple[Any, Any] | None:
    """(the op's result in the low dtype, float64's on the same rounded operands), or None.

    An op that refuses one operand in the low dtype keeps that one in float32: fused
    attention's backward takes its logsumexp in float32, the kernel libraries' convention for
    statistics (so the half-precision run has it so too)."""
    tensors = [x for x in tree_flatten((args, kwargs))[0]
               if isinstance(x, torch.Tensor) and x.is_floating_point()]
    known = _KEPT.get((func, low), -2)
    tries = [known] if known != -2 else \
        [-1, *(range(min(len(tensors), MAX_KEPT)) if low != torch.float32 else ())]
    for kept in tries:
        if kept is None:
            return None
        keep = tensors[kept] if 0 <= kept < len(tensors) else None

        def rounded(x: Any, keep: Any = keep) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            return x.to(_as_kind(torch.float32 if x is keep else low, x))
        try:
            with _same_draws(func, args) as again:
                lows = on_values(func, args, kwargs, rounded)
                again()
                exacts = on_values(func, args, kwargs, lambda x: rounded(x).to(
                    _as_kind(torch.float64, x)) if isinstance(x, torch.Tensor) else x)
        except Exception:  # noqa: BLE001 - no kernel for these dtypes: the next choice
            continue
        _KEPT[(func, low)] = kept
        return lows, exacts
    _KEPT[(func, low)] = None
    return None


# A real dtype's complex twin: a complex operand (an FFT's backward's grad) is rounded to it.
_COMPLEX = {torch.float64: torch.complex128, torch.float32: torch.complex64,
            torch.float16: torch.complex32}


def _as_kind(dtype: torch.dtype, x: torch.Tensor) -> torch.dtype:
    """`dtype` for a real tensor, its complex twin for a complex one (no twin: bfloat16's,
    then an error the caller takes for no kernel in that dtype)."""
    if not x.is_complex():
        return dtype
    if dtype not in _COMPLEX:
        raise TypeError(f"no complex dtype for {dtype}")
    return _COMPLEX[dtype]


@contextmanager
def _same_draws(func: Any, args: Any) -> Iterator[Callable[[], None]]:
    """For an op that may draw random numbers (fused attention, with its dropout): both
    measuring calls draw the same ones, and the generator is left as the real call left it.
    Yields what rewinds the generator between them."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        yield lambda: None
        return
    tensors = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        state = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state(device) if devices else None

        def rewind() -> None:
            torch.set_rng_state(state)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, device)
        yield rewind


def _error(low: Any, exact: Any) -> Any:
    """|low - exact| per element: for a complex result (an FFT's), the modulus of the
    difference, a real tensor of the result's part dtype."""
    if not (isinstance(low, torch.Tensor) and isinstance(exact, torch.Tensor)
            and (low.is_floating_point() or low.is_complex())
            and low.is_complex() == exact.is_complex()
            and (exact.is_floating_point() or exact.is_complex())):
        return None
    diff = (low.to(exact.dtype) - exact).abs()
    # An overflow to inf in the low dtype is the target's, for the comparison to report.
    return Measured(torch.where(diff.isfinite(), diff, torch.zeros_like(diff)).to(
        exact.real.dtype if exact.is_complex() else exact.dtype))


def on_values(func: Any, args: Any, kwargs: Any, transform: Callable[[Any], Any]) -> Any:
    """The op again, every floating argument (tensor or number) transformed."""
    def apply(x: Any) -> Any:
        if isinstance(x, float) or (isinstance(x, torch.Tensor) and (
                x.is_floating_point() or x.is_complex())):
            return transform(x)
        return x
    return func(*tree_map(apply, args), **tree_map(apply, kwargs))
