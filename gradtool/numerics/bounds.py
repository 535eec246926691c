"""The one door for bounds: every tolerance a comparison judges by passes through `admit`, which
enforces what no rule that makes or widens a bound may override.

  finite     a NaN or inf bound is never a pass: it is cut to the cap below, and counted;
  capped     a bound never reaches the size of the values compared: at most CAP_REL of the
             larger |value| at the element plus CAP_SCALE of the largest |value| compared, so
             a difference as large as the values (a sign flip, a roll, a dropped term on a
             non-negligible element) is never "within rounding";
  named      each bound carries its origin, so a report can say where a cap cut a bound.

The cap has a floor the caller may give: the tolerance the user (or gradcheck's default) set,
|a - n| <= atol + rtol |n|, which keeps gradcheck's verdict at the tolerance given. A rule that
widens beyond the floor widens at most to the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# A sign flip differs by 2|v|, a dropped term by the term: both beyond 0.5 |v| + 0.1 max |v| at
# every element whose |v| is above a sixth of the largest (and a sign flip at every element
# above 0.07 of the largest). Correct low-precision runs measured in the existing suite stay far
# below (bfloat16's worst rounding bound there: ~3e-2 of the largest |value|).
CAP_REL = 0.5
CAP_SCALE = 0.1


@dataclass
class Admitted:
    """A bound after the door: per-element tolerance, and what the door did to it."""

    tol: torch.Tensor
    origin: str
    capped: torch.Tensor            # per element: the bound was cut to the cap
    nonfinite: int = 0              # elements whose bound was NaN or inf before the cut

    @property
    def n_capped(self) -> int:
        return int(self.capped.sum())

    def words(self) -> str | None:
        """A sentence for the report, or None when the door changed nothing."""
        parts = []
        if self.nonfinite:
            parts.append(f"{self.nonfinite} element(s) had a NaN or inf bound")
        if self.n_capped > self.nonfinite:
            parts.append(f"{self.n_capped - self.nonfinite} element(s) had a bound as large as "
                         "the values compared")
        if not parts:
            return None
        cut = (f"; cut to {CAP_REL:g} |value| + {CAP_SCALE:g} max |value|"
               if self.n_capped else "")
        return f"bound from {self.origin}: " + "; ".join(parts) + cut


def magnitude(*values: torch.Tensor) -> torch.Tensor:
    """Per element: the larger |value| of those compared, non-finite ones counted as 0 (a -inf
    by design carries no size a bound may borrow)."""
    out = None
    for v in values:
        m = v.detach().abs().double()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = m if out is None else torch.maximum(out, m)
    assert out is not None
    return out


def cap(values: tuple[torch.Tensor, ...], scale: float | None = None) -> torch.Tensor:
    """The largest bound the door admits at each element of the values compared."""
    mag = magnitude(*values)
    if scale is None:
        scale = float(mag.max()) if mag.numel() else 0.0
    return CAP_REL * mag + CAP_SCALE * scale


def admit(tol: Any, *values: torch.Tensor, origin: str, scale: float | None = None,
          floor: Any = None) -> Admitted:
    """The bound `tol` (a number or a per-element tensor) for comparing `values` element by
    element, through the door: finite, at most the cap (or `floor`, the user's tolerance, where
    that is larger), named. `scale`: the largest |value| of the whole comparison when `values`
    are a part of it (a chunk of a block)."""
    first = values[0]
    tol = torch.as_tensor(tol, dtype=torch.float64, device=first.device)
    tol = tol.expand(first.shape) if tol.dim() == 0 else tol.double()
    limit = cap(values, scale)
    if floor is not None:
        floor = torch.as_tensor(floor, dtype=torch.float64, device=first.device)
        limit = torch.maximum(limit, torch.where(torch.isfinite(floor), floor,
                                                 torch.zeros_like(floor)))
    bad = ~torch.isfinite(tol)
    capped = bad | (tol > limit)
    return Admitted(torch.where(capped, limit, tol), origin, capped, int(bad.sum()))


def finite_max(*tensors: Any) -> float:
    """The largest finite |value| over tensors: what a bound made from sizes may read (a -inf
    mask or padding value would make it inf, and every bound from it inf)."""
    best = 0.0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel() and (t.is_floating_point() or t.is_complex()):
            m = t.detach().abs()
            m = m[torch.isfinite(m)]
            if m.numel():
                best = max(best, float(m.max()))
    return best
