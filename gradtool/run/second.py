"""Which custom Function's backward has the wrong derivative, when a model's double backward
fails: the one Function on the failing path named at once, else each one on it checked alone
on the inputs it received."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from .culprit import Application, captured_case, record, unique
from .paths import calls_user_ops, reaches


def annotate_double(result: CheckResult, problem: Problem, config: CheckConfig,
                    target: object = None) -> CheckResult:
    """The failed double backward of a model, pointing at the one Function whose backward's
    derivative is wrong alone (several: ambiguous, the model's line stays); the registry's
    hook of double_backward for composites."""
    if result.outcome is not Outcome.FAILED:
        return result
    try:
        applications, _ = record(problem)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - a diagnosis: the result so far still stands
        return result
    applied = unique(applications)
    suspects = on_failing_path(result, problem, applied)
    if applied and not suspects:
        line = ("no custom Function's backward computes the failing gradients (none reaches "
                "their inputs): the wrong second derivative comes from code between them")
        return replace(result, details=(*result.details, line))
    if len(suspects) == 1 and not suspects[0].hooked and not calls_user_ops(problem):
        return _only(result, suspects[0])
    verdicts = [(app, *_alone(app, config, problem.freeze_seed)) for app in suspects]
    failing = [(app, source, text) for app, outcome, source, text in verdicts
               if outcome is Outcome.FAILED]
    if not verdicts:
        return result
    if len(failing) == 1:
        app, source, text = failing[0]
        return replace(result, details=(*result.details, text), source=source or result.source)
    if failing:
        names = ", ".join(dict.fromkeys(app.cls.__qualname__ for app, _, _ in failing))
        line = (f"the culprit is ambiguous: the backwards of {names} each have a wrong "
                "derivative alone, so no single Function is blamed: look at the model's forward")
        return replace(result, details=(*result.details, *[t for _, _, t in failing], line))
    first = _first_order(suspects, config, problem.freeze_seed)
    if first is not None:
        return replace(result, details=(*result.details, first.summary),
                       source=first.source or result.source)
    line = ("every custom Function's backward differentiates correctly alone on the inputs it "
            "received: the wrong second derivative comes from code between them, or from a "
            "first-order gradient that is wrong too (see the gradient check)")
    return replace(result, details=(*result.details, line))


def _first_order(suspects: list[Application], config: CheckConfig, freeze_seed: int | None
                 ) -> Any:
    """The one suspect whose first-order gradient is wrong alone (a second derivative through
    activations runs a Function's first-order backward: its own double backward can be
    consistent with that wrong backward), as a FunctionFinding; None without exactly one."""
    from .culprit import check_application

    checked = [check_application(app, config, freeze_seed) for app in suspects]
    failing = [f for f in checked if f.outcome is Outcome.FAILED]
    if len(failing) != 1:
        return None
    found = failing[0]
    return replace(found, summary=f"{found.summary}; the model's second derivative runs "
                                  "through this first-order backward")


def on_failing_path(result: CheckResult, problem: Problem,
                    applications: list[Application]) -> list[Application]:
    """The applications whose backward computes a gradient that failed. A block (x, grad of w)
    runs through the nodes that reach w (their backward carries the gradient to w, and its
    derivative is taken) and through those that reach x (their first-order backward carries
    d/dx of the activations w's op reads): a Function reaching neither is off the path. All
    of them when the blocks do not say."""
    names = problem.input_names
    failed = {b.output.removeprefix("grad of ") for b in result.blocks if b.mismatched}
    if not failed or not failed <= set(names):
        return applications
    failed |= {b.input for b in result.blocks if b.mismatched}
    wanted = {k for k, name in enumerate(names) if name in failed}
    return [app for app in applications if reaches(app) & wanted or not app.leaves]


def _only(result: CheckResult, app: Application) -> CheckResult:
    """The one Function on the failing path named without a re-check: nothing to choose."""
    from ..targets.load import source_of

    source: Any = source_of(app.cls.backward)
    where = f" at {app.created_at}" if app.created_at else ""
    text = (f"{app.cls.__qualname__}{where}: its backward's derivative is wrong, the only "
            f"custom Function on the failing path (so not re-checked alone: nothing to choose "
            f"between; backward at {source})")
    return replace(result, details=(*result.details, text), source=source or result.source)


def _alone(app: Application, config: CheckConfig, freeze_seed: int | None
           ) -> tuple[Outcome, str | None, str]:
    """(outcome, backward's file:line, a report line) of one application's double backward."""
    from ..checks.double_backward import check_double_backward  # lazy, like culprit's

    try:
        target, case, own = captured_case(app, config, freeze_seed)
        checked = check_double_backward(case, target, own)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - arguments that no longer bind: no verdict
        return Outcome.ERROR, None, ""
    where = f" at {app.created_at}" if app.created_at else ""
    text = (f"{app.cls.__qualname__}{where}: its backward's derivative is wrong (double "
            f"backward checked alone on the inputs it received; backward at {target.source}): "
            f"{checked.summary}")
    return checked.outcome, target.source, text
