"""`gradtool list`: what would be checked, with inputs, without running any check."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..config.registry import BY_NAME
from ..config.settings import CheckConfig
from ..errors import GradtoolError
from ..results import Rejected
from ..run.runner import Job, applicable, case_for


def list_lines(jobs: Sequence[Job], rejected: Sequence[Rejected], config: CheckConfig
               ) -> Iterator[str]:
    """One line per target and case; inputs are inferred (forward runs) where not given."""
    for job in jobs:
        origin = f"  (spec {job.spec})" if job.spec else ""
        yield f"{job.target.name}  [{job.target.kind}]{origin}"
        for spec in job.cases:
            yield from _case_lines(job, spec)
    for bad in rejected:
        yield f"REJECTED {bad.source}: {bad.message.splitlines()[0]}"


def rule_lines(config: CheckConfig) -> Iterator[str]:
    """Every registered rule: id, severity (ignored: silenced by configuration), meaning."""
    from ..config.registry import REGISTRY

    rules = [rule for info in REGISTRY for rule in info.rules]
    width = max((len(rule.id) for rule in rules), default=0)
    yield "rules (silence one with ignore: [RULE] in a spec or [tool.gradtool]):"
    for rule in rules:
        severity = "ignored" if rule.id in config.ignore else rule.severity
        yield f"  {rule.id:<{width}}  {severity:<8} {rule.description}"


def _case_lines(job: Job, spec) -> Iterator[str]:
    try:
        case = case_for(job, spec)
    except GradtoolError as exc:
        yield f"  {spec.label}: cannot build inputs: {exc}"
        return
    except Exception as exc:  # the user's forward raised while inferring
        yield f"  {spec.label}: {type(exc).__name__}: {exc}"
        return
    how = "inferred" if case.inferred else "given"
    inputs = ", ".join(f"{i.name} {i.description}" for i in case.infos)
    yield f"  {spec.label} ({how}, seed {spec.seed}): {inputs}"
    yield "    " + _checks_line(job, case)


def _checks_line(job: Job, case) -> str:
    """The checks that would run, and those that would not with why (from the registry)."""
    try:
        plan = applicable(job, case)
    except Exception as exc:  # the user's forward raised deciding whether a face applies
        return f"checks: cannot tell which apply: {type(exc).__name__}: {exc}"
    runs = [name for name, reason in plan if reason is None]
    text = f"checks: {', '.join(runs) or 'none'}"
    cost = _cost(case, runs, job.config.mode)
    by_reason: dict[str, list[str]] = {}  # one reason said once ("op_schema, op_fake: ...")
    for name, reason in plan:
        if reason is not None and not job.target.kind.applies(BY_NAME[name]):
            by_reason.setdefault(reason, []).append(name)
    skipped = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    return text + (f"; not applicable: {'; '.join(skipped)}" if skipped else "") + \
        (f"\n    {cost}" if cost else "")


def _cost(case, checks: list[str], mode: str = "auto") -> str | None:
    """The estimate from one timed forward at the case's inputs (progress.py); list runs no
    backward (user code a check would run), so the backward's time is not counted. In full
    mode the Jacobian's columns count: two forwards each, at most."""
    import time

    from .progress import cost_text

    problem = case.problem
    try:
        start = time.perf_counter()
        problem.outputs(problem.inputs)
        forward = time.perf_counter() - start
    except Exception:  # noqa: BLE001 - the checks will report it; list only estimates
        return None
    full = None
    if mode == "full":
        outs = problem.outputs(problem.inputs)
        n_in = sum(v.numel() for v in problem.inputs)
        n_out = sum(o.numel() for o in outs if hasattr(o, "numel"))
        full = {"gradient": 2 * n_in, "double_backward": 2 * (n_in + n_out)}
    return cost_text({"forward": forward}, checks, full)
