"""The contract of each custom Function inside a model or callable, on the inputs it received."""

from __future__ import annotations

from dataclasses import replace

from ..config.settings import CheckConfig
from ..numerics.problem import Problem
from ..results import CheckResult, Finding, Outcome, Severity
from .culprit import Application, captured_case, record, unique


def with_inner_contracts(result: CheckResult, problem: Problem, config: CheckConfig,
                         target: object = None) -> CheckResult:
    """The composite's contract result, with each inner Function's findings added (a pass
    becomes a failure: a rule broken inside is broken even when the gradients agree; an inner
    warning stays a warning)."""
    if not problem.has_functions:  # learnt by the probe phase: no extra evaluation
        return result
    try:
        applications, _ = record(problem)
    except Exception:  # noqa: BLE001 - the composite's own result already says what failed
        return result
    # Ignored rules are dropped by the runner (run/runner.py:silence), inner ones too.
    found = [f for app in unique(applications)
             for f in _contract_of(app, config, problem.freeze_seed)]
    if _engine_ran(result):
        found = [_rerun_differs(f) if f.rule in ENGINE_CHECKED and
                 f.severity is Severity.FAILURE else f for f in found]
    failures = [f for f in found if f.severity is Severity.FAILURE]
    warnings = [f for f in found if f.severity is Severity.WARNING]
    if not failures:
        return replace(result, findings=(*result.findings, *warnings)) if warnings else result
    if result.outcome is Outcome.PASSED:
        return replace(result, outcome=Outcome.FAILED, summary=failures[0].message,
                       source=failures[0].source, findings=(*failures, *result.findings,
                                                            *warnings))
    return replace(result, findings=(*result.findings, *failures, *warnings))


# Rules autograd's engine enforces on every node it runs: broken in the model's own backward,
# the engine would have raised there.
ENGINE_CHECKED = frozenset({"contract.gradient_count", "contract.gradient_for_non_tensor",
                            "contract.gradient_type", "contract.gradient_shape"})
_NO_BACKWARD = frozenset({"contract.forward_not_tensor", "contract.no_differentiable_output"})


def _engine_ran(result: CheckResult) -> bool:
    """The composite's contract ran its backward through autograd's engine to the end (every
    inner node included): it did not raise, and forward gave it something to differentiate."""
    return result.outcome in (Outcome.PASSED, Outcome.FAILED) and \
        not any(f.rule in _NO_BACKWARD for f in result.findings)


def _rerun_differs(finding: Finding) -> Finding:
    """An engine-checked rule broken on gradtool's re-run only: the real run is the evidence."""
    return Finding("contract.rerun_differs",
                   f"{finding.message} — found only when gradtool re-ran it alone: in the "
                   "model's own run autograd's engine accepted every gradient it returned, so "
                   "the re-run differed from your call (not a finding about your code)",
                   Severity.WARNING, finding.source)


def _contract_of(app: Application, config: CheckConfig, freeze_seed: int | None
                 ) -> list[Finding]:
    """The findings of one application checked alone, each message opening with "Cls at
    file:line (backward at file:line): " and pointing at that backward."""
    from ..checks.contract import check_contract  # lazy, like culprit's gradient check

    try:
        target, case, own = captured_case(app, config, freeze_seed)
        checked = check_contract(case, target, own)
    except Exception as exc:  # noqa: BLE001 - arguments that no longer bind, say
        return [Finding("contract.inner_unchecked", _not_rerun(app, f"{type(exc).__name__}: "
                                                                 f"{exc}"), Severity.WARNING)]
    where = f" at {app.created_at}" if app.created_at else ""
    backward = f" (backward at {target.source})" if target.source else ""
    prefix = f"{app.cls.__qualname__}{where}{backward}"
    if checked.outcome is Outcome.ERROR:
        # The composite's own forward and backward ran: what raised here is the re-run, which
        # says nothing of the user's code (a warning: told, failing only under --strict).
        return [Finding("contract.inner_raised", _not_rerun(app, checked.summary),
                        Severity.WARNING, checked.source or target.source)]
    return [replace(f, message=f"{prefix}: {f.message}",
                    source=f.source or checked.source or target.source,
                    data={**f.data, "function": app.cls.__qualname__})
            for f in checked.findings]


def _not_rerun(app: Application, why: str) -> str:
    where = f" at {app.created_at}" if app.created_at else ""
    return (f"gradtool could not re-run {app.cls.__qualname__}{where} alone to check its "
            f"contract (not a finding about your code): {why}")


def inner_algebra_waived(result: CheckResult) -> CheckResult:
    """A composite whose gradient check passed: the rules about an inner Function's algebra
    (registry `Rule.algebra`) it broke did not make the user's gradient wrong; warnings naming
    the rule and the Function (--strict fails them). Rules about data keep failing."""
    from ..config.registry import RULES

    def waived(f: Finding) -> bool:
        rule = RULES.get(f.rule)
        return (rule is not None and rule.algebra and "function" in f.data
                and f.severity is Severity.FAILURE)

    if not any(waived(f) for f in result.findings):
        return result
    findings = tuple(Finding(f.rule, f"{f.message} — inside, where the gradient you get is "
                             "right (the gradient check passed): a warning", Severity.WARNING,
                             f.source, f.data)
                     if waived(f) else f for f in result.findings)
    failures = [f for f in findings if f.severity is Severity.FAILURE]
    if result.outcome is not Outcome.FAILED or failures or result.blocks:
        return replace(result, findings=findings)
    return replace(result, outcome=Outcome.PASSED, findings=findings,
                   summary="the gradient is right; custom Functions inside break rules about "
                           "backward's algebra (warnings)", source=None)
