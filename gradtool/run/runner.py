"""Orchestration: targets and specs -> jobs -> cases -> checks -> Report. Never prints."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import CheckConfig
from .. import heartbeat
from ..errors import GradtoolError
from ..results import CaseResult, CheckResult, Outcome, Rejected, Report, TargetResult
from ..targets.inputs import InputSpec
from ..targets.load import Target

Progress = Callable[[str], None]


@dataclass
class CaseSpec:
    """What to sample for one case: explicit inputs (None = infer) and a seed."""

    label: str
    inputs: list[InputSpec] | None
    seed: int


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
        progress: Progress | None = None) -> Report:
    """Run every job; a failure in one never stops the others."""
    check_devices(jobs, config)
    start = time.perf_counter()
    results = []
    more_rejected = list(rejected)
    for job in jobs:
        if progress:
            progress(job.target.name)
        result = run_one(job)
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
    cases = []
    for spec in job.cases:
        cases.append(_run_case_with_resample(job, spec))
    t = job.target
    return TargetResult(t.name, t.kind, t.qualname, t.source, tuple(cases), job.spec)


def _run_case_with_resample(job: Job, spec: CaseSpec) -> CaseResult:
    result = run_case(job, spec)
    tries = 0
    seed = spec.seed
    while tries < job.config.resample and _inconclusive(result):
        tries += 1
        seed = spec.seed + 1000 * tries
        retry = run_case(job, CaseSpec(f"{spec.label} (resampled)", spec.inputs, seed))
        note = (f"seed {spec.seed} was inconclusive (non-differentiable point); "
                f"resampled with seed {seed}")
        result = CaseResult(retry.label, retry.seed, retry.inputs, retry.checks, retry.inferred,
                            (*retry.notes, note), retry.reproduce)
    return result


def _inconclusive(result: CaseResult) -> bool:
    return any(c.outcome is Outcome.INCONCLUSIVE for c in result.checks)


def case_for(job: Job, spec: CaseSpec) -> Any:
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
    config = job.config
    heartbeat.enter(target=job.target.name, case=spec.label, check="")
    case = case_for(job, spec)
    reproduce = job.reproduce or reproduce_command(job.target, case.specs, config, spec.seed)
    checks = [_run_check(name, case, job) for name in config.checks]
    notes = list(case.notes)
    if case.problem.freeze_seed is not None:
        notes.append("forward is stochastic: RNG frozen (re-seeded) around every evaluation")
    return CaseResult(case.label, spec.seed, tuple(case.infos), tuple(checks), case.inferred,
                      tuple(dict.fromkeys(notes)), reproduce, pin_flags(case.specs, config))


def _run_check(name: str, case: Any, job: Job) -> CheckResult:
    from ..checks._common import error_result
    from ..checks.contract import check_contract
    from ..checks.double_backward import check_double_backward
    from ..checks.gradient import check_gradient

    config = job.config.with_(**job.check_config.get(name, {}))
    start, before = time.perf_counter(), dict(case.problem.calls)
    heartbeat.enter(check=name)
    try:
        if name == "contract":
            result = check_contract(case, job.target, config)
        elif name == "gradient":
            reference = _reference(job, case) if job.surrogate is not None else None
            described = job.surrogate.describe() if job.surrogate is not None else None
            result = check_gradient(case, job.target, config, reference, described)
            if job.target.kind in ("module", "callable") and described is None:
                from .culprit import annotate  # on a failure only: each custom Function alone

                result = annotate(result, case.problem, config)
        else:
            result = check_double_backward(case, job.target, config)
    except GradtoolError:
        raise
    # User code raising where a check did not expect it is still a result; so is its sys.exit().
    except (Exception, SystemExit) as exc:
        result = error_result(name, exc, job.target, start, case.problem, before)
    return _apply_xfail(result, job.xfail.get(name))


def _apply_xfail(result: CheckResult, reason: str | None) -> CheckResult:
    if reason is None:
        return result
    from dataclasses import replace

    if result.outcome in (Outcome.FAILED, Outcome.ERROR):
        return replace(result, outcome=Outcome.XFAILED, expected_failure=reason)
    if result.outcome is Outcome.PASSED:
        return replace(result, outcome=Outcome.XPASSED, expected_failure=reason,
                       summary=f"declared expected to fail ({reason}) but passed: "
                               "remove the expected failure from the spec")
    return result


def _reference(job: Job, case: Any) -> Callable[[Any], Any]:
    """Rows of the surrogate's intended Jacobian, in the same layout as the analytical rows."""
    import torch

    from ..numerics.problem import flat_cat, split_flat

    problem = case.problem

    def rows(grad_rows: torch.Tensor) -> torch.Tensor:
        outs = problem.outputs(problem.inputs)
        out = []
        for row in grad_rows:
            grads = split_flat(row, [o.shape for o in outs])
            intended = job.surrogate.vjp(problem.args, grads)
            picked = [intended[p] if p < len(intended) and intended[p] is not None
                      else torch.zeros_like(problem.args[p]) for p in problem.diff]
            out.append(flat_cat(picked))
        return torch.stack(out)

    return rows


def pin_flags(specs: Sequence[InputSpec], config: CheckConfig) -> str:
    """'-i 3x4 -i 2.5': the flags that give these inputs explicitly."""
    return " ".join(f"-i {_quote(_cli_input(spec, config))}" for spec in specs)


def reproduce_command(target: Target, specs: Sequence[InputSpec], config: CheckConfig,
                      seed: int) -> str:
    """The one-line command that re-runs this case exactly."""
    parts = ["gradtool", "check", _quote(target.name)]
    if specs:
        parts.append(pin_flags(specs, config))
    parts += ["--seed", str(seed)]
    defaults = CheckConfig()
    for name in ("dtype", "eps", "atol", "rtol", "nondet_tol", "mode"):
        value = getattr(config, name)
        if value is not None and value != getattr(defaults, name):
            parts += [f"--{name.replace('_', '-')}", str(value)]
    return " ".join(parts)


def _cli_input(spec: InputSpec, config: CheckConfig) -> str:
    from ..targets.inputs import LiteralSpec

    if isinstance(spec, LiteralSpec):
        text = repr(spec.value)
        return text if not text.startswith("(") else "=" + text
    return spec.describe(config.dtype).replace(f":{config.dtype}", "", 1) \
        if spec.dtype is None else spec.describe(config.dtype)


def _quote(text: str) -> str:
    """Shell-quote readably: bare when safe, else single quotes, else double quotes."""
    import shlex

    if shlex.quote(text) == text:
        return text
    if "'" not in text:
        return f"'{text}'"
    if not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def versions() -> dict[str, str]:
    import numpy
    import torch

    from .._version import __version__

    # str(): torch.__version__ is a TorchVersion, whose unpickling would import torch.
    return {"gradtool": __version__, "torch": str(torch.__version__), "numpy": numpy.__version__,
            "python": platform.python_version()}


