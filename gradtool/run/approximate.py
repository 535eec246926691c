"""An approximate backward said to be one (issue 55): a backward nonlinear in grad_output by
about as much as its gradient's mismatch (an adaptive ODE solver's adjoint, an iterative
method run to a tolerance) is named as an approximation, with its size and how to tighten it.
The verdict stays gradcheck's at the tolerance given: only the words change."""

from __future__ import annotations

from dataclasses import replace

from ..results import CheckResult, Outcome

# "About as much": the nonlinearity within this factor of the gradient's relative mismatch.
FACTOR = 100.0  # the worst element's relative mismatch reads high: near-zero ones
NONLINEAR, MISMATCH = "contract.nonlinear", "gradient.mismatch"  # rule ids (the registry's)


def approximate_noted(checks: list[CheckResult]) -> list[CheckResult]:
    """The failing gradient result with a line naming an approximate backward, where the
    contract found backward nonlinear by about the mismatch's relative size."""
    nonlinear = [f for c in checks for f in c.findings
                 if f.rule == NONLINEAR and f.data.get("relative")]
    if not nonlinear:
        return checks
    return [_noted(c, float(nonlinear[0].data["relative"]))
            if any(f.rule == MISMATCH for f in c.findings) else c for c in checks]


def _noted(check: CheckResult, relative: float) -> CheckResult:
    bad = [b for b in check.blocks if b.mismatched]
    if check.outcome is not Outcome.FAILED or not bad:
        return check
    mismatch = max(b.max_rel_diff for b in bad)
    if not (mismatch > 0 and relative > 0 and 1 / FACTOR <= relative / mismatch <= FACTOR):
        return check
    line = (f"an approximate backward: it is nonlinear in grad_output by {relative:.2g} "
            f"relative (contract.nonlinear), about the size of this mismatch ({mismatch:.2g} "
            "relative) — an adaptive solver's adjoint or an iterative method stops at its "
            "tolerance; tighten it (the solver's rtol/atol, forward and adjoint) and the "
            "mismatch should shrink with it. The verdict is gradcheck's at the tolerance given")
    return replace(check, details=(*check.details, line))
