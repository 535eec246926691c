"""double_backward below float64: the same target's second derivative checked in float64."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..results import CheckResult, Outcome
from ..targets.cases import Case
from ..tracebacks import raised_in_gradtool
from . import double_backward
from ._common import Context


def run(case: Case, context: Context) -> CheckResult:
    """The registry's variant of double_backward for a target computing below float64.

    Finite differences of a backward in float16 or bfloat16 resolve nothing (the step that
    beats truncation drowns in rounding), and the first-order judge compares a kernel with
    float64 values, not with differences. So the second derivative is checked where it can be:
    the same target in float64, said so plainly. A target that cannot run in float64 (a
    --reference kernel) is checked in its own dtype, as before."""
    from .precision import low_precision, reference_problem

    problem, config = case.problem, context.config
    dtype = low_precision(problem, config)
    ref = reference_problem(problem, context.target, config, None, len(case.specs), case.seed)
    config64 = config.with_(dtype="float64", autocast=None)
    try:
        result = double_backward.run(replace(case, problem=ref),
                                     replace(context, config=config64))
    except Exception as exc:  # the user's code refused float64 (gradtool's own bug: raised)
        if raised_in_gradtool(exc):
            raise
        result = None
    if result is None or result.outcome is Outcome.ERROR:  # in its own dtype then
        return double_backward.run(case, context)
    problem.calls.update({f"float64 {k}": v for k, v in ref.calls.items()})
    return _said(result, dtype, {f"float64 {k}": v for k, v in result.calls.items()})


def _said(result: CheckResult, dtype: Any, calls: dict[str, int]) -> CheckResult:
    """The float64 verdict, saying where it was reached."""
    where = (f"checked in float64 only: the same target in float64 (finite differences in "
             f"{dtype} cannot resolve a second derivative)")
    return replace(result, summary=f"{result.summary} ({where})" if result.outcome is
                   Outcome.SKIPPED else f"in float64: {result.summary}",
                   details=(*result.details, where), calls=calls,
                   mode=f"float64 {result.mode}" if result.mode else result.mode)
