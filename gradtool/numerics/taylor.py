"""Taylor-remainder test: |L(x+hv) - L(x) - h<grad L, v>| must fall as h^2, with no step to tune."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .problem import Problem, flat_cat
from .rounding import dtype_name, unit_roundoff

STEPS = tuple(2.0 ** -k for k in range(14))
# A remainder is resolved when it stands this far above the rounding noise of L.
RESOLVED = 20.0


@dataclass
class TaylorVerdict:
    """The remainders over h and what their slope says."""

    outcome: str                 # "passed", "failed" or "inconclusive"
    remainders: list[tuple[float, float]]   # (h, remainder) at the resolved steps
    noise: float
    ratios: list[float]
    slope_error: float | None = None   # <grad, v> from backward minus its finite-difference limit

    def describe(self) -> str:
        shown = ", ".join(f"h={h:.3g}: {r:.3g}" for h, r in self.remainders[-4:]) or "none"
        if not self.ratios:  # fewer than two resolved steps: nothing to divide
            return (f"Taylor remainders above the rounding noise {self.noise:.2g}: {shown}; "
                    "too few stand above it to read how they fall with h (fewer than two "
                    "steps leave a remainder above the noise: forward too flat here, or too "
                    "coarse a dtype)")
        return (f"Taylor remainders above the rounding noise {self.noise:.2g}: {shown}; "
                f"halving h divides them by {', '.join(f'{q:.2g}' for q in self.ratios[-3:])} "
                "(4 = second order: backward right; 2 = first order: backward wrong)")


def taylor_test(problem: Problem, seed: int) -> TaylorVerdict:
    """L = <g, f(x)> with a random g, along a random direction v, in the target's own dtype."""
    generator = torch.Generator().manual_seed(seed)
    leaves, outs = problem.graph()
    weights = [_draw(o, generator) for o in outs]
    grads = problem.vjp(leaves, outs, weights)
    xs = [leaf.detach() for leaf in leaves]
    scale = [float(x.double().abs().mean()) or 1.0 for x in xs]
    direction = [_draw(x, generator).double() * s for x, s in zip(xs, scale)]
    base = _value(problem, xs, weights)
    noise = RESOLVED * sum(unit_roundoff(dtype_name(o.dtype))
                           * float((w.double() * o.detach().double()).abs().sum())
                           for o, w in zip(outs, weights))
    points = []
    for h in STEPS:
        moved = [(x.double() + h * v).to(x.dtype) for x, v in zip(xs, direction)]
        # The step actually taken, after rounding x + hv to the dtype: exact in float64.
        taken = flat_cat([m.double() - x.double() for m, x in zip(moved, xs)])
        if not taken.abs().max() > 0:
            break
        linear = float(flat_cat([g.double() for g in grads]) @ taken)
        points.append((h, abs(_value(problem, moved, weights) - base - linear)))
    return _judge(points, noise)


def _draw(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # drawn on the CPU from a CPU generator: the same draws on every device
    return torch.randn(t.shape, generator=generator, dtype=torch.float64, device="cpu").to(t)


def _value(problem: Problem, xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]) -> float:
    outs = problem.outputs(xs)
    return float(sum((w.double() * o.double()).sum() for o, w in zip(outs, weights)))


def _judge(points: list[tuple[float, float]], noise: float) -> TaylorVerdict:
    resolved = []
    for h, r in points:  # from the largest h down, until rounding noise takes over
        if not r > noise:
            break
        resolved.append((h, r))
    ratios = [r1 / r2 for (_, r1), (_, r2) in zip(resolved, resolved[1:]) if r2 > 0]
    if len(ratios) < 2:
        return TaylorVerdict("inconclusive", resolved, noise, ratios)
    last = ratios[-2:]
    if all(q > 3.0 for q in last):
        return TaylorVerdict("passed", resolved, noise, ratios)
    if all(1.5 < q < 3.0 for q in last):
        h, r = resolved[-1]
        return TaylorVerdict("failed", resolved, noise, ratios, slope_error=r / h)
    return TaylorVerdict("inconclusive", resolved, noise, ratios)

