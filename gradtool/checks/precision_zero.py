"""Low precision: gradients the float64 reference finds zero, judged as rounding noise; and
what a tensor beyond its rounding bounds is instead (a common scale, a flipped sign)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..numerics.rounding import FOLLOW_SCALE, UNIT_ROUNDOFF, accumulation_roundoff, scale_error

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


# A fitted scale error counts when it is this many standard errors out, and larger than this
# many unit roundoffs (a biased rounding mode could shift every element by about u).
SCALE_SIGNIFICANCE = 6.0
SCALE_BIAS = 4.0


def scale_line(kind: str, name: str, low: torch.Tensor, exact: torch.Tensor,
               sigma: torch.Tensor, dtype: str) -> str | None:
    """A scale error over the whole tensor: significant, and beyond what rounding bias can do."""
    s, error = scale_error(low, exact, sigma)
    if not (abs(s) > SCALE_SIGNIFICANCE * error and abs(s) > SCALE_BIAS * UNIT_ROUNDOFF[dtype]):
        return None
    what = f"output {name!r}" if kind == "forward" else f"gradient of {name!r}"
    return (f"{what} is {1 + s:.4g} x the float64 reference, fitted over the {low.numel()} "
            f"elements within their bounds (± {error:.1g}); rounding cannot bias a result by "
            "more than "
            f"{SCALE_BIAS:g}u = {SCALE_BIAS * UNIT_ROUNDOFF[dtype]:.2g}")


def sign_line(name: str, low: torch.Tensor, exact: torch.Tensor, tol: torch.Tensor,
              bad: torch.Tensor) -> str | None:
    """A gradient that is the negated reference, within its bounds, at every element beyond
    them, and those most of its elements the reference finds nonzero: a sign flip, which the
    scale fit (over the elements within their bounds) never sees."""
    low, exact = low.double(), exact.double()
    nonzero = exact.abs() > tol
    flipped = bad & nonzero & ((low + exact).abs() <= tol)
    n, m = int(flipped.sum()), int(nonzero.sum())
    if not n or n != int(bad.sum()) or 2 * n < m:
        return None
    return (f"gradient of {name!r} is -1 x the float64 reference at every element beyond "
            f"its bound ({n} of the {m} the reference finds nonzero): sign flipped")
