"""Shared pieces of the checks: turning a user exception into an error result, call counts."""

from __future__ import annotations

import time

from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from ..targets.load import Target
from ..tracebacks import innermost_user_frame, trim


def calls_since(problem: Problem, before: dict[str, int]) -> dict[str, int]:
    """Forward/backward calls made since `before` was taken from problem.calls."""
    return {k: v - before.get(k, 0) for k, v in problem.calls.items() if v - before.get(k, 0)}


def error_result(name: str, exc: BaseException, target: Target, start: float,
                 problem: Problem, before: dict[str, int]) -> CheckResult:
    """An exception raised inside the user's code is an `error` outcome, not a crash."""
    where = innermost_user_frame(exc) or target.source
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return CheckResult(
        name, Outcome.ERROR, f"{type(exc).__name__} raised: {first}"[:300],
        _number_hints(exc, problem),
        source=where, traceback=trim(exc), calls=calls_since(problem, before),
        duration_s=time.perf_counter() - start)


def _number_hints(exc: BaseException, problem: Problem) -> tuple[str, ...]:
    """A bare number given where forward needs a tensor: point at the 1-d form."""
    if not isinstance(exc, TypeError) or "Tensor" not in str(exc):
        return ()
    return tuple(f"input '{name}' is the Python number {value!r}; for a 1-d tensor of {value} "
                 f"elements write -i '({value},)' (in a spec: {{{name}: '({value},)'}})"
                 for name, value in zip(problem.names, problem.args)
                 if isinstance(value, int) and not isinstance(value, bool))
