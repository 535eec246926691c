"""double_backward below float64: the same target's second derivative checked in float64."""

from __future__ import annotations

from ..results import CheckResult
from ..targets.cases import Case
from . import double_backward
from ._common import Context
from .float64_only import judged_in_float64


def run(case: Case, context: Context) -> CheckResult:
    """The registry's variant of double_backward for a target computing below float64."""
    return judged_in_float64(double_backward.run, case, context)
