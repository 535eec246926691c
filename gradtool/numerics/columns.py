"""Full mode's numerical side: every column of one input's block, coloured or one by one."""

# Coloured sweep: the columns of one colour meet no common output row in the analytical pattern,
# so one central difference along their (weighted) sum yields each of their elements exactly,
# provided the numerical pattern is no wider than the analytical one. Two independent random
# weightings guard that proviso: an element that the analytical pattern misses adds to its
# neighbours with different weights in each sweep, so it cannot pass both by accident. Failures
# are confirmed column by column (found by bisection where the column is unknown), so every
# reported element is an exact central difference, as in a one-column-at-a-time sweep.

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..config.settings import CheckConfig
from .compare import BlockTally
from .localise import bisect
from .problem import Problem
from .sparsity import AnalyticalJacobian, colour_columns
from .steps import central, chunk_size, outputs_of

EXACT_COLUMNS = 64   # flagged columns confirmed one by one: enough to name the worst elements
SUSPECTS = 5         # rows whose failing column is unknown, bisected within their colour
WHOLE_COLUMNS = 4096  # unconfirmed flags: their colours recomputed whole, up to this many columns


@dataclass
class Sweep:
    """One input's block of the comparison: where it sits and how to compare it."""

    problem: Problem
    values: Sequence[torch.Tensor]
    which: int
    offset: int                      # first column of this input in the flat Jacobian
    size: int
    tallies: list[BlockTally]        # one per output
    out_bounds: list[int]            # flat row where each output starts, plus n_out
    h: float
    # col -> (f(x + h e_col), f(x - h e_col)) of every exact column, for the failing path to
    # reuse (dense blocks, kink checks) instead of evaluating again; None: not kept
    kept: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = field(default=None)
    # whether a failure is followed by this block's dense columns (the diagnosis), which reuse
    # the kept ones: recomputing failing colours whole then costs nothing extra
    dense_on_failure: bool = False
    # a stopping sweep's test, asked after each chunk of exact columns: True once a failure is
    # confirmed, and the columns after it may go uncompared (stopping.zero_block)
    until: Callable[[], bool] | None = None

    @property
    def device(self) -> torch.device:
        return self.values[self.which].device

    def rows_of(self, o: int) -> slice:
        return slice(self.out_bounds[o], self.out_bounds[o + 1])

    def output_of(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(rows, torch.tensor(self.out_bounds[1:], device=rows.device),
                               right=True)


ZERO_BLOCK_COLUMNS = 64  # all-zero blocks this wide are coloured even on a looped Function


def sweep_input(problem: Problem, config: CheckConfig, jac: AnalyticalJacobian, i: int,
                tallies: list[BlockTally], bounds: Sequence[int], kept: dict | None,
                affordable: bool, dense: bool = False,
                until: Callable[[], bool] | None = None) -> None:
    """Input i's numerical columns against the analytical ones, coloured where the pattern
    allows (`dense`: known not to); `until` may stop its exact columns early (Sweep.until)."""
    offset = sum(v.numel() for v in problem.inputs[:i])
    size = problem.inputs[i].numel()
    sweep = Sweep(problem, problem.inputs, i, offset, size, tallies, list(bounds),
                  config.tolerance("eps"), kept, affordable, until)
    colour = None
    if not dense:
        rows, cols, _ = jac.entries(offset, offset + size)
        colour = colour_columns(rows, cols, jac.n_out, tuple(problem.inputs[i].shape))
        dense = colour is None or _zero_block_by_columns(problem, len(rows), size)
    if dense:
        sweep_dense(sweep, jac)
    else:
        sweep_coloured(sweep, jac, colour, config.seed)


def _zero_block_by_columns(problem: Problem, entries: int, size: int) -> bool:
    """Whether a block backward says is all zero is swept column by column (2 size
    evaluations) rather than coloured (one colour: 4 evaluations when it passes; when it fails,
    as a detached second order does, its columns are recomputed: whole, 4 more than column by
    column, or up to a confirmed failure under `Sweep.until`). Only small blocks evaluated call
    by call: there the 4 can matter; from ZERO_BLOCK_COLUMNS columns on they are at most 3 % of
    the columns' cost, and a passing block (sort's second derivative, 8000 columns) costs 4
    evaluations instead of 16 000. One or two columns are never cheaper coloured, batched or
    not."""
    looped = problem.batched_fn is None or problem.cache.vmap_ok is False
    return entries == 0 and (size <= 2 or looped and size < ZERO_BLOCK_COLUMNS)


def sweep_dense(sweep: Sweep, jac: AnalyticalJacobian) -> None:
    """Central differences column by column (batched), compared chunk by chunk."""
    _exact_chunks(sweep, jac, torch.arange(sweep.size, device=sweep.device))


def _exact_chunks(sweep: Sweep, jac: AnalyticalJacobian, cols: torch.Tensor) -> None:
    """Columns `cols` compared exactly, chunk by chunk; under `sweep.until`, in chunks doubling
    from two columns, stopping once it answers True (at most twice the columns needed)."""
    limit = chunk_size(sweep.out_bounds[-1] + sweep.size, limit=1024)
    # columns known exactly (problem.known) cost one f(x) per chunk: not worth stopping early
    until = None if sweep.which in sweep.problem.known else sweep.until
    step, start = (limit if until is None else min(2, limit)), 0
    while start < len(cols):
        _exact(sweep, jac, cols[start:start + step])
        start += step
        if until is not None and start < len(cols) and until():
            return
        step = min(2 * step, limit)


def _exact(sweep: Sweep, jac: AnalyticalJacobian, cols: torch.Tensor) -> torch.Tensor:
    """Compare whole columns exactly; return the (row, col) mask of failing elements."""
    numerical = _columns(sweep, cols)
    analytical = jac.columns(cols + sweep.offset, numerical.dtype)
    for o, tally in enumerate(sweep.tallies):
        rows = sweep.rows_of(o)
        tally.add(analytical[rows], numerical[rows], cols=cols)
    atol, rtol = sweep.tallies[0].atol, sweep.tallies[0].rtol
    failing = ~((analytical - numerical).abs() <= atol + rtol * numerical.abs())
    # rows a stopping sweep has not computed yet read NaN (stopping.ByOutput): no comparison
    # yet; a NaN backward gave is a mismatch its tally counts, which confirm.confirmed reads
    _give_up(sweep, bool((failing & ~analytical.isnan()).any()))
    return failing


def _columns(sweep: Sweep, cols: torch.Tensor) -> torch.Tensor:
    """Central-difference columns (n_out, len(cols)), as steps.numerical_columns computes
    them, keeping both evaluations of each column when the sweep keeps them."""
    base = sweep.values[sweep.which].detach().reshape(-1)
    d = torch.zeros(len(cols), base.numel(), dtype=base.dtype, device=base.device)
    d[torch.arange(len(cols), device=base.device), cols] = 1
    d = d * sweep.h
    shape = sweep.values[sweep.which].shape
    known = sweep.problem.known.get(sweep.which)
    if known is not None:
        # exact columns already computed elsewhere: f(x) once, both sides by linearity
        f0 = outputs_of(sweep.problem, sweep.values, sweep.which, base.view(1, *shape))[0]
        exact = known(cols).to(f0.dtype)                                # (n_out, len(cols))
        plus, minus = f0 + sweep.h * exact.T, f0 - sweep.h * exact.T
        if sweep.kept is not None:
            for k, col in enumerate(cols.tolist()):
                sweep.kept[col] = (plus[k], minus[k])
        return exact
    if sweep.which in sweep.problem.linear_in and len(cols) > 1:
        # linear along this input: the minus side mirrors the plus side through f(x), one
        # evaluation per column instead of two (and one for f(x))
        out = outputs_of(sweep.problem, sweep.values, sweep.which,
                         torch.cat([base.unsqueeze(0), base + d]).view(-1, *shape))
        plus = out[1:]
        minus = 2 * out[0] - plus
    else:
        batch = torch.cat([base + d, base - d]).view(-1, *shape)
        out = outputs_of(sweep.problem, sweep.values, sweep.which, batch)
        plus, minus = out[:len(cols)], out[len(cols):]
    if sweep.kept is not None:
        for k, col in enumerate(cols.tolist()):
            sweep.kept[col] = (plus[k], minus[k])
    return ((plus - minus) / (2 * sweep.h)).T


class NotAPass(Exception):
    """A failing comparison where the problem's caller takes a pass or nothing (Cache.pass_only):
    the sweep stops there, before the columns and evidence a failure's report would need."""


def _give_up(sweep: Sweep, failed: bool) -> None:
    if failed and sweep.problem.cache.pass_only:
        raise NotAPass(f"input {sweep.which}: a failing comparison")


class Flags:
    """Failing comparisons of a coloured sweep, already counted as mismatches; confirming
    them exactly replaces those counts."""

    def __init__(self, n_outputs: int, size: int, device: torch.device) -> None:
        self.by_column = torch.zeros(n_outputs, size, dtype=torch.long, device=device)
        self.excess = torch.zeros(size, dtype=torch.float64, device=device)
        self.entries: list[torch.Tensor] = []   # (row, col) of failing in-pattern entries
        self.stray: list[torch.Tensor] = []     # (colour, row, |value|): nonzero, no entry

    def any(self) -> bool:
        return bool(self.by_column.any()) or any(len(s) for s in self.stray)


def sweep_coloured(sweep: Sweep, jac: AnalyticalJacobian, colour: torch.Tensor,
                   seed: int = 0) -> None:
    """Two weighted central differences per colour; failures confirmed column by column."""
    if not sweep.size:  # an empty input (a grad_output of an empty output): nothing to sweep
        return
    n_colours = int(colour.max()) + 1
    rows, cols, vals = jac.entries(sweep.offset, sweep.offset + sweep.size)
    gen = torch.Generator().manual_seed(seed + 31337)  # drawn on the CPU: the same everywhere
    r = torch.rand(2, sweep.size, generator=gen, dtype=torch.float32, device="cpu").mul_(2)
    weights = torch.where(r < 1, r - 2, r).to(vals)     # ±[1, 2): random sign, size
    entry_colour = colour[cols]
    step = max(1, chunk_size(4 * (sweep.out_bounds[-1] + sweep.size)))
    flags = Flags(len(sweep.tallies), sweep.size, sweep.device)
    for start in range(0, n_colours, step):
        stop = min(n_colours, start + step)
        if start == 0 and stop == n_colours:  # the usual case: one chunk, no masking
            _compare_colours(sweep, colour, weights, 0, stop, rows, cols, vals, flags)
            continue
        mask = (entry_colour >= start) & (entry_colour < stop)
        _compare_colours(sweep, colour, weights, start, stop, rows[mask], cols[mask],
                         vals[mask], flags)
    if flags.any() and (sweep.until is not None or _whole_pays(sweep, colour, flags)):
        stray = torch.cat(flags.stray, dim=1) if flags.stray else _no_stray(sweep)
        _unconfirmed(sweep, jac, colour, flags, stray)
    elif flags.any():
        _confirm(sweep, jac, colour, weights[0], flags)


def _no_stray(sweep: Sweep) -> torch.Tensor:
    return torch.zeros(3, 0, dtype=torch.float64, device=sweep.device)


def _whole_pays(sweep: Sweep, colour: torch.Tensor, flags: Flags) -> bool:
    """Whether recomputing the flagged colours column by column costs no more evaluations
    than confirming the worst columns and bisecting the rest (small blocks, wide failures)."""
    suspect = set(colour[torch.nonzero(flags.by_column.sum(0)).reshape(-1)].tolist())
    for s in flags.stray:
        suspect |= set(s[0].long().tolist())
    whole = int(torch.isin(colour, torch.tensor(sorted(suspect), device=colour.device)).sum()
                ) if suspect else 0
    if sweep.dense_on_failure and sweep.kept is not None:
        return 0 < whole <= WHOLE_COLUMNS
    flagged = min(EXACT_COLUMNS, int((flags.by_column.sum(0) > 0).sum()))
    strays = sum(s.shape[1] for s in flags.stray)
    depth = max(1, int(colour.bincount().max()).bit_length())
    bisection = 2 * flagged + min(SUSPECTS, strays) * 2 * (depth + 1)
    return 0 < whole <= WHOLE_COLUMNS and 2 * whole <= bisection


def _compare_colours(sweep: Sweep, colour: torch.Tensor, weights: torch.Tensor, start: int,
                     stop: int, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor,
                     flags: Flags) -> None:
    """Compare colours [start, stop): every element is counted as checked, failures flagged."""
    k = stop - start
    if start == 0 and stop == int(colour.max()) + 1:
        members = torch.arange(sweep.size, device=colour.device)
    else:
        members = torch.nonzero((colour >= start) & (colour < stop)).reshape(-1)
    local_m = colour[members] - start
    dirs = torch.zeros(2, k, sweep.size, dtype=vals.dtype, device=vals.device)
    dirs[:, local_m, members] = weights[:, members]
    atol, rtol = sweep.tallies[0].atol, sweep.tallies[0].rtol
    sums = _weighted_sums(sweep, dirs, len(rows) == 0 and k == 1, atol, rtol)
    local = colour[cols] - start
    numerical = sums[:, local, rows] / weights[:, cols]          # (2 weightings, entries)
    d = (vals - numerical).abs().nan_to_num_(nan=float("inf"))
    excess = (d - rtol * numerical.abs()).amax(0) - atol
    bad = ~(excess <= 0)
    stray = sums.abs().amax(0).nan_to_num_(nan=float("inf"))    # where analytical is 0
    stray[local, rows] = 0.0
    bad_stray = ~(stray * (1 - rtol) <= atol)
    _give_up(sweep, bool(bad.any() or bad_stray.any()))
    output = sweep.output_of(rows) if len(sweep.tallies) > 1 else None
    if bool(bad.any()):
        at = (output[bad] if output is not None else torch.zeros_like(cols[bad]), cols[bad])
        flags.by_column.index_put_(at, torch.ones((), dtype=torch.long, device=cols.device),
                                   True)
        flags.excess.index_put_((cols[bad],), excess[bad].to(torch.float64), True)
        flags.entries.append(torch.stack([rows[bad], cols[bad]]))
    if bool(bad_stray.any()):
        where = torch.nonzero(bad_stray, as_tuple=True)
        flags.stray.append(torch.stack([(where[0] + start).double(), where[1].double(),
                                        stray[where].double()]))
    diff = d.amax(0)
    for o, tally in enumerate(sweep.tallies):
        block = sweep.rows_of(o)
        mine = slice(None) if output is None else output == o
        worst = float(diff[mine].max()) if diff[mine].numel() else 0.0
        if block.stop > block.start:
            worst = max(worst, float(stray[:, block].max()))
        tally.note((block.stop - block.start) * len(members), worst)
        tally.mismatched += int(bad[mine].sum()) + int(bad_stray[:, block].sum())


def _weighted_sums(sweep: Sweep, dirs: torch.Tensor, zero_block: bool, atol: float,
                   rtol: float) -> torch.Tensor:
    """Central differences along both weightings of each colour: (weightings, colours, n_out).

    An all-zero block is one colour whose four evaluations are plain calls: its second
    weighting is evaluated only when the first finds nothing, since a first that fails has its
    columns recomputed whole anyway (the second can only confirm a failure already found)."""
    k = dirs.shape[1]
    problem, values, which, h = sweep.problem, sweep.values, sweep.which, sweep.h
    if not zero_block:
        return central(problem, values, which, dirs.view(2 * k, -1), h).view(2, k, -1)
    first = central(problem, values, which, dirs[0], h)
    if not bool((first.abs().nan_to_num(nan=float("inf")) * (1 - rtol) <= atol).all()):
        return first.view(1, k, -1)
    return torch.cat([first, central(problem, values, which, dirs[1], h)]).view(2, k, -1)


def _confirm(sweep: Sweep, jac: AnalyticalJacobian, colour: torch.Tensor, weights: torch.Tensor,
             flags: Flags) -> None:
    """The worst flagged columns exactly; then rows whose failing column is unknown (a
    numerical nonzero the analytical pattern lacks) by bisection within their colour."""
    flagged = torch.nonzero(flags.by_column.sum(0)).reshape(-1)
    worst = flagged[torch.argsort(flags.excess[flagged], descending=True)][:EXACT_COLUMNS]
    stray = torch.cat(flags.stray, dim=1) if flags.stray else _no_stray(sweep)
    entries = (torch.cat(flags.entries, dim=1) if flags.entries
               else torch.zeros(2, 0, dtype=torch.long, device=sweep.device))
    suspects: list[tuple[int, int]] = []
    if len(worst):
        stray, failing = _settle(sweep, jac, colour, worst, flags, stray)
        # flagged entries that their exact column does not bear out: contaminated by another
        # column of their colour
        k = torch.searchsorted(worst.sort().values, entries[1]).clamp(max=len(worst) - 1)
        ours = worst.sort().values[k] == entries[1]
        order = torch.argsort(worst)
        confirmed = failing[entries[0][ours], order[k[ours]]]
        unconfirmed = entries[:, ours][:, ~confirmed]
        suspects += [(int(colour[c]), int(r)) for r, c in unconfirmed.T.tolist()]
    top = torch.argsort(stray[2], descending=True)[:SUSPECTS]
    suspects += [(int(stray[0, k]), int(stray[1, k])) for k in top]
    done = set(worst.tolist())
    for g, row in suspects[:SUSPECTS]:
        members = torch.nonzero(colour == g).reshape(-1)
        analytical = jac.row(row, sweep.offset, sweep.offset + sweep.size)
        found = bisect(lambda s, r=row, a=analytical: _subset_fails(sweep, weights, s, r, a),
                       members)
        for col in (found or [])[:1]:
            if col not in done:
                done.add(col)
                stray, _ = _settle(sweep, jac, colour, torch.tensor([col], device=colour.device),
                                   flags, stray)
    if not any(t.worst for t in sweep.tallies):
        _unconfirmed(sweep, jac, colour, flags, stray)


def _unconfirmed(sweep: Sweep, jac: AnalyticalJacobian, colour: torch.Tensor, flags: Flags,
                 stray: torch.Tensor) -> None:
    """Flags that no single column bears out (say many tiny derivatives that backward rounds
    to 0, each within atol, summing past it): recompute their colours column by column, so
    the verdict is slow mode's. Past a budget of columns the flags stand, conservatively."""
    suspect = set(stray[0].long().tolist())
    suspect |= set(colour[torch.nonzero(flags.by_column.sum(0)).reshape(-1)].tolist())
    cols = torch.nonzero(torch.isin(colour, torch.tensor(sorted(suspect), device=colour.device))
                         ).reshape(-1)
    if not suspect or len(cols) > WHOLE_COLUMNS and sweep.until is None:
        return
    rows_o = sweep.output_of(stray[1].long())
    for o, tally in enumerate(sweep.tallies):
        tally.mismatched -= int(flags.by_column[o].sum()) + int((rows_o == o).sum())
        tally.checked -= (sweep.out_bounds[o + 1] - sweep.out_bounds[o]) * len(cols)
    flags.by_column.zero_()
    _exact_chunks(sweep, jac, cols)


def _settle(sweep: Sweep, jac: AnalyticalJacobian, colour: torch.Tensor, cols: torch.Tensor,
            flags: Flags, stray: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact columns replace the coloured sweep's counts for them. Returns the stray flags
    that these columns do not explain, and the (row, col) mask of failing elements."""
    for o, tally in enumerate(sweep.tallies):
        tally.mismatched -= int(flags.by_column[o, cols].sum())
        tally.checked -= (sweep.out_bounds[o + 1] - sweep.out_bounds[o]) * len(cols)
    flags.by_column[:, cols] = 0
    failing = torch.zeros(sweep.out_bounds[-1], len(cols), dtype=torch.bool, device=cols.device)
    step = chunk_size(sweep.out_bounds[-1] + sweep.size, limit=1024)
    for start in range(0, len(cols), step):
        failing[:, start:start + step] = _exact(sweep, jac, cols[start:start + step])
    explained = torch.zeros(stray.shape[1], dtype=torch.bool, device=stray.device)
    for k, col in enumerate(cols.tolist()):
        explained |= (stray[0] == float(colour[col])) & failing[stray[1].long(), k]
    rows_o = sweep.output_of(stray[1, explained].long())
    for o, tally in enumerate(sweep.tallies):  # those stray flags were counted already
        tally.mismatched -= int((rows_o == o).sum())
    return stray[:, ~explained], failing


def _subset_fails(sweep: Sweep, weights: torch.Tensor, subset: torch.Tensor, row: int,
                  analytical_row: torch.Tensor) -> bool:
    """Whether one weighted central difference over `subset` disagrees at `row`."""
    direction = torch.zeros(1, sweep.size, dtype=weights.dtype, device=weights.device)
    direction[0, subset] = weights[subset]
    numerical = float(central(sweep.problem, sweep.values, sweep.which, direction,
                              sweep.h)[0, row])
    analytical = float(analytical_row[subset] @ weights[subset])
    atol, rtol = sweep.tallies[0].atol, sweep.tallies[0].rtol
    return not abs(analytical - numerical) <= 2 * atol + rtol * abs(numerical)
