"""The Taylor-remainder verdict, for a low-precision target with no float64 run to compare with."""

from __future__ import annotations

import time

from ..numerics.problem import Problem
from ..numerics.rounding import FINEST_FIRST
from ..numerics.taylor import taylor_test
from ..results import CheckResult, Finding, Outcome
from ..targets.load import Target
from ._common import calls_since, error_result

OUTCOMES = {"passed": Outcome.PASSED, "failed": Outcome.FAILED,
            "inconclusive": Outcome.INCONCLUSIVE}


def taylor_result(problem: Problem, target: Target, seed: int, dtype: str, why: BaseException,
                  start: float, before: dict[str, int]) -> CheckResult:
    """Judge backward by how f(x+hv) - f(x) - h<grad f, v> falls with h, in the target's dtype."""
    try:
        verdict = taylor_test(problem, seed)
    except Exception as exc:  # the user's forward or backward raised
        return error_result("gradient", exc, target, start, problem, before)
    outcome = OUTCOMES[verdict.outcome]
    reason = (f"no float64 reference: the target raised {type(why).__name__} in float64 "
              "(give one with --reference module:fn)")
    if outcome is Outcome.PASSED:
        summary = "Taylor remainder falls as h^2: backward's directional derivative is right"
    elif outcome is Outcome.FAILED:
        summary = (f"Taylor remainder falls only as h: backward's directional derivative is off "
                   f"by about {verdict.slope_error:.3g}")
    else:
        finer = FINEST_FIRST[max(FINEST_FIRST.index(dtype) - 1, 0)]
        summary = (f"{dtype} rounding dominates the Taylor remainder at every step h: no "
                   f"verdict; {finer} (or a float64 reference) would resolve it")
    findings = (Finding("gradient.taylor", summary,
                        data={"slope_error": float(verdict.slope_error or 0.0)}),
                ) if outcome is Outcome.FAILED else ()
    return CheckResult("gradient", outcome, summary, (verdict.describe(), reason),
                       mode="taylor", mode_reason=reason, calls=calls_since(problem, before),
                       duration_s=time.perf_counter() - start,
                       source=target.source if outcome is not Outcome.PASSED else None,
                       findings=findings)
