"""Contract of every custom Function inside a module or callable, on the inputs it received."""

from __future__ import annotations

from dataclasses import replace

from ..config.settings import CheckConfig
from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from .culprit import Application, captured_case, record, unique

_NOTE = "forward is stochastic"  # a contract note, not a violation


def with_inner_contracts(result: CheckResult, problem: Problem,
                         config: CheckConfig) -> CheckResult:
    """The composite's contract result, with each inner Function's broken rules added (a pass
    becomes a failure: a rule broken inside is broken even when the gradients agree)."""
    if not problem.has_functions:  # learnt by the contract's own forward: no extra evaluation
        return result
    try:
        applications, _ = record(problem)
    except Exception:  # noqa: BLE001 - the composite's own result already says what failed
        return result
    lines: list[str] = []
    source = None
    for app in unique(applications):
        found, where = _contract_of(app, config, problem.freeze_seed)
        lines += found
        source = source or (where if found else None)
    if not lines:
        return result
    if result.outcome is Outcome.PASSED:
        return replace(result, outcome=Outcome.FAILED, summary=lines[0],
                       details=(*lines[1:], *result.details), source=source)
    return replace(result, details=(*result.details, *lines))


def _contract_of(app: Application, config: CheckConfig, freeze_seed: int | None
                 ) -> tuple[list[str], str | None]:
    """("Cls at file:line: rule" lines, the backward's file:line) for one application."""
    from ..checks.contract import check_contract  # lazy, like culprit's gradient check

    try:
        target, case, own = captured_case(app, config, freeze_seed)
        checked = check_contract(case, target, own)
    except Exception as exc:  # noqa: BLE001 - arguments that no longer bind, say
        return [f"{app.cls.__qualname__} could not be checked alone: {exc}"], None
    if checked.outcome not in (Outcome.FAILED, Outcome.ERROR):
        return [], None
    where = f" at {app.created_at}" if app.created_at else ""
    backward = f" (backward at {target.source})" if target.source else ""
    prefix = f"{app.cls.__qualname__}{where}{backward}"
    rules = [r for r in (checked.summary, *checked.details) if not r.startswith(_NOTE)]
    return [f"{prefix}: {rule}" for rule in rules], checked.source or target.source
