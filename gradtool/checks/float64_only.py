"""Checks of finite differences below float64, run on the same target in float64 instead."""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable
from typing import Any

from ..results import CheckResult, Outcome
from ..targets.cases import Case
from ..tracebacks import raised_in_gradtool
from ._common import Context


def judged_in_float64(check: Callable[[Case, Context], CheckResult], case: Case,
                      context: Context) -> CheckResult:
    """`check` (double backward, the complex check) on the same target in float64.

    Finite differences in float16 or bfloat16 resolve nothing (the step that beats truncation
    drowns in rounding), and the low-precision judge of the gradient check compares a kernel
    with float64 values, not with differences. So what only finite differences can check is
    checked where they can: the same target in float64, said so plainly. A target that cannot
    run in float64 (a --reference kernel) is checked in its own dtype, as before."""
    from .precision import low_precision, reference_problem

    problem, config = case.problem, context.config
    dtype = low_precision(problem, config)
    ref = reference_problem(case, context.target, config, None)
    config64 = config.with_(dtype="float64", autocast=None)
    try:
        result = check(replace(case, problem=ref), replace(context, config=config64))
    except Exception as exc:  # the user's code refused float64 (gradtool's own bug: raised)
        if raised_in_gradtool(exc):
            raise
        result = None
    if result is None or result.outcome is Outcome.ERROR:  # in its own dtype then
        return check(case, context)
    problem.calls.update({f"float64 {k}": v for k, v in ref.calls.items()})
    return _said(result, dtype, {f"float64 {k}": v for k, v in result.calls.items()})


def _said(result: CheckResult, dtype: Any, calls: dict[str, int]) -> CheckResult:
    """The float64 verdict, saying where it was reached."""
    where = (f"checked in float64 only: the same target in float64 (finite differences in "
             f"{dtype} cannot resolve what this check compares)")
    return replace(result, summary=f"{result.summary} ({where})" if result.outcome is
                   Outcome.SKIPPED else f"in float64: {result.summary}",
                   details=(*result.details, where), calls=calls,
                   mode=f"float64 {result.mode}" if result.mode else result.mode)
