"""The measured tolerance: a tight first bound, then each element beyond it judged by its own
finite-difference error, measured at steps h, 2h and 3h."""

# Central differences at h = 1e-6 on a smooth float64 function are good to ~1e-9 relative, so
# gradcheck's rtol 1e-3 hides real mistakes. The sweep compares every element with a tight
# first bound (rounding of f at the largest |f|, of the step at the largest |x|, and 1e-7
# relative for truncation); a passing run stops there, at today's cost. Only the columns with
# an element beyond it are evaluated again, at x ± 2h and x ± 3h (4 forwards a column):
#   truncation  |D_h - D_2h| / 3 (Richardson), scaled by m² at step m h;
#   noise       sigma of f from three fourth differences over the 7 points (pure rounding or
#               solver noise: h⁴ f'''' is ~1e-24), pooled over the row's measured columns, /(√2 m h);
#   rounding    u |f| / (m h) and u |x| |D| / (m h) (the step itself is rounded).
# An element stands only when it is beyond K x that estimate + a floor at all three steps: the
# three estimates carry independent noise, so a chance coincidence must happen three times. An
# element beyond gradcheck's tolerance always stands for the kink test, as before, so the
# measured tolerance is never more lenient than the fixed one, and kinks stay inconclusive.

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .bounds import finite_max
from .compare import BlockTally
from .problem import Problem
from .stencil_noise import Pooled, fourth_differences
from .steps import FINITE_MACHINE, outputs_of

K = 8.0                # verdict: beyond K x the estimated finite-difference error
CANCELLED = 1024.0     # within this many units of the largest |J|: a cancelled sum's rounding
FIRST_RTOL = 1e-7      # first bound's truncation allowance (smooth float64: ~1e-12)
ROUND_C = 32.0         # first bound's rounding allowance: ROUND_C u max|f| / h
FLOOR_REL = 1e-9       # the verdict's floor, relative to |D|
BATCH = 64             # columns measured per round, worst first
MAX_COLUMNS = 4096     # beyond this, unsettled flags fall back on the fixed tolerance
NOISY = 1e-6           # a measured relative tolerance above this is reported as a limit
STEPS = (-3, -2, -1, 1, 2, 3)


def first_bound(values: Sequence[torch.Tensor], f0: torch.Tensor, h: float) -> tuple[float, float]:
    """(atol, rtol) of the sweep's tight first comparison, from the largest |f| and |x|: the
    loosest over every input (a scalar for a caller without columns); the sweep compares each
    column by its own rtol (`column_rtol`)."""
    u = FINITE_MACHINE.get(f0.dtype, 2.2e-16)
    # the finite values only: a -inf mask or padding in x made rtol inf, and every gradient pass
    fmax, xmax = finite_max(f0), finite_max(*values)
    return ROUND_C * u * fmax / h, FIRST_RTOL + 8 * u * xmax / h


def column_rtol(value: torch.Tensor, f0: torch.Tensor, h: float) -> torch.Tensor:
    """Per element of one input (flat): the first bound's rtol for the column perturbing it.
    The step x_j + h is rounded at |x_j|, so the rounding term is that element's size, not the
    largest |x| over every input: a -1e9 additive mask (rtol 1.8 read globally) loosened the
    bound of the scores beside it until a gradient 50 % wrong passed. Non-finite elements read
    0 (their columns' differences are not finite: judged as such, never passed by a bound)."""
    u = FINITE_MACHINE.get(f0.dtype, 2.2e-16)
    x = value.detach().reshape(-1).abs().double()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return FIRST_RTOL + 8 * u * x / h


@dataclass
class Measurement:
    """What the second step found, for the report."""

    first_atol: float
    first_rtol: float
    measured: int = 0          # elements judged by their measured error
    columns: int = 0           # columns evaluated at 2h and 3h
    far: int = 0               # columns evaluated at 10h only (a sample, the kink test's)
    max_tolerance: float = 0.0  # the largest K x error + floor over them
    max_relative: float = 0.0   # the typical tolerance relative to |D| (where |D| is large)
    unmeasured: int = 0        # beyond the first bound, not judged (too many columns)
    fixed_settled: bool = False  # some element is beyond the fixed tolerance: today's verdict
    fixed: tuple[float, float] = (0.0, 0.0)
    measured_only: int = 0     # standing elements within gradcheck's fixed tolerance
    sampled: int = 0           # judged by the measured sample's tolerance (columns not re-run)
    sample_tolerance: tuple[float, float] = (0.0, 0.0)   # its (absolute, relative) parts
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        first = f"|a - n| <= {self.first_atol:.2g} + {self.first_rtol:.2g} |n|"
        if self.fixed_settled and not self.measured:
            return ("tolerance: these elements are beyond gradcheck's fixed tolerance too "
                    f"(atol {self.fixed[0]:g}, rtol {self.fixed[1]:g}), no need to measure")
        if not self.measured:
            return (f"tolerance measured: every element within the first bound {first} "
                    "(finite-difference rounding and truncation), so no second step")
        also = (", the others beyond gradcheck's fixed tolerance too" if self.fixed_settled
                else "")
        steps = " and ".join(
            words for words, count in (("at steps h, 2h, 3h", self.columns),
                                       (f"between steps h and 10h in {self.far} column(s)",
                                        self.far)) if count)
        return (f"tolerance measured: finite-difference error <= {self.max_tolerance:.2g} here "
                f"({K:g} x the error measured {steps}, at {self.measured} element(s) "
                f"beyond the first bound {first}{also})")

    def limit(self) -> str | None:
        if self.max_relative <= NOISY:
            return None
        return ("finite differences are noisy here (an iterative solver's tolerance?): errors "
                + (f"below {self.max_relative:.2g} relative" if self.max_relative < 1 else
                   "as large as the values, at some elements,") + " cannot be seen here")


def remeasure(problem: Problem, values: Sequence[torch.Tensor], tallies: list[list[BlockTally]],
              f0: torch.Tensor, h: float, fixed: tuple[float, float],
              kept: Sequence[dict[int, tuple[torch.Tensor, torch.Tensor]]],
              bounds: Sequence[int], far: Sequence[dict] | None = None) -> Measurement | None:
    """Judge every element beyond the first bound by its measured error; the tallies are
    rewritten with the elements that stand. None when some flags cannot be measured (no exact
    value, or too many columns) and none stands: the caller falls back on the fixed tolerance."""
    first = tallies[0][0]
    found = Measurement(first.atol, first.rtol, fixed=fixed)
    standing = False
    complete = True
    # rounding of backward where a gradient cancels: units of the largest Jacobian entry
    cancelled = CANCELLED * FINITE_MACHINE.get(f0.dtype, 2.2e-16) * max(
        t.scale for row in tallies for t in row)
    for i, row in enumerate(tallies):
        flags = _flags(row, bounds, f0.device)
        if flags is None:
            complete = False
            continue
        # mismatches the sweep counted without an exact value (coloured flags past its budget)
        unvalued = [t.mismatched - int(((flags[0] >= bounds[o]) & (flags[0] < bounds[o + 1]))
                                       .sum()) for o, t in enumerate(row)]
        noise = (flags[2] - flags[3]).abs() <= cancelled
        flags = tuple(t[~noise] for t in flags)
        if bool(noise.any()) and not len(flags[0]):  # every flag noise: none stands
            for o, tally in enumerate(row):
                tally.mismatched, tally.worst, tally.max_rel = unvalued[o], [], 0.0
                tally.standing = (flags[0], flags[1])
        if not len(flags[0]):
            complete &= not any(unvalued)
            continue
        result = _measure_input(problem, values, i, flags, f0, h, fixed, kept[i], found,
                                bounds, far[i] if far is not None else {})
        standing |= result.any_standing
        complete &= result.complete and not any(unvalued)
        _rewrite(row, flags, result, bounds, found, unvalued)
    if not complete and not standing:
        return None
    return found


def _flags(row: list[BlockTally], bounds: Sequence[int], device: torch.device
           ) -> tuple[torch.Tensor, ...] | None:
    """(flat rows, cols, analytical, numerical) of one input's flagged elements over its outputs,
    deduplicated; None when some mismatch has no recorded value."""
    parts = []
    for o, tally in enumerate(row):
        if tally.flagged is None:
            return None
        for r, c, a, n in tally.flagged:
            parts.append((r + bounds[o], c, a, n))
    if not parts:
        return ((torch.zeros(0, dtype=torch.long, device=device),) * 2
                + (torch.zeros(0, device=device),) * 2)
    r, c, a, n = (torch.cat(p) for p in zip(*parts))
    key = r * (int(c.max()) + 1) + c
    _, first = _unique_first(key)
    return r[first], c[first], a[first], n[first]


def _unique_first(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique keys and the position of the LAST occurrence of each (the latest comparison)."""
    uniq, inverse = torch.unique(key, return_inverse=True)
    last = torch.zeros(len(uniq), dtype=torch.long, device=key.device)
    last.scatter_reduce_(0, inverse, torch.arange(len(key), device=key.device), reduce="amax",
                         include_self=False)
    return uniq, last


@dataclass
class _Result:
    stands: torch.Tensor      # per flagged element: beyond its measured tolerance (or fixed)
    measured: torch.Tensor    # per flagged element: measured (its column was evaluated)
    tolerance: torch.Tensor   # per flagged element: the tolerance it was judged by (inf: none)
    sampled: torch.Tensor     # per flagged element: judged by the sampled column's model
    model: tuple[float, float, float] | None = None  # _judge_far's, for the other columns
    any_standing: bool = False
    complete: bool = True


def _measure_input(problem: Problem, values: Sequence[torch.Tensor], i: int,
                   flags: tuple[torch.Tensor, ...], f0: torch.Tensor, h: float,
                   fixed: tuple[float, float], kept: dict, found: Measurement,
                   bounds: Sequence[int], far: dict) -> _Result:
    """Every flagged element judged by one tolerance: an element beyond gradcheck's fixed
    tolerance stands as it is (the measured one is never more lenient), so only the columns
    holding a flagged element within it are measured, worst first, BATCH at a time."""
    rows, cols, a, n = flags
    diff = (a - n).abs().nan_to_num(nan=math.inf)
    fixed_tol = fixed[0] + fixed[1] * n.abs()
    beyond = diff > fixed_tol
    found.fixed_settled |= bool(beyond.any())
    result = _Result(beyond.clone(), torch.zeros_like(beyond),
                     torch.where(beyond, fixed_tol, torch.full_like(fixed_tol, math.inf)),
                     torch.zeros_like(beyond), any_standing=bool(beyond.any()))
    excess = diff - (found.first_atol + found.first_rtol * n.abs())
    order = torch.argsort(torch.where(beyond, -math.inf, excess), descending=True)
    columns = list(dict.fromkeys(cols[order[~beyond[order]]].tolist()))[:MAX_COLUMNS]
    pooled, start = None, 0
    while start < len(columns):
        # Until one element stands the verdict depends on every column (BATCH at a time, as
        # a passing run measures them); after, the count does: all of them where evaluations
        # are batched, else one column at ±10h whose tolerance judges the rest (_by_sample),
        # evaluated where the kink test will look anyway.
        if result.any_standing and problem.cache.vmap_ok is not True:
            if not _sample_far(problem, values, i, flags, diff, beyond, f0, h, kept, far,
                               result, bounds, found):
                _measure(problem, values, i, flags, columns[start:start + 1], h, kept, f0,
                         fixed, beyond, result, found, bounds)
            break
        batch = columns[start:start + BATCH]
        start += len(batch)
        pooled = _measure(problem, values, i, flags, batch, h, kept, f0, fixed, beyond, result,
                          found, bounds, pooled)
    if start < len(columns) and result.any_standing:
        _by_sample(result, flags, diff, beyond, values, i, f0, h, found)
    result.complete = bool((result.measured | beyond | result.sampled).all())
    _note_measured(result, rows, n, bounds, found)
    return result


FAR = 10   # the kink test's step multiple (numerics/jacobian.py:_estimates reuses these)


def _measure(problem: Problem, values: Sequence[torch.Tensor], i: int,
             flags: tuple[torch.Tensor, ...], batch: list[int], h: float, kept: dict,
             f0: torch.Tensor, fixed: tuple[float, float], beyond: torch.Tensor,
             result: _Result, found: Measurement, bounds: Sequence[int],
             pooled: Pooled | None = None) -> Pooled:
    """The flagged elements of these columns judged by their error measured at h, 2h, 3h
    (noise pooled with the columns measured before); returns the pooled noise."""
    rows, cols, a, _ = flags
    points = _evaluate(problem, values, i, batch, h, kept, f0)       # (7, len(batch), n_out)
    sigma2 = fourth_differences(points)                          # (len(batch), n_out)
    pooled = (pooled or Pooled.empty(f0, len(bounds) - 1)).add(points, sigma2, bounds)
    where = {c: k for k, c in enumerate(batch)}
    mine = torch.tensor([where.get(c, -1) for c in cols.tolist()], device=cols.device)
    pick = mine >= 0
    k, r = mine[pick], rows[pick]
    sigma = torch.maximum(sigma2[k, r], pooled.row_sum[r] / pooled.columns).sqrt()
    sigma = pooled.cancelled(points[:, k, r], sigma, r, bounds, K)
    x = values[i].detach().reshape(-1)[cols[pick]].abs().double()
    stands, tol = _judge(points[:, k, r], f0[r].abs().double(), sigma, x, a[pick], h, fixed)
    result.stands[pick], result.tolerance[pick] = stands, tol
    result.measured[pick] = True
    found.columns += len(batch)
    found.measured_only += int((stands & ~beyond[pick]).sum())
    result.any_standing |= bool(stands.any())
    return pooled


def _sample_far(problem: Problem, values: Sequence[torch.Tensor], i: int,
                flags: tuple[torch.Tensor, ...], diff: torch.Tensor, beyond: torch.Tensor,
                f0: torch.Tensor, h: float, kept: dict, far: dict, result: _Result,
                bounds: Sequence[int], found: Measurement) -> bool:
    """Once the verdict stands on a Function evaluated call by call: f(x ± 10h e_c) at the
    column the kink test will re-estimate first (the largest error of the first failing
    output), shared with it through `far`; each flagged element of that column judged by the
    error measured between steps h and 10h, and by rounding."""
    rows, cols, a, n = flags
    standing = result.stands
    first = int(rows[standing].min())
    o = max(k for k in range(len(bounds) - 1) if bounds[k] <= first)
    mine = standing & (rows >= bounds[o]) & (rows < bounds[o + 1])
    col = int(cols[mine][torch.argmax(torch.where(mine, diff, -math.inf)[mine])])
    if col not in kept or col in far:
        return False  # no exact f(x ± h) there: the caller measures a column at 2h, 3h
    base = values[i].detach().reshape(-1)
    batch = base.repeat(2, 1)
    batch[0, col] += FAR * h
    batch[1, col] -= FAR * h
    out = outputs_of(problem, values, i, batch.view(-1, *values[i].shape))
    far[col] = (out[0], out[1])
    found.far += 1
    p = torch.stack([out[1], kept[col][1], f0, kept[col][0], out[0]]).double()  # -10h..10h
    pick = cols == col
    r = rows[pick]
    stands, tol, result.model = _judge_far(p[:, r], f0[r].abs().double(),
                                           float(base[col].abs()), a[pick], h)
    result.stands[pick] |= stands
    result.tolerance[pick] = tol
    result.measured[pick] = True
    return True


def _judge_far(p: torch.Tensor, f_abs: torch.Tensor, x_abs: float, a: torch.Tensor,
               h: float) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float, float]]:
    """Per element (p: (5, E) values at -10h, -h, 0, h, 10h): beyond K x the error measured
    between steps h and 10h (truncation by Richardson, noise by the fourth divided difference
    over the five points, pooled over the column), and its tolerance; with the model that
    judges other columns: (noise, truncation where |D| is small, truncation relative to |D|)."""
    t = torch.tensor([-FAR, -1.0, 0.0, 1.0, FAR], dtype=torch.float64, device=p.device)
    w = torch.stack([1 / torch.prod(t[k] - t[torch.arange(5, device=p.device) != k])
                     for k in range(5)])
    sigma = (torch.tensordot(w, p, dims=1).abs() / w.norm()).nan_to_num(nan=math.inf)
    sigma = torch.maximum(sigma, sigma.square().mean().sqrt())
    d1 = (p[3] - p[1]) / (2 * h)
    trunc = ((p[4] - p[0]) / (2 * FAR * h) - d1).abs() / (FAR * FAR - 1)
    noise = sigma / (math.sqrt(2) * h)
    error = trunc + noise + _rounding(f_abs, x_abs, d1, h)
    tol = K * error + FLOOR_REL * d1.abs()
    d = d1.abs()
    big = d >= 0.1 * float(d.max()) if d.numel() else d > 0
    big &= d > 0
    model = (float(noise.max()) if noise.numel() else 0.0,
             float(trunc[~big].max()) if bool((~big).any()) else 0.0,
             float((trunc[big] / d[big]).max()) if bool(big.any()) else 0.0)
    return ~((a - d1).abs() <= tol), tol, model


def _rounding(f_abs: torch.Tensor, x_abs: Any, d: torch.Tensor, h: float) -> torch.Tensor:
    """Rounding of a central difference at step h: of f, and of the step itself."""
    return FINITE_MACHINE[torch.float64] * (2 * f_abs + 2 * x_abs * d.abs()) / h


def _by_sample(result: _Result, flags: tuple[torch.Tensor, ...], diff: torch.Tensor,
               beyond: torch.Tensor, values: Sequence[torch.Tensor], i: int, f0: torch.Tensor,
               h: float, found: Measurement) -> None:
    """The flags of unmeasured columns, once the verdict stands, judged by the measured
    column's error model: each element's own rounding, plus the column's noise and truncation
    at their largest (absolute where |D| is small, relative to |D| where large); without one,
    an affine bound over the measured tolerances. An element beyond gradcheck's tolerance
    stands whatever this says."""
    rows, cols, _, n = flags
    rest = ~(result.measured | beyond)
    if result.model is not None:
        noise, trunc_abs, trunc_rel = result.model
        x = values[i].detach().reshape(-1)[cols[rest]].abs().double()
        d = n[rest].abs()
        block = (K * (_rounding(f0[rows[rest]].abs().double(), x, d, h) + noise + trunc_abs
                      + trunc_rel * d) + FLOOR_REL * d)
        floor, rel = K * (noise + trunc_abs), K * trunc_rel + FLOOR_REL
    else:
        tol, d = result.tolerance[result.measured], n[result.measured].abs()
        ok = torch.isfinite(tol)
        if not bool(ok.any()):
            return  # nothing finite measured: those flags stay unjudged (counted, and said so)
        big = ok & (d >= 0.1 * float(d[ok].max())) & (d > 0)
        rel = float((tol[big] / d[big]).max()) if bool(big.any()) else 0.0
        floor = float((tol[ok] - rel * d[ok]).clamp_min(0.0).max())  # covers each measured one
        block = floor + rel * n[rest].abs()
    result.stands[rest] = diff[rest] > block
    result.tolerance[rest] = block
    result.sampled[rest] = True
    found.sampled += int(rest.sum())
    found.sample_tolerance = (floor, rel)


def _note_measured(result: _Result, rows: torch.Tensor, n: torch.Tensor,
                   bounds: Sequence[int], found: Measurement) -> None:
    """What the measured columns showed: how many, the largest tolerance, the typical one."""
    measured_tol = result.tolerance[result.measured]
    finite = measured_tol[torch.isfinite(measured_tol)]
    found.measured += int(result.measured.sum())
    if not finite.numel():
        return
    found.max_tolerance = max(found.max_tolerance, float(finite.max()))
    if result.model is not None:
        return  # one column at 10h: no typical relative error (the verdict stood before it)
    # per output: the typical relative tolerance among its larger derivatives
    ok = result.measured & torch.isfinite(result.tolerance)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mine = ok & (rows >= lo) & (rows < hi)
        d = n[mine].abs()
        if not d.numel() or not float(d.max()) > 0:
            continue
        big = d >= 0.1 * float(d.max())
        typical = float((result.tolerance[mine][big] / d[big]).median())
        found.max_relative = max(found.max_relative, typical)


def _evaluate(problem: Problem, values: Sequence[torch.Tensor], i: int, cols: list[int],
              h: float, kept: dict, f0: torch.Tensor) -> torch.Tensor:
    """f at x + m h e_c for m in -3..3 (f(x) and kept ±h reused): (7, len(cols), n_out)."""
    base = values[i].detach().reshape(-1)
    need = [m for m in STEPS if abs(m) > 1 or any(c not in kept for c in cols)]
    d = torch.zeros(len(need) * len(cols), base.numel(), dtype=base.dtype, device=base.device)
    index = torch.tensor(cols, device=base.device)
    for j, m in enumerate(need):
        d[torch.arange(len(cols), device=base.device) + j * len(cols), index] = m * h
    out = outputs_of(problem, values, i, (base + d).view(-1, *values[i].shape))
    out = out.view(len(need), len(cols), -1).double()
    at = {m: out[j] for j, m in enumerate(need)}
    if 1 not in at:
        at[1] = torch.stack([kept[c][0] for c in cols]).double()
        at[-1] = torch.stack([kept[c][1] for c in cols]).double()
    for k, c in enumerate(cols):  # the failing path (dense blocks, kink test) reuses ±h
        kept.setdefault(c, (at[1][k].to(base.dtype), at[-1][k].to(base.dtype)))
    centre = f0.double().expand_as(at[1])
    return torch.stack([at[-3], at[-2], at[-1], centre, at[1], at[2], at[3]])


def _judge(p: torch.Tensor, f_abs: torch.Tensor, sigma: torch.Tensor, x_abs: torch.Tensor,
           a: torch.Tensor, h: float, fixed: tuple[float, float]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element (p: (7, E) values at -3h..3h): whether it stands, and its tolerance at h.
    Where the measurement is not finite (a step left the domain), the fixed tolerance judges."""
    d = {m: (p[3 + m] - p[3 - m]) / (2 * m * h) for m in (1, 2, 3)}
    trunc = (d[1] - d[2]).abs() / 3
    stands = torch.ones_like(a, dtype=torch.bool)
    tol_h = None
    for m, dm in d.items():
        error = m * m * trunc + sigma / (math.sqrt(2) * m * h) + _rounding(f_abs, x_abs, dm,
                                                                           m * h)
        tol = K * error + FLOOR_REL * dm.abs()
        tol_h = tol if tol_h is None else tol_h
        stands &= ~((a - dm).abs() <= tol)
    unmeasurable = ~torch.isfinite(tol_h)
    diff = (a - d[1]).abs()
    beyond_fixed = ~(diff <= fixed[0] + fixed[1] * d[1].abs())
    stands = torch.where(unmeasurable, beyond_fixed, stands | beyond_fixed)
    return stands, torch.where(unmeasurable, torch.full_like(tol_h, math.inf), tol_h)


def _rewrite(row: list[BlockTally], flags: tuple[torch.Tensor, ...], result: _Result,
             bounds: Sequence[int], found: Measurement, unvalued: Sequence[int]) -> None:
    """Each output's tally keeps the standing elements (worst by excess over their measured
    tolerance) and the flags left unjudged (past MAX_COLUMNS, beside a standing element)
    counted as mismatches, conservatively."""
    rows, cols, a, n = flags
    unjudged = ~(result.measured | result.stands | result.sampled)
    found.unmeasured += int(unjudged.sum()) + sum(unvalued)
    keep = result.stands | unjudged
    for o, tally in enumerate(row):
        mine = keep & (rows >= bounds[o]) & (rows < bounds[o + 1])
        tally.mismatched = int(mine.sum()) + unvalued[o]
        tally.standing = (rows[mine] - bounds[o], cols[mine])  # the judged mismatches
        diff = (a - n).abs()
        tol = torch.where(torch.isfinite(result.tolerance), result.tolerance,
                          torch.zeros_like(result.tolerance))
        excess = torch.where(mine, diff - tol, torch.full_like(diff, -math.inf))
        top = torch.argsort(excess, descending=True)[:min(tally.keep, int(mine.sum()))]
        tally.worst = [(float(excess[t]), int(rows[t]) - bounds[o], int(cols[t]),
                        float(a[t]), float(n[t])) for t in top.tolist()]
        if tally.mismatched:
            stood = (result.stands & mine)
            rel = diff[stood] / n[stood].abs().clamp_min(1e-300)
            tally.max_rel = float(rel.max()) if rel.numel() else 0.0
        else:
            tally.max_rel = 0.0
