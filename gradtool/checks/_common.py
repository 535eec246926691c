"""Shared pieces of the checks: turning a user exception into an error result, call counts."""

from __future__ import annotations

import time

from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from ..targets.load import Target
from ..tracebacks import gradtool_frame, innermost_user_frame, raised_in_gradtool, trim


def calls_since(problem: Problem, before: dict[str, int]) -> dict[str, int]:
    """Forward/backward calls made since `before` was taken from problem.calls."""
    return {k: v - before.get(k, 0) for k, v in problem.calls.items() if v - before.get(k, 0)}


def error_result(name: str, exc: BaseException, target: Target, start: float,
                 problem: Problem, before: dict[str, int]) -> CheckResult:
    """An exception raised inside the user's code is an `error` outcome, not a crash; one
    raised by gradtool's own code is an InternalError (exit 3), never blamed on the user."""
    if isinstance(exc, InternalError):
        raise exc
    if raised_in_gradtool(exc):
        raise InternalError(exc, gradtool_frame(exc)) from exc
    where = innermost_user_frame(exc) or target.source
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return CheckResult(
        name, Outcome.ERROR, f"{type(exc).__name__} raised: {first}"[:300],
        source=where, traceback=trim(exc), calls=calls_since(problem, before),
        duration_s=time.perf_counter() - start)
