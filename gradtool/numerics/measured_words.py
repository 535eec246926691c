"""What a report says about the measured tolerance: which tolerance judged, what noise keeps
from being seen, and when a gap that small cannot be told from a solver's own tolerance."""

from __future__ import annotations

from typing import Any

import torch

from .compare import BlockTally
from .measured import K, Measurement
from .problem import Problem


# Verdict.cause of a gap inconclusive because forward is a solver: the summary names it, not
# unreliable finite differences (they were measured reliable)
SOLVER_CAUSE = ("backward is beyond the measured finite-difference error but within "
                "gradcheck's tolerance, and forward is a solver (data-dependent control flow)")


def data_dependent(problem: Problem) -> bool:
    """Whether forward reads a tensor's value into Python (.item(), float(), a tensor in an
    if or while: aten._local_scalar_dense), the mark of data-dependent control flow such as
    a solver's stopping test. One more forward, on the failing path only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        seen = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                Watch.seen = True
            return func(*args, **(kwargs or {}))

    try:
        with Watch():
            problem.outputs([v.detach() for v in problem.inputs])
    except Exception:  # noqa: BLE001 - the verdict stands; this only softens a small gap
        return False
    return Watch.seen


def describe(verdict: Any, tallies: list[list[BlockTally]],
             measurement: Measurement | None, problem: Problem | None = None) -> None:
    """The report says which tolerance judged, and where noise limits what can be seen."""
    if (measurement is not None and problem is not None and measurement.measured_only
            and not measurement.fixed_settled and verdict.outcome.value == "failed"
            and data_dependent(problem)):
        # A forward with data-dependent control flow (a solver's stopping test) is often only
        # as accurate as its tolerance, and its gradient that far from its own finite
        # differences: a gap within gradcheck's tolerance cannot be told from a mistake.
        from ..results import Outcome

        verdict.outcome, verdict.cause = Outcome.INCONCLUSIVE, SOLVER_CAUSE
        verdict.details.append(
            "inconclusive: backward is beyond the measured finite-difference error but within "
            "gradcheck's fixed tolerance, and forward has data-dependent control flow (it reads "
            "tensor values into Python: a solver's stopping test?), whose result is only as "
            "accurate as its "
            "tolerance: errors this small cannot be told from that here; set --atol/--rtol to "
            "judge it by a fixed tolerance")
    if measurement is None:
        first = tallies[0][0] if tallies and tallies[0] else None
        measurement = Measurement(first.atol if first else 0.0, first.rtol if first else 0.0)
    found = measurement
    verdict.details.append(found.describe())
    if found.sampled:
        floor, rel = found.sample_tolerance
        verdict.details.append(
            f"{found.sampled} more element(s) beyond the first bound judged by the error "
            f"measured in one column, {floor:.2g} + {rel:.2g} |n| besides their own rounding "
            "(their columns not evaluated again: the verdict already stood)")
    if found.unmeasured:
        verdict.details.append(f"{found.unmeasured} more element(s) beyond the first bound "
                               "could not be measured (too many columns, or no exact value) "
                               "and are counted as mismatches")
    limit = found.limit()
    if limit:
        verdict.details.append(limit)
        verdict.limit = limit
    if found.fixed_settled and not found.measured:  # judged by gradcheck's, as it says
        verdict.tolerance = {"atol": found.fixed[0], "rtol": found.fixed[1]}
        return
    verdict.tolerance = {"atol": found.first_atol, "rtol": found.first_rtol,
                         "measured_k": K, "measured_error": found.max_tolerance}


def describe_probe(verdict: Any, tally: BlockTally) -> None:
    """Probe mode's tolerance is measured too (between steps h and 2h): the same words."""
    verdict.details.append(
        f"tolerance measured: each probe within {K:g} x the finite-difference error measured "
        f"between steps h and 2h, plus rounding (floor {tally.atol:.2g})")
    verdict.tolerance = {"atol": tally.atol, "rtol": tally.rtol, "measured_k": K}
