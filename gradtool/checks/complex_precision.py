"""complex below float64: the same target's real and imaginary parts checked in float64."""

from __future__ import annotations

from ..results import CheckResult
from ..targets.cases import Case
from . import complex as complex_check
from ._common import Context
from .float64_only import judged_in_float64

applies = complex_check.applies


def run(case: Case, context: Context) -> CheckResult:
    """The registry's variant of complex for a target computing below float64."""
    return judged_in_float64(complex_check.run, case, context)
