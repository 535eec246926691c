"""A case's cost plan (issue 58): the evaluations every check will make, known before the first
one runs, and the order that pays each shared one once.

Once the probe phase learnt the case's facts, each check that will run is counted from what it
will call on correct code, in the mode it will choose — the contract's `_evaluations`, the
gradient check's full-mode columns and rows or its probes (`expect_evaluations`' count), the
layout variants' `evaluations`, double backward's Jacobian of vᵀ∂f/∂x — and what the ledger
(numerics/ledger.py) will serve instead of paying: the contract's graph to the gradient check's
priming forward and the layout check's baseline, the gradient check's one-hot rows to the
contract's linearity test (checks/linear_rows.py). Nothing is evaluated to plan: shapes come
from the facts (`Facts.output_shapes`), layouts are tried on empty tensors of their shapes.

A count is `exact` where the check pays exactly that (paid plus read) on correct code, else an
upper bound (`bound="at most"`: coloured or batched columns, reuse the check finds as it goes)
or not planned at all (None: the low-precision judge, opt-in checks, a mode only timing
decides). Reads are at most those planned: a share the ledger cannot serve at run time (an
engine-summed gradient, rows a timed plan groups) is paid instead. Beyond the plan: a
failure's confirmation calls, re-estimates, diagnosis and culprit search; a warning's
confirmations; a tolerance measured at 2h and 3h (noisy finite differences); a placeholder
output the contract sees depends on no input (a forward). The report's calls say what was
paid, and `-v` what went beyond the plan (render/words.py:beyond_text).

The order is stated here: a check runs after every check it reads from (`records` before
`reads_recorded`, `waits_for`, the first-order check before the one that `reuses_graph`), and
the contract's linearity test right before the rows it reads (`rows_from`); the registry's
default order already is that order (tests/test_plan.py holds it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import heartbeat
from ..config import registry
from ..results import PlannedCost

if TYPE_CHECKING:
    from ..targets.cases import Case

EXACT, AT_MOST = "exact", "at most"


def order(names: Sequence[str]) -> tuple[str, ...]:
    """The checks in the order that pays each shared evaluation once: the given order, each
    check moved after those it reads from and a `rows_from` reader right before its rows."""
    left, ordered = list(names), []
    while left:  # each time the first check in the given order whose sources have all run
        name = next((n for n in left if not any(_must_follow(n, m) for m in left if m != n)),
                    left[0])  # a circle (none registered) keeps the given order
        left.remove(name)
        ordered.append(name)
    return _rows_adjacent(tuple(ordered))


def _must_follow(name: str, other: str) -> bool:
    """Whether `name` reads what `other` pays (so runs after it)."""
    mine, theirs = registry.BY_NAME.get(name), registry.BY_NAME.get(other)
    if mine is None or theirs is None:
        return False
    first_order = {info.rows_from for info in registry.BY_NAME.values() if info.rows_from}
    return ((mine.reads_recorded and theirs.records) or mine.waits_for == other
            or (mine.reuses_graph and other in first_order))


def _rows_adjacent(names: tuple[str, ...]) -> tuple[str, ...]:
    """A check whose linearity test reads another's rows runs right before that one."""
    for name in names:
        rows = registry.BY_NAME[name].rows_from if name in registry.BY_NAME else None
        if rows in names and names.index(rows) != names.index(name) + 1:
            rest = [n for n in names if n != name]
            at = rest.index(rows)
            if not any(_must_follow(name, n) for n in rest[:at]):
                return tuple(rest[:at] + [name] + rest[at:])
    return names


def plan_case(case: Case, job: Any, runs: Sequence[str], when: Mapping[str, Callable[..., bool]]
              ) -> tuple[PlannedCost, ...]:
    """Each check in `runs` (those that apply, in the run's order), counted before any runs;
    `when`: the runner's conditions (a registry variant, the low-precision judge, is not
    planned)."""
    from ..numerics import ledger

    shared = ledger.enabled()
    infos = {name: registry.BY_NAME[name] for name in runs}  # read now: a test may swap it
    recorded = shared and any(i.records for i in infos.values()) and \
        any(i.reads_recorded for i in infos.values())
    costs: list[PlannedCost] = []
    for name, info in infos.items():
        config, counter = _config(job, name), _COUNTERS.get(info.import_path)
        if counter is None or any(when[w](case, job, config) for w, _ in info.variants):
            costs.append(PlannedCost(name))  # not planned: counted when it runs
        else:
            costs.append(counter(name, case, job, config, runs, recorded, shared))
    return tuple(costs)


def _sizes(case: Case) -> tuple[int, int, int]:
    """(input elements, compared output elements, differentiable outputs) from the facts."""
    problem = case.problem
    n_in = sum(v.numel() for v in problem.inputs)
    shapes = problem.facts.output_shapes
    n_out = sum(math.prod(shape) for shape, _, _ in shapes)
    return n_in, n_out, sum(tracked for _, _, tracked in shapes)


def _contract(name: str, case: Case, job: Any, config: Any, runs: Sequence[str],
              recorded: bool, shared: bool) -> PlannedCost:
    """`_evaluations` after the probe's graph (kept for it); linearity's two backwards read
    from the gradient check's rows where the runner defers the test and the gradient check will
    run in full mode (its rows one-hot and whole; where a timed plan groups them, or the rows
    are not the inputs' shapes, an engine-summed gradient, the two are paid instead: the
    total holds, the reads are at most those planned)."""
    from ..checks.contract import _evaluations
    from ..checks.linear_rows import rows_pair

    _, _, diff = _sizes(case)
    problem = case.problem
    total = _evaluations(problem, job.target, diff) if diff else 0
    pair = rows_pair(runs)
    read = 2 if (diff and shared and pair is not None and pair[0] == name
                 and _float64(case) and _gradient_mode(case, _config(job, pair[1]))[0]
                 == "full") else 0
    first = problem.cache.first_graph is None  # a forward of its own: the probe kept none
    return PlannedCost(name, "", int(first), total - read, 0, read, EXACT,
                       "the gradient rows" if read else "")


def _config(job: Any, name: str) -> Any:
    return job.config.with_(**job.check_config.get(name, {}))


def _float64(case: Case) -> bool:
    """Real float64 strided tensors in and out, nothing sparse: the rows' linearity test."""
    problem = case.problem
    return not problem.sparse and all(
        str(v.dtype) == "torch.float64" and not v.is_sparse for v in problem.inputs) and all(
        dtype == "float64" for _, dtype, _ in problem.facts.output_shapes)


def _gradient_mode(case: Case, config: Any) -> tuple[str, bool]:
    """(mode, timed): the mode numerics/jacobian.py's choose_mode will choose, without timing a
    row, and whether it will time two rows to decide (plan_full: they are paid too). Past the
    small rule the plan says full where every column and row at the probe's forward time fits
    the budget, else probe: the timed rows may decide otherwise."""
    from ..numerics.jacobian import untimed_mode

    n_in, n_out, _ = _sizes(case)
    untimed = untimed_mode(case.problem, config, n_in, n_out)
    if untimed is not None:
        return untimed, False
    # the timed rows decide: estimated from the probe's forward time, which choose_mode reads
    seconds = case.problem.cache.forward_seconds * (2 * n_in + n_out)
    return ("full" if config.mode == "full" or seconds <= config.full_budget_s else "probe"), True


def _gradient(name: str, case: Case, job: Any, config: Any, runs: Sequence[str],
              recorded: bool, shared: bool) -> PlannedCost:
    """Full mode: two forwards a column (fewer where columns are coloured: at most), a plain
    call per input trusting its batched columns (numerics/steps.py:batched_outputs), one at a
    moved point where the outputs look coarse (numerics/coarse.py), a backward a one-hot row;
    probe mode: its directions and cotangents; and the two rows a timed choice pays. Its
    priming forward is the contract's graph, read, or the probe's, kept."""
    n_in, n_out, _ = _sizes(case)
    mode, timed = _gradient_mode(case, config)
    if mode == "full":
        forward, backward = 2 * n_in + len(case.problem.inputs) + 1, n_out
    else:
        from ..checks._common import probe_evaluations

        forward, backward = probe_evaluations(config)
    return PlannedCost(name, mode, forward, backward + 2 * timed, int(recorded), 0, AT_MOST,
                       "the contract's graph" if recorded else "")


def _double_backward(name: str, case: Case, job: Any, config: Any, runs: Sequence[str],
                     recorded: bool, shared: bool) -> PlannedCost:
    """G(x, v) = vᵀ∂f/∂x in full mode: at most two evaluations of G a column (x's and v's;
    G is linear in v and its rows may be the gradient check's: fewer), one more at the point,
    a backward per row of G (x's elements) and one per batched input trusted against a plain
    call; --mode probe: its probes. A Jacobian past the small rule is not planned (its mode is
    timed)."""
    from ..numerics.jacobian import SMALL

    from ..checks._common import probe_evaluations

    n_in, n_out, _ = _sizes(case)
    tensors = len(case.problem.inputs) + len(case.problem.facts.output_shapes)
    if config.mode == "probe":  # G probed as the gradient check probes f
        return PlannedCost(name, "probe", *probe_evaluations(config), 0, 0, AT_MOST)
    if n_in * (n_in + n_out) > SMALL:
        return PlannedCost(name)
    # G's columns along v are the gradient check's rows where it ran before in full mode
    # (Problem.known, read by numerics/columns.py): none evaluated beyond f(x)
    first = [n for n in runs[:list(runs).index(name)]
             if _COUNTERS.get(registry.BY_NAME[n].import_path) is _gradient]
    rows = bool(first) and _float64(case) and _gradient_mode(
        case, _config(job, first[0])) == ("full", False)
    along_v = 0 if rows else 2 * n_out
    return PlannedCost(name, "full", 2 * n_in + along_v + tensors + 1, n_in + 2 * tensors, 0,
                       0, AT_MOST)


def _layout(name: str, case: Case, job: Any, config: Any, runs: Sequence[str],
            recorded: bool, shared: bool) -> PlannedCost:
    """The contiguous baseline (the contract's graph and backward, read, or a forward and a
    backward paid), then layout_variants.evaluations on empty tensors of the outputs' shapes."""
    import torch

    from ..checks.layout import movable
    from ..checks.layout_variants import GRAD_VARIANTS, INPUT_VARIANTS, evaluations

    outs = [_empty(torch, shape, getattr(torch, dtype), tracked)
            for shape, dtype, tracked in case.problem.facts.output_shapes]
    grads = [torch.empty_like(o) for o in outs]
    grads_only = evaluations(case.problem, outs, grads, False, GRAD_VARIANTS, (), ())
    inputs = (evaluations(case.problem, outs, grads, False, (), INPUT_VARIANTS, movable(case))
              // 2)  # a forward and a backward per input layout that applies
    base = 0 if recorded else 1
    return PlannedCost(name, "", base + inputs, base + grads_only + inputs, 1 - base, 1 - base,
                       EXACT, "the contract's graph" if recorded else "")


def _empty(torch: Any, shape: tuple[int, ...], dtype: Any, tracked: bool) -> Any:
    """An output of this shape and dtype, uninitialised (a layout is built, never evaluated).
    Not on the meta device: its ops run torch's Python references, which import sympy (~1 s
    cold), and the layout check allocates these outputs anyway. On the CPU whatever the
    case's device: nothing runs on it, and untouched pages cost no memory."""
    out = torch.empty(shape, dtype=dtype, device="cpu")
    return out.requires_grad_() if tracked and (out.is_floating_point() or out.is_complex()) \
        else out


# Each planned check's counter, by its module (a name is the registry's to compare).
_COUNTERS = {"gradtool.checks.contract": _contract, "gradtool.checks.gradient": _gradient,
             "gradtool.checks.double_backward": _double_backward,
             "gradtool.checks.layout": _layout}


def announce(job: Any, case: Case, spec: Any,
             applicable: Callable[[Any, Any], list[tuple[str, str | None]]],
             when: Mapping[str, Callable[..., bool]]) -> tuple[PlannedCost, ...]:
    """The case's plan, made once it is set up (the runner's call after the probe phase): the
    checks that apply sent to a supervisor (told.report_plan), and their planned evaluations to
    the heartbeat, so the progress line's time left covers the checks still to come (where one
    of them is not planned, the running check's own total only, as before). `applicable` and
    `when`: the runner's gate over the configured checks and its conditions (the runner passes
    them: it imports this module)."""
    from .told import report_plan

    try:
        pairs: list[tuple[str, str | None]] | None = applicable(job, case)
    except (Exception, SystemExit):  # noqa: BLE001 - applies() ran user code that failed:
        pairs = None  # the checks report it; nothing is planned
    if pairs is None:
        report_plan(job, case, spec, None)
        return ()
    report_plan(job, case, spec, [name for name, why in pairs if why is None])
    costs = plan_case(case, job, order([name for name, why in pairs if why is None]), when)
    if costs and all(p.planned for p in costs):
        heartbeat.expect_case({p.check: (p.forward or 0) + (p.backward or 0) for p in costs})
    return costs


def ordered(job: Any) -> Any:
    """The job with its checks in the plan's order (the registry's default run is already)."""
    from dataclasses import replace

    names = order(job.config.checks)
    return job if names == tuple(job.config.checks) else \
        replace(job, config=job.config.with_(checks=names))
