"""Low precision: gradients the float64 reference finds zero, judged as rounding noise."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..numerics.rounding import FOLLOW_SCALE, UNIT_ROUNDOFF, accumulation_roundoff

# A gradient the float64 reference finds zero at the low dtype's resolution (a convolution's
# bias before batch norm, anything under a constant output) is, in the low dtype, rounding
# noise of the size of the terms its sums cancel: the backward's largest gradient shows that
# size. Its elements may be this many units of it (u + sqrt(k) u_acc) off, and no scale is
# fitted to it (a ratio to zero means nothing).
ZERO_UNITS = 16.0
# Where the terms such a gradient cancels are larger than every gradient (an output constant
# over its input: a normalisation's 1/std ~ 316 scales them inside backward), only backward's
# own rounding, measured, shows their size: its elements may be this many times the largest
# B(s·g) − s·B(g) (SCALE's s; two roundings apart, a 2x margin).
ZERO_MEASURED = 4.0
SCALE = FOLLOW_SCALE  # numerics/rounding.py: what backward must follow but for rounding


def zero_noise(labels: Sequence[tuple[str, str, tuple[int, ...]]],
               exact: Sequence[torch.Tensor], grad_outputs: Sequence[Sequence[torch.Tensor]],
               dtype: str) -> float:
    """The rounding noise a gradient the float64 reference finds zero may carry in the low
    dtype: ZERO_UNITS units (u + sqrt(k) u_acc) of the backward's largest gradient."""
    largest = max((float(ex.abs().max()) for (kind, _, _), ex in zip(labels, exact)
                   if kind != "forward" and ex.numel()), default=0.0)
    summed = max((sum(g.numel() for g in draw) for draw in grad_outputs), default=1)
    units = UNIT_ROUNDOFF[dtype] + summed ** 0.5 * accumulation_roundoff(dtype)
    return ZERO_UNITS * units * largest


def zero_tensors(labels: Sequence[tuple[str, str, tuple[int, ...]]],
                 exact: Sequence[torch.Tensor], noise: float) -> list[bool]:
    """Per compared tensor: a gradient the reference finds zero at the low dtype's resolution
    (within one unit of that noise)."""
    return [kind != "forward" and ex.numel() > 0 and float(ex.abs().max()) <= noise / ZERO_UNITS
            for (kind, _, _), ex in zip(labels, exact)]


def measured_rounding(zero: Sequence[bool], low: Sequence[torch.Tensor],
                      scaled: Sequence[torch.Tensor]) -> list[float]:
    """Per compared tensor: for a zero one, the largest B(s·g) − s·B(g) of the low-precision
    backward (s = SCALE, which it must follow exactly but for rounding): the rounding of the
    terms it cancels, wherever they hide (a normalisation's 1/std); 0 elsewhere."""
    found = []
    for is_zero, a, b in zip(zero, low, scaled):
        d = (b.double() - SCALE * a.double()).abs() if is_zero and a.shape == b.shape else None
        d = d[torch.isfinite(d)] if d is not None else None
        found.append(float(d.max()) if d is not None and d.numel() else 0.0)
    return found
