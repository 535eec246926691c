"""Orchestration: targets and specs -> jobs -> cases -> checks -> Report. Never prints."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..config.settings import CheckConfig
from .. import heartbeat
from ..errors import GradtoolError, InternalError
from ..results import (CaseResult, CheckResult, Finding, Outcome, Rejected, Report, Severity,
                       TargetResult, headline)
from ..targets.inputs import InputSpec
from ..targets.load import Target
from .approximate import approximate_noted
from .reproduce import (REPLAY_VALUES, has_given_values, left_unchecked, pin_flags,
                        reproduce_for)
from .plan import announce, ordered
from .told import error_id, kept_notes, repeats_told

if TYPE_CHECKING:  # the runner imports torch only when it runs
    from ..checks._common import Context
    from ..numerics.problem import Problem
    from ..targets.cases import Case

Progress = Callable[[str], None]


@dataclass
class CaseSpec:
    """What to sample for one case: explicit inputs (None = infer) and a seed."""

    label: str
    inputs: list[InputSpec] | None
    seed: int
    origin: str | None = None  # where given values came from (--inputs-from), to reproduce them


@dataclass
class Job:
    """One target with its cases and settings, from the command line or a spec."""

    target: Target
    cases: list[CaseSpec]
    config: CheckConfig
    check_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    xfail: dict[str, str] = field(default_factory=dict)
    surrogate: Any = None
    spec: str | None = None
    reproduce: str | None = None


def run(jobs: Sequence[Job], config: CheckConfig, rejected: Sequence[Rejected] = (),
        progress: Progress | None = None, start: float | None = None) -> Report:
    """Run every job (one failing never stops the others); duration from `start`, else now."""
    start = time.perf_counter() if start is None else start
    check_devices(jobs, config)
    results = []
    more_rejected = list(rejected)
    for k, job in enumerate(jobs):
        if progress:
            progress(job.target.name)
        try:
            result = run_one(job)
        except KeyboardInterrupt:  # Ctrl-C in-process (--no-isolate): what finished still counts
            return Report(tuple(results), config.effective, versions(), tuple(more_rejected),
                          time.perf_counter() - start,
                          not_run=tuple(j.target.name for j in jobs[k:]), interrupted=True)
        (results if isinstance(result, TargetResult) else more_rejected).append(result)
    return Report(tuple(results), config.effective, versions(), tuple(more_rejected),
                  time.perf_counter() - start)


def check_devices(jobs: Sequence[Job], config: CheckConfig | None = None) -> None:
    """An unusable device is a usage error before anything runs."""
    from ..targets.cases import check_device

    for device in {job.config.device for job in jobs} | ({config.device} if config else set()):
        check_device(device)


def run_one(job: Job) -> TargetResult | Rejected:
    """One job's result, or its rejection (e.g. a module class that cannot be constructed)."""
    try:
        return run_job(job)
    except GradtoolError as exc:
        return Rejected(job.target.name, str(exc))


def run_job(job: Job) -> TargetResult:
    cases = [_run_case_with_resample(ordered(job), spec) for spec in job.cases]  # plan.py's
    t = job.target
    return TargetResult(t.name, str(t.kind), t.qualname, t.source, tuple(cases), job.spec)


def _run_case_with_resample(job: Job, spec: CaseSpec) -> CaseResult:
    result = run_case(job, spec)
    tries = 0
    seed = spec.seed
    while tries < job.config.resample and _inconclusive(result):
        tries += 1
        seed = spec.seed + 1000 * tries
        retry = run_case(job, CaseSpec(f"{spec.label} (resampled)", spec.inputs, seed,
                                       spec.origin))
        note = (f"seed {spec.seed} was inconclusive (non-differentiable point); "
                f"resampled with seed {seed}")
        # The inconclusive sample's whole time is the retry's setup: nothing of it is reported.
        spent = result.setup_s + sum(c.duration_s for c in result.checks)
        result = replace(retry, notes=(*retry.notes, note), pin="",
                         setup_s=retry.setup_s + spent)
    return result


def _inconclusive(result: CaseResult) -> bool:
    return any(c.outcome is Outcome.INCONCLUSIVE for c in result.checks)


def case_for(job: Job, spec: CaseSpec) -> Case:
    """The sampled Case: given inputs, or inferred ones."""
    from ..targets.cases import build_case
    from ..targets.infer import infer_case

    if spec.inputs is None:
        case = infer_case(job.target, job.config, spec.seed)
        case.label = spec.label
        return case
    return build_case(job.target, spec.inputs, job.config, spec.seed, spec.label)


def run_case(job: Job, spec: CaseSpec) -> CaseResult:
    """Sample one case and run every configured check on it."""
    from ..targets.cases import setup_errors

    config, begun = job.config, time.perf_counter()
    heartbeat.enter(target=job.target.name, case=spec.label, check="")
    with setup_errors():  # gradtool's own error building a case is an InternalError
        case = case_for(job, spec)
        _probe(case, config)
        reproduce = reproduce_for(job, case.specs, spec.seed, spec.origin)
        plan = announce(job, case, spec, applicable, WHEN)  # every check's evaluations
    # The default run reports the faces a target has; a check asked for by name that does not
    # apply is reported skipped, with the reason.
    checks: list[CheckResult] = []
    errors: list[tuple[str | None, str | None]] = []  # each result's error identity, as raised
    setup = time.perf_counter() - begun  # sampling and the probe phase: told as the case's
    from ..checks.linear_rows import rows_pair

    pair = rows_pair(config.checks)  # the contract's linearity test waits for these rows
    case.problem.cache.defer_linearity = bool(pair)
    for name in config.checks:
        checks = _settled(case, checks, job) if pair and name not in pair else checks
        # Everything done on the check's behalf is its time: the hooks' culprit search, the
        # diagnosis, telling a repeated error once.
        start, reads = time.perf_counter(), case.problem.cache.ledger.snapshot()
        costly = for_cost(name, case, checks, job)
        result = _skipped(name, costly) if costly else _run_check(name, case, job)
        if result is None:  # left out of the default run: asking why is setup
            setup += time.perf_counter() - start
            continue
        errors.append(error_id(result))
        result = _once(case.problem.cache.ledger.told(result, reads), checks, case.problem)
        checks.append(replace(result, duration_s=time.perf_counter() - start))
        heartbeat.report("check", case=spec.label, result=checks[-1])
    begun, checks = time.perf_counter(), _settled(case, checks, job)
    checks = approximate_noted(repeats_told(checks, errors))
    if job.target.kind.composite and case.problem.cache.first_order is Outcome.PASSED:
        from .inner import inner_algebra_waived

        checks = [inner_algebra_waived(c) for c in checks]
    notes = kept_notes(case, checks)
    if case.alternative is not None:
        notes.append("0-d inputs ran forward and backward where these did not; if the target "
                     f"takes only scalars, pin them: {pin_flags(case.alternative, config)}")
    unchecked = left_unchecked(case.specs, [info.name for info in case.infos])  # trace's too
    notes += [unchecked] if unchecked and has_given_values(case.specs) else []
    if has_given_values(case.specs) and not spec.origin and any(
            c.outcome not in (Outcome.PASSED, Outcome.SKIPPED) for c in checks):
        # only where a check did not pass: a passing report has nothing to replay (and
        # --save-inputs, the CLI's option for sampled inputs, is no way from Python)
        notes.append(f"inputs given as values: to replay them, {REPLAY_VALUES}")
    if case.facts.stochastic:
        notes.append("forward is stochastic: RNG frozen (re-seeded) around every evaluation")
    pin = "" if has_given_values(case.specs) else pin_flags(case.specs, config)
    setup += time.perf_counter() - begun
    return CaseResult(case.label, spec.seed, tuple(case.infos), tuple(checks), case.inferred,
                      tuple(dict.fromkeys(notes)), reproduce, pin, setup, plan)


def _probe(case: Case, config: CheckConfig) -> None:
    """The probe phase: the case's facts, learnt once before any check (targets/probe.py)."""
    from ..config.registry import BY_NAME
    from ..targets.probe import probe

    heartbeat.enter(check=config.checks[0] if config.checks else "")  # a stop: told under it,
    heartbeat.expect(2)  # as n of the probe's two forwards (a stochastic one's more)
    probe(case, keep_graph=any(BY_NAME[name].probe_graph for name in config.checks),
          config=config)


# The cost model: a forward this slow (the probe timed it) makes every evaluation count.
EXPENSIVE_S = 0.1


def for_cost(name: str, case: Any, earlier: Sequence[CheckResult], job: Job) -> str | None:
    """Why the default run skips this check for cost, or None: on an expensive forward, a
    check registered to wait for another (`CheckInfo.waits_for`: layouts, a backward known
    wrong compared with itself) waits for its fix once that one failed; a check asked for by
    name, or under --exhaustive, always runs."""
    from ..config.registry import BY_NAME, DEFAULT_CHECKS

    seconds, first = case.facts.forward_seconds, BY_NAME[name].waits_for
    if (first is None or job.config.checks != DEFAULT_CHECKS or job.config.exhaustive
            or seconds is None or seconds < EXPENSIVE_S):
        return None
    if not any(c.name == first and c.outcome is Outcome.FAILED for c in earlier):
        return None
    return (f"skipped for cost: each forward takes {seconds:.2g} s and the {first} check "
            f"failed (backward is already wrong); --check {name} runs it, and so does "
            "--exhaustive")


def _settled(case: Case, checks: list[CheckResult], job: Job) -> list[CheckResult]:
    """The contract's linearity test, once the gradient check's rows are there."""
    from ..checks.linear_rows import settled

    seconds = case.facts.forward_seconds
    return checks if case.problem.cache.pending_linearity is None else settled(
        case.problem, checks, job.config, job.target, (seconds or 0.0) >= EXPENSIVE_S)


def _skipped(name: str, reason: str) -> CheckResult:
    from ..checks._common import skipped

    return skipped(name, reason)


def _once(result: CheckResult, earlier: Sequence[CheckResult], problem: Problem) -> CheckResult:
    """A forward that fails is reported under the first check only, not under every one."""
    if result.outcome is not Outcome.ERROR:
        return result
    rejected = _engine_rejects(earlier)
    if rejected and result.exception == ENGINE_REJECTS:
        return CheckResult(result.name, Outcome.SKIPPED,
                           f"not run: the autograd engine rejects backward's gradient, as the "
                           f"{rejected.rule} finding under contract says", source=result.source)
    same = next((c for c in earlier if c.outcome is Outcome.ERROR
                 and error_id(c) == error_id(result)), None)
    if same is None:
        return result
    if _forward_runs(problem):  # backward raises the same way under each check: told once
        return replace(result, summary=f"the same error as under {same.name} ({same.summary})"
                       [:300], details=(), traceback=None)
    return CheckResult(result.name, Outcome.SKIPPED,
                       f"not run: the same error as under {same.name} ({same.summary})"[:300])


# What torch's engine raises when it refuses what backward returned: once the contract has found
# such a gradient (REFUSED_RULES), every later check's backward meets this error.
ENGINE_REJECTS = "builtins.RuntimeError"
# The contract rules whose gradients the engine refuses outright: every later check would only
# repeat the engine's error.
REFUSED_RULES = ("contract.gradient_count", "contract.gradient_shape", "contract.gradient_type",
                 "contract.gradient_for_non_tensor", "contract.gradient_device")


def _engine_rejects(earlier: Sequence[CheckResult]) -> Finding | None:
    """The contract's finding that backward returns a gradient the engine refuses, if any."""
    return next((f for c in earlier for f in c.findings if f.rule in REFUSED_RULES), None)


def _forward_runs(problem: Problem) -> bool:
    try:
        problem.outputs(problem.inputs)
    except (Exception, SystemExit):  # noqa: BLE001 - the user's forward failing is what is asked
        return False
    return True


def _run_check(name: str, case: Case, job: Job) -> CheckResult | None:
    """Dispatch through the registry: a check that does not apply is skipped with the reason
    when it was asked for, and left out (None) of the default run."""
    from ..checks._common import error_result, skipped
    from ..config.registry import DEFAULT_CHECKS

    config = job.config.with_(**job.check_config.get(name, {}))
    start, before = time.perf_counter(), dict(case.problem.calls)
    heartbeat.enter(check=name)
    try:
        check = _variant(name, case, job, config)
        context = _context(job, config)
        reason, blocked = gate(name, check, case, context)
        if blocked:  # e.g. an op with no autograd: one finding, not N errors
            return skipped(name, reason)
        if reason and job.config.checks == DEFAULT_CHECKS:
            return None
        result = skipped(name, reason) if reason else _hooked(name, check.run(case, context),
                                                              case, job, config)
    except (GradtoolError, InternalError):
        raise
    # User code raising where a check did not expect it is still a result; so is its sys.exit().
    except (Exception, SystemExit) as exc:
        result = error_result(name, exc, job.target, start, case.problem, before)
    return _apply_xfail(silence(result, config.ignore), job.xfail.get(name))


def silence(result: CheckResult, ignore: Sequence[str]) -> CheckResult:
    """Drop the findings whose rule the configuration ignores (any check's); a check failed only
    by such findings (no block mismatched) passes, and says what was ignored."""
    silenced = sorted({f.rule for f in result.findings if f.rule in ignore})
    if not silenced:
        return result
    kept = tuple(f for f in result.findings if f.rule not in ignore)
    note = f"ignored by configuration: {', '.join(silenced)}"
    failures = [f for f in kept if f.severity is Severity.FAILURE]
    if result.outcome is Outcome.FAILED and not failures and not any(b.mismatched
                                                                     for b in result.blocks):
        return replace(result, outcome=Outcome.PASSED, findings=kept, details=(note,),
                       summary=f"passed once the ignored rules are left out ({note})")
    # A check without blocks says its first failure in its summary: say the first one kept.
    first = headline(result.findings)
    summary = failures[0].message if failures and not result.blocks and first is not None \
        and first.rule in ignore else result.summary
    return replace(result, findings=kept, summary=summary, details=(*result.details, note))


def _variant(name: str, case: Case, job: Job, config: CheckConfig) -> Any:
    """The check's module, or the registry's variant for this case (low precision's judge)."""
    from importlib import import_module

    from ..checks._common import load
    from ..config.registry import BY_NAME

    for when, module in BY_NAME[name].variants:
        if WHEN[when](case, job, config):
            return import_module(f"gradtool.checks.{module}")
    return load(name)


def _hooked(name: str, result: CheckResult, case: Case, job: Job,
            config: CheckConfig) -> CheckResult:
    """The result through the registry's hooks for this case (inner Functions' contracts)."""
    from importlib import import_module

    from ..config.registry import BY_NAME

    for when, path in BY_NAME[name].hooks:
        if WHEN[when](case, job, config):
            module, function = path.split(":")
            result = getattr(import_module(module), function)(result, case.problem, config,
                                                               job.target)
    return result


def _low_precision(case: Case, job: Job, config: CheckConfig) -> bool:
    """Below float64 (and no surrogate): judged against a float64 reference."""
    from ..checks.precision import low_precision

    return job.surrogate is None and low_precision(case.problem, config) is not None


def _composite(case: Case, job: Job, config: CheckConfig) -> bool:
    """A module or callable: custom Functions inside are checked alone too."""
    return job.target.kind.composite


# The conditions a registry entry may name for its variants and hooks.
def _has_ops(case: Case, job: Job, config: CheckConfig) -> bool:
    """An op, or a model that may call custom ops inside."""
    return job.target.kind.op or job.target.kind.composite


WHEN: dict[str, Callable[[Case, Job, CheckConfig], bool]] = {
    "low_precision": _low_precision, "composite": _composite, "has_ops": _has_ops}


def gate(name: str, check: Any, case: Case, context: Context) -> tuple[str | None, bool]:
    """Why a check does not run on this case (None: it runs), and whether it is blocked
    rather than inapplicable: a check not for the target's kind (the registry's `targets`) or one
    whose `applies` says no is left out of the default run; a blocked one (the target's kind
    says it cannot run here: an op without autograd) is always reported skipped."""
    from ..config.registry import BY_NAME

    info, kind = BY_NAME[name], context.target.kind
    reason = kind.applies(info) or (check.applies(case, context)
                                    if hasattr(check, "applies") else None)
    if reason:
        return reason, False
    blocked = kind.blocked(info, case, context)
    return blocked, blocked is not None


def applicable(job: Job, case: Case) -> list[tuple[str, str | None]]:
    """Each configured check with the reason it would be skipped (None: it runs)."""
    from ..checks._common import load

    return [(name, gate(name, load(name), case,
                        _context(job, job.config.with_(**job.check_config.get(name, {}))))[0])
            for name in job.config.checks]


def _context(job: Job, config: CheckConfig) -> Context:
    """The checks' context: a composite's culprit search (each Function alone, first order)
    but gradgradcheck's backward's, whose wrong second derivative it cannot show."""
    from ..checks._common import Context
    s, second = job.surrogate, getattr(job.target.obj, "gradtool_second_order", False)
    annotate = _annotate if job.target.kind.composite and s is None and not second else None
    reference = (lambda case: _reference(job, case)) if s is not None else None
    return Context(job.target, config, reference, s and s.describe(), annotate)


def _annotate(*args: Any, **kwargs: Any) -> CheckResult:
    """run/received.py's annotate, imported on a failure only: each custom Function alone."""
    from .received import annotate
    return annotate(*args, **kwargs)


def _apply_xfail(result: CheckResult, reason: str | None) -> CheckResult:
    if reason is None:
        return result

    if result.outcome in (Outcome.FAILED, Outcome.ERROR):
        return replace(result, outcome=Outcome.XFAILED, expected_failure=reason)
    if result.outcome is Outcome.PASSED:
        return replace(result, outcome=Outcome.XPASSED, expected_failure=reason,
                       summary=f"declared expected to fail ({reason}) but passed: "
                               "remove the expected failure from the spec")
    return result


def _reference(job: Job, case: Case) -> Callable[[Any], Any]:
    """Rows of the surrogate's intended Jacobian, in the same layout as the analytical rows."""
    from ..numerics.problem import vjp_rows

    return vjp_rows(case.problem, job.surrogate.vjp)


def versions() -> dict[str, str]:
    import numpy
    import torch

    from .._version import __version__

    # str(): torch.__version__ is a TorchVersion, whose unpickling would import torch.
    return {"gradtool": __version__, "torch": str(torch.__version__), "numpy": numpy.__version__,
            "python": platform.python_version()}


