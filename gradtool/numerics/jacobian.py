"""Jacobian comparison engine: mode choice, and full mode (every element, block by block)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..config.settings import CheckConfig
from ..results import Block, Outcome
from .columns import sweep_input
from .compare import BlockTally, judged_mask
from .confirm import ROUNDING_CAUSE, Evaluations, confirm, confirmed, kink_note
from .facts import output_facts
from .problem import Problem, flat_cat, select_outputs
from .sparsity import (
    AnalyticalJacobian,
    Strides,
    Trials,
    analytical_jacobian,
    find_strides,
)
from .steps import analytical_rows, numerical_columns

# A reference gives the intended VJP rows (B, n_out) -> (B, n_in) instead of finite differences.
Reference = Callable[[torch.Tensor], torch.Tensor]
DENSE_LIMIT = 2_000_000  # dense blocks for diagnosis, on failure, up to this many elements
SMALL = 4096             # Jacobians this small go to full mode without a prediction


@dataclass
class Verdict:
    """What the engine found: an outcome, one Block per (input, output) pair, and how."""

    outcome: Outcome
    blocks: list[Block]
    mode: str
    mode_reason: str
    details: list[str] = field(default_factory=list)
    dense: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # per dense block: the elements the verdict judged wrong (the diagnosis and heat map read it)
    mismatch: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)  # measured: how it judged
    limit: str | None = None   # measured: what noise keeps from being seen
    # blocks compared in part (stopping.compared_in_part): their compared columns' pair
    partial: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    cause: str | None = None   # inconclusive: why, when not a kink (confirm.ROUNDING_CAUSE)


@dataclass
class Plan:
    """What full mode would cost, from a few timed rows and columns; reused by check_full."""

    seconds: float
    memory: float
    forwards: int
    backwards: int
    strides: Strides           # per output: row stride of the grouped VJPs, or None (one-hot)
    trials: Trials = field(default_factory=dict)  # groups decoded while searching

    def describe(self) -> str:
        grouped = [m for m in self.strides if m]
        rows = (f"rows grouped by stride {', '.join(map(str, grouped))}" if grouped
                else "one-hot rows")
        return (f"predicted {self.seconds:.2g} s, ~{self.forwards} forward and "
                f"~{self.backwards} backward evaluations, ~{_bytes(self.memory)}, {rows}")


def prime(problem: Problem) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the forward once with a graph: (leaves, the compared outputs), timed for predictions.

    Which outputs are compared is a fact the probe phase learnt; a problem it never saw (one
    gradtool derived, as double backward's) learns it here, from this forward, once."""
    problem.cache.plan = None
    known = problem.facts.outputs_known
    first = problem.take_first_graph() if known else None
    if first is not None:  # the probe phase's graph forward (timed there), not yet used
        return first[0], select_outputs(first[1], problem.output_mask)
    shared = problem.cache.ledger.graph(problem.inputs, last=False) if known else None
    if shared is not None:  # the same forward, the contract's (its backward re-entrant)
        return shared.leaves, shared.outs
    start = time.perf_counter()
    leaves, outs = problem.graph()
    problem.cache.forward_seconds = time.perf_counter() - start  # for plan_full's prediction
    if known:
        return leaves, outs
    problem.learn(problem.facts.with_(**output_facts(
        outs, problem.output_labels, problem.keep_all_outputs, leaves)))
    return leaves, [o for o, keep in zip(outs, problem.facts.output_mask or ()) if keep]


def choose_mode(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                outs: Sequence[torch.Tensor]) -> tuple[str, str]:
    """full while predicted to take about config.full_budget_s and fit in memory, else probe."""
    n_in = sum(v.numel() for v in leaves)
    n_out = sum(o.numel() for o in outs)
    size = f"{n_out} x {n_in} Jacobian"
    untimed = untimed_mode(problem, config, n_in, n_out)
    if untimed == "probe":
        return "probe", "--mode probe"
    if untimed == "full":
        return "full", f"small {size}: full mode predicted well under {config.full_budget_s:g} s"
    plan = problem.cache.plan = plan_full(problem, leaves, outs)
    if config.mode == "full":
        if plan.memory > config.max_memory:
            raise MemoryError(f"full mode needs ~{_bytes(plan.memory)} for the {size}, "
                              f"above --max-memory {_bytes(config.max_memory)}")
        return "full", f"--mode full: {size}, {plan.describe()}"
    if plan.memory > config.max_memory:
        return "probe", f"full mode would need ~{_bytes(plan.memory)} for the {size}"
    if plan.seconds <= config.full_budget_s:
        return "full", f"{size}, {plan.describe()}"
    return "probe", f"full mode {plan.describe()} for the {size}"


def untimed_mode(problem: Problem, config: CheckConfig, n_in: int, n_out: int) -> str | None:
    """The mode chosen without timing a row (run/plan.py asks too): --mode probe's, or full on
    a small Jacobian (--mode full, or predicted well under the budget from the priming
    forward's time); None where plan_full's timed rows decide."""
    if config.mode == "probe":
        return "probe"
    dense_seconds = problem.cache.forward_seconds * (2 * n_in + n_out)
    if n_in * n_out <= SMALL and (config.mode == "full"
                                  or dense_seconds <= config.full_budget_s / 4):
        return "full"
    return None


def plan_full(problem: Problem, leaves: Sequence[torch.Tensor],
              outs: Sequence[torch.Tensor]) -> Plan:
    """Time two one-hot rows (they also show how sparse rows are), look for a row grouping,
    and extrapolate; a forward's cost is the priming forward's."""
    n_out = sum(o.numel() for o in outs)
    in_sizes = [v.numel() for v in leaves]
    sample = torch.tensor(sorted({0, n_out // 2}), device=outs[0].device)
    start = time.perf_counter()
    rows = analytical_rows(problem, leaves, outs, sample)
    per_row = (time.perf_counter() - start) / len(sample)
    sparse = float((rows != 0).sum()) / len(sample) * 8 <= sum(in_sizes)
    strides, trials = (find_strides(problem, leaves, outs) if sparse
                       else ([None] * len(outs), {}))
    per_eval = problem.cache.forward_seconds or per_row
    return _predict(rows, in_sizes, outs, strides, per_row, per_eval, trials)


def _predict(rows: torch.Tensor, in_sizes: Sequence[int], outs: Sequence[torch.Tensor],
             strides: Strides, per_row: float, per_eval: float, trials: Trials) -> Plan:
    """Seconds, bytes and evaluations: grouped or one-hot rows, coloured or column-by-column
    differences."""
    n_in, n_out = sum(in_sizes), sum(o.numel() for o in outs)
    nnz = float((rows != 0).sum()) / max(1, len(rows)) * n_out
    backwards = sum(2 * m if m else o.numel() for o, m in zip(outs, strides))
    forwards, offset = 0, 0
    for size in in_sizes:
        widest = int((rows[:, offset:offset + size] != 0).sum(1).max()) if len(rows) else 0
        # a colouring needs at least `widest` colours; twice that is the usual outcome
        colours = 2 * max(1, widest)
        forwards += 4 * colours if colours * 8 <= size else 2 * size
        offset += size
    seconds = per_row * backwards + per_eval * forwards
    if any(strides):  # entries kept sparse (values and indices)
        seconds, memory = seconds + 2e-7 * nnz, 48.0 * nnz + 64 * 2**20
    else:
        seconds, memory = seconds + 3e-9 * n_in * n_out, 8.0 * n_in * n_out + 64 * 2**20
    return Plan(seconds, memory, forwards, backwards, strides, trials)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TB"


def check_full(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
               outs: Sequence[torch.Tensor], reference: Reference | None, reason: str,
               stop: str | None = None, first: Sequence[int] = ()) -> Verdict:
    """Every element: the analytical Jacobian (grouped rows where possible), then each input's
    numerical columns (coloured where possible) compared chunk by chunk. `stop` (why): the
    sweep ends at a failing block (inputs `first` first), said so; if not confirmed, all."""
    if reference is not None:
        tallies = _tallies(problem, leaves, outs, config.tolerance("atol"),
                           config.tolerance("rtol"), config.max_worst)
        return _check_reference(problem, config, leaves, outs, reference, tallies, reason)
    tallies = judged_tallies(problem, config, leaves, outs)
    bounds = [0]
    for o in outs:
        bounds.append(bounds[-1] + o.numel())
    far: list[dict] = [{} for _ in leaves]  # col -> f(x ± 10h e_col): measured's, the kink test's
    f0 = flat_cat(outs).detach()
    keep = 2 * bounds[-1] * sum(v.numel() for v in leaves) <= DENSE_LIMIT  # for the failing path
    kept: list[dict] = [{} for _ in leaves]
    evaluated = Evaluations(f0, kept, {}, far)
    cut: dict[int, list[int]] = {}  # input -> the columns compared, where it stopped short
    if stop:
        jac, unchecked, cut = _until_failure(problem, config, leaves, outs, tallies, bounds, keep,
                                             evaluated, first)
    else:
        jac, unchecked = _analytical(problem, leaves, outs), []
        affordable = _affordable(problem, jac)  # as known before the sweep learns vmap_ok
        for i in range(len(leaves)):
            sweep_input(problem, config, jac, i, tallies[i], bounds, kept[i] if keep else None,
                        affordable)
    if jac.dense is not None and not bool(jac.dense.isnan().any()):
        problem.cache.jacobian = jac  # every row: double backward's columns along grad_output
    capped = sum(t.capped for row in tallies for t in row)  # the door's cuts (bounds.py)
    measurement = None
    if config.measured and any(t.mismatched for row in tallies for t in row):
        from .measured import remeasure

        measurement = remeasure(problem, problem.inputs, tallies, f0,
                                config.tolerance("eps"), _fixed(config), kept, bounds, far)
        if measurement is None:  # flags it cannot measure, none standing: the fixed tolerance
            return _fallback(problem, config, leaves, outs, reason)
    dense = {}
    if any(t.mismatched for row in tallies for t in row) and _affordable(problem, jac):
        # Whole blocks: for the diagnosis, and exact counts where the sweep only had bounds.
        failing = [any(t.mismatched for t in row) and i not in cut
                   for i, row in enumerate(tallies)]
        dense = _dense_blocks(problem, config, jac, leaves, bounds, kept, failing)
        dense = {k: v for k, v in dense.items() if k not in unchecked}
        fresh = _tallies(problem, leaves, outs, *_fixed(config), config.max_worst)
        for (i, o), (analytical, numerical) in dense.items():
            if measurement is not None and (measurement.measured or measurement.sampled):
                continue  # the counts are the measured verdict's: one judgement per element
            # (every flag beyond gradcheck's tolerance: the fixed one judged them all, as here)
            fresh[i][o].add(analytical, numerical)
            tallies[i][o] = fresh[i][o]
    verdict = _finish(problem, config, tallies, False, "full", reason, evaluated)
    verdict.dense = dense
    if unchecked:
        from .stopping import left_unchecked

        left_unchecked(verdict, problem, unchecked, stop)
    if cut:
        from .stopping import compared_in_part

        compared_in_part(verdict, problem, jac, cut, kept, bounds, config.tolerance("eps"))
    verdict.mismatch = {k: judged_mask(tallies[k[0]][k[1]], *pair) for k, pair in dense.items()}
    if config.measured:
        from .measured_words import describe

        describe(verdict, tallies, measurement, problem)
    if (unchecked or cut) and verdict.outcome is not Outcome.FAILED:  # qpth's p hid behind Q
        return check_full(problem, config, leaves, outs, None, f"{reason}; the block it "
                          "stopped at was not a confirmed failure, so every column was swept")
    if capped:
        verdict.details.append(
            f"tolerance: the first bound was as large as the values compared at {capped} "
            "element(s); cut there to 0.5 |value| + 0.1 max |value| (or gradcheck's fixed "
            "tolerance, where larger): a difference that size is never rounding")
    return verdict


def _analytical(problem: Problem, leaves: Sequence[torch.Tensor],
                outs: Sequence[torch.Tensor]) -> AnalyticalJacobian:
    plan = problem.cache.plan
    return (analytical_jacobian(problem, leaves, outs, plan.strides, plan.trials)
            if plan is not None else analytical_jacobian(problem, leaves, outs))


def _until_failure(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                   outs: Sequence[torch.Tensor], tallies: list[list[BlockTally]],
                   bounds: Sequence[int], keep: bool, evaluated: Evaluations,
                   first: Sequence[int]
                   ) -> tuple[AnalyticalJacobian, list[tuple[int, int]], dict[int, list[int]]]:
    """The sweep, inputs `first` first, until a block's failure is confirmed: the analytical
    Jacobian, the blocks (input, output) left unchecked, and the columns compared of each input
    cut short (a zero block: stopping.zero_block). Analytical rows come output by output while
    an input's block is too wide to colour anyway (its columns kept, each output compared as
    its rows come); otherwise all at once, as in the whole run."""
    from .confirm import forget
    from .stopping import ByOutput, compare_kept, order, scratch, zero_block

    plan = problem.cache.plan
    rows = (ByOutput(problem, leaves, outs, bounds)
            if keep and (plan is None or not any(plan.strides)) else None)
    jac = rows.jac if rows is not None else _analytical(problem, leaves, outs)
    affordable = _affordable(problem, jac)
    n_out = len(outs)
    sequence = order(len(leaves), first)
    cut: dict[int, list[int]] = {}
    for step, i in enumerate(sequence):
        offset, size = sum(v.numel() for v in leaves[:i]), leaves[i].numel()
        while rows is not None and not rows.whole and (
                rows.known == 0 or not rows.too_wide(offset, size)):
            rows.more()
        known = rows.known if rows is not None else n_out
        mine = [t if o < known else scratch(t) for o, t in enumerate(tallies[i])]
        zero = keep and known == n_out and not config.measured and zero_block(jac, offset, size)
        until = (lambda: confirmed(problem, config, tallies, i, evaluated, True)) if zero else None
        sweep_input(problem, config, jac, i, mine, bounds, evaluated.kept[i] if keep else None,
                    affordable, dense=known < n_out, until=until)
        if zero and len(evaluated.kept[i]) == size:
            forget(evaluated, i)  # answered before the last columns came
        elif zero and evaluated.kept[i] and confirmed(problem, config, tallies, i, evaluated):
            cut[i] = sorted(evaluated.kept[i])
        rest = [(k, o) for k in sequence[step + 1:] for o in range(n_out)]
        while True:
            left = [(i, o) for o in range(known, n_out)] + rest
            if not left:
                break
            if confirmed(problem, config, tallies, i, evaluated):
                return jac, left, cut
            if rows is None or not rows.more():
                break
            compare_kept(tallies[i], jac, known, bounds, offset, size, evaluated.kept[i],
                         config.tolerance("eps"))
            known += 1
    return jac, [], cut


def judged_tallies(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                   outs: Sequence[torch.Tensor]) -> list[list[BlockTally]]:
    """Tallies at the fixed tolerance, or (measured) at the tight first bound, recording every
    failing element for the second step and keeping the fixed tolerance for the kink test."""
    if not config.measured:
        return _tallies(problem, leaves, outs, config.tolerance("atol"),
                        config.tolerance("rtol"), config.max_worst)
    from .measured import column_rtol, first_bound

    f0, h = flat_cat(outs).detach(), config.tolerance("eps")
    atol, _ = first_bound(problem.inputs, f0, h)
    atol += 2 * problem.facts.drift_size / (2 * h)  # a benign drift on both points (facts.py)
    tallies = _tallies(problem, leaves, outs, atol, 0.0, config.max_worst)
    for value, row in zip(problem.inputs, tallies):
        # each input's columns by their own |x_j|: a huge mask in one input must not loosen
        # another's bound, nor its own elements' beside it (measured.column_rtol)
        rtols = column_rtol(value, f0, h)
        for t in row:
            t.flagged, (t.kink_atol, t.kink_rtol) = [], _fixed(config)
            t.rtol, t.column_rtol = float(rtols.max()) if rtols.numel() else 0.0, rtols
    return tallies


def _fixed(config: CheckConfig) -> tuple[float, float]:
    return config.tolerance("atol"), config.tolerance("rtol")


def _fallback(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
              outs: Sequence[torch.Tensor], reason: str) -> Verdict:
    """The fixed tolerance's verdict, where elements beyond the first bound cannot be measured
    (more columns than MAX_COLUMNS, or failures without exact values), none standing."""
    verdict = check_full(problem, config.fixed(), leaves, outs, None, reason)
    verdict.details.append(
        f"tolerance fixed (atol {config.tolerance('atol'):g}, rtol {config.tolerance('rtol'):g}): "
        "too many elements beyond the measured tolerance's first bound to measure each")
    return verdict


def _affordable(problem: Problem, jac: AnalyticalJacobian) -> bool:
    """Dense blocks on failure: small Jacobians, and few evaluations when they are a loop."""
    evaluations = 2 * jac.n_in
    return (jac.n_out * jac.n_in <= DENSE_LIMIT
            and evaluations <= (20_000 if problem.cache.vmap_ok else 1_000))


def _check_reference(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                     outs: Sequence[torch.Tensor], reference: Reference,
                     tallies: list[list[BlockTally]], reason: str) -> Verdict:
    """A declared surrogate: its intended rows against the analytical ones, densely."""
    n_out = sum(o.numel() for o in outs)
    analytical = analytical_rows(problem, leaves, outs, torch.arange(n_out, device=outs[0].device))
    expected = reference(torch.eye(n_out, dtype=outs[0].dtype, device=outs[0].device))
    dense, in_off = {}, 0
    keep = n_out * analytical.shape[1] <= DENSE_LIMIT
    for i, leaf in enumerate(leaves):
        out_off = 0
        for o, out in enumerate(outs):
            rows = slice(out_off, out_off + out.numel())
            block_a = analytical[rows, in_off:in_off + leaf.numel()]
            block_e = expected[rows, in_off:in_off + leaf.numel()]
            tallies[i][o].add(block_a, block_e)
            if keep:
                dense[(i, o)] = (block_a.clone(), block_e.clone())
            out_off += out.numel()
        in_off += leaf.numel()
    verdict = _finish(problem, config, tallies, True, "full", reason)
    verdict.dense = dense
    return verdict


def _dense_blocks(problem: Problem, config: CheckConfig, jac: AnalyticalJacobian,
                  leaves: Sequence[torch.Tensor], bounds: Sequence[int],
                  kept: Sequence[dict[int, tuple[torch.Tensor, torch.Tensor]]],
                  failing: Sequence[bool]
                  ) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """Whole blocks for the diagnosis of a failure (small problems only); columns the sweep
    already evaluated are reused, only the others are computed, and only for the inputs that
    failed (an input that passed is given only when its columns are all kept)."""
    dense, offset = {}, 0
    h = config.tolerance("eps")
    for i, leaf in enumerate(leaves):
        if not failing[i] and len(kept[i]) < leaf.numel():
            offset += leaf.numel()
            continue
        numerical = torch.empty(bounds[-1], leaf.numel(), dtype=leaf.dtype, device=leaf.device)
        known = [c for c in range(leaf.numel()) if c in kept[i]]
        for c in known:
            plus, minus = kept[i][c]
            numerical[:, c] = (plus - minus) / (2 * h)
        missing = torch.tensor(sorted(set(range(leaf.numel())) - set(known)), dtype=torch.long,
                               device=leaf.device)
        if len(missing):
            numerical[:, missing] = numerical_columns(problem, problem.inputs, i, missing, h)
        analytical = jac.columns(torch.arange(leaf.numel(), device=leaf.device) + offset,
                                 numerical.dtype)
        for o in range(len(bounds) - 1):
            rows = slice(bounds[o], bounds[o + 1])
            dense[(i, o)] = (analytical[rows].clone(), numerical[rows].clone())
        offset += leaf.numel()
    return dense


def _tallies(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
             atol: float, rtol: float, keep: int) -> list[list[BlockTally]]:
    return [[BlockTally(name, tuple(v.shape), oname, tuple(o.shape), atol, rtol, keep)
             for oname, o in zip(problem.output_names, outs)]
            for name, v in zip(problem.input_names, leaves)]


def _finish(problem: Problem, config: CheckConfig, tallies: list[list[BlockTally]],
            has_reference: bool, mode: str, reason: str,
            done: Evaluations | None = None) -> Verdict:
    """Re-estimate failing elements with other steps: disagreement means inconclusive."""
    blocks, outcomes, details = [], [], []
    causes: list[bool] = []  # per inconclusive block: rounding (True) or a kink
    for i, row in enumerate(tallies):
        for o, tally in enumerate(row):
            if not tally.mismatched:
                blocks.append(tally.to_block())
                continue
            offset = sum(math.prod(t.output_shape) for t in row[:o])
            elements, inconclusive, rounding = (
                done.confirmed.get((i, o)) if done is not None and (i, o) in done.confirmed
                else confirm(problem, config, tally, i, offset, has_reference, done))
            blocks.append(tally.to_block(tuple(elements)))
            outcomes.append(Outcome.INCONCLUSIVE if inconclusive else Outcome.FAILED)
            if inconclusive:
                details.append(kink_note(tally, elements, rounding))
                causes.append(rounding)
    outcome = Outcome.PASSED
    if outcomes:
        outcome = Outcome.FAILED if Outcome.FAILED in outcomes else Outcome.INCONCLUSIVE
    cause = ROUNDING_CAUSE if causes and all(causes) else None
    return Verdict(outcome, blocks, mode, reason, details, cause=cause)
