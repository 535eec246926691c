"""One custom Function's gradient checked alone, for a culprit search, at the least cost that
settles it: a probe first where full mode is over budget, the full check otherwise."""

# The culprit search asks one question of each Function: wrong alone, or not? Where full
# mode is affordable it answers with the inputs and the kind of mistake. Where it is not (an
# adjoint SDE solve alone: 39 inputs, 30 outputs, a backward a solve), the gradient check
# would probe, see the probe fail, and then sweep every column to locate the elements the
# model's own blocks have located already: 86 forwards and 34 backwards for 4 and 4. A failing
# probe (vᵀ(J u) by finite differences against (vᵀJ) u by the Function's backward) answers
# "wrong" by itself where no inconclusive cause can explain it (_settled: a gap of a tenth of
# the value, the estimates at two steps agreeing a hundred times better: not a forward
# computed to a tolerance, not a kink); any other outcome leaves the question to the whole
# check, which judges kinks and tolerances as it always does, so nothing is missed and
# nothing correct is blamed.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..results import CheckResult, Outcome
from ..targets.cases import Case
from ..targets.load import Target


@dataclass(frozen=True)
class FunctionFinding:
    """The verdict on one custom Function application, checked alone on the inputs it received."""

    qualname: str
    source: str | None        # file:line of the Function's backward
    created_at: str | None    # file:line of the forward line that applied it (user frame)
    outcome: Outcome          # passed / failed / inconclusive / error (skipped: inputs not seen)
    wrong_inputs: tuple[str, ...]  # forward argument names whose gradient is wrong
    summary: str              # "LinearFunction at model.py:42 is wrong w.r.t. weight ..."
    cls: type | None = field(default=None, compare=False, repr=False)  # None: a custom op


PROBED = ("its gradient on the inputs it received disagrees with finite differences along "
          "random directions ({failing} of {tests} probes fail; not located element by "
          "element alone, for cost: the model's blocks locate the elements)")


def check_alone(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """check_gradient's verdict on one Function, settled by a failing probe where full mode
    would be over budget."""
    from ..checks.gradient import check_gradient  # lazy: the culprit search's only
    from ..numerics.wirtinger import is_complex

    if case.problem.diff and is_complex(case.problem):  # the gradient check skips it
        from ..checks.complex import check_complex

        return check_complex(case, target, config)
    try:
        probed = _probe_first(case, target, config)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - the user's code raised: the full check reports it
        probed = None
    return probed if probed is not None else check_gradient(case, target, config)


def _probe_first(case: Case, target: Target, config: CheckConfig) -> CheckResult | None:
    """A failed result when full mode is over budget and a probe fails; else None."""
    from ..checks._common import calls_since
    from ..checks.gradient import precision_config
    from ..numerics.jacobian import choose_mode, prime
    from ..numerics.probe import screen

    problem = case.problem
    if config.mode != "auto" or not problem.diff or problem.sparse or any(
            v.is_complex() for v in problem.inputs):
        return None
    before = dict(problem.calls)
    own = precision_config(config, problem)
    leaves, outs = prime(problem)
    if not outs or problem.complex or choose_mode(problem, own, leaves, outs)[0] == "full":
        return None
    probes, failing = screen(problem, own, leaves, outs, case.seed)
    settled = [pq for pq in failing if _settled(probes, *pq)]
    if not settled:  # passing, or what the whole check may call inconclusive: it decides
        return None
    tests = probes.v.shape[0] * len(probes.u)
    return CheckResult("gradient", Outcome.FAILED,
                       PROBED.format(failing=len(settled), tests=tests), mode="probe",
                       mode_reason="full mode over budget alone: a probe settles the culprit",
                       calls=calls_since(problem, before), source=target.source)


# A probe settles "wrong" alone only where no inconclusive cause could explain it: backward's
# (vᵀJ)u and the finite differences' vᵀ(Ju) differ by this fraction of the larger (a forward
# computed to a tolerance, an adaptive solve, is off by far less)...
SETTLED_GAP = 0.1
# ...and the estimates at steps h and 2h agree this much better than that (a kink or a jump
# between the two steps, or data-dependent control flow, moves them apart).
STEPS_AGREE = 0.01


def _settled(probes: Any, p: int, q: int) -> bool:
    """Whether probe test (p, q) fails beyond what an inconclusive cause explains."""
    from ..numerics.problem import flat_cat

    u = flat_cat(probes.u[p]).to(probes.grads.dtype)
    v = probes.v[q]
    analytical = float(probes.grads[q] @ u)
    at_h, at_2h = float(probes.diffs[0, p] @ v), float(probes.diffs[1, p] @ v)
    gap = abs(analytical - at_h)
    return (gap > SETTLED_GAP * max(abs(analytical), abs(at_h))
            and abs(at_h - at_2h) < STEPS_AGREE * gap)


def finding_of(app: Any, source: str | None, result: CheckResult) -> FunctionFinding:
    """The report's verdict on one application from its check alone."""
    name, where = app.cls.__qualname__, app.created_at or "an unknown line"
    wrong: tuple[str, ...] = ()
    if result.outcome is Outcome.FAILED:
        wrong = tuple(dict.fromkeys(b.input for b in result.blocks if b.mismatched))
        causes = [b.diagnosis for b in result.blocks if b.mismatched and b.diagnosis]
        text = f"{name} at {where} is {wrt(wrong)}"
        text += f" (backward at {source})" if source else ""
        text += f": {causes[0]}" if causes else f": {result.summary}"
    elif result.outcome is Outcome.PASSED:
        text = f"{name} at {where} passes"
    elif result.outcome is Outcome.ERROR:
        # The composite's own run got further: the failure is the re-run's, not the user's.
        text = (f"gradtool could not re-run {name} at {where} alone, so it has no verdict "
                f"of its own (this is not a finding about your code): {result.summary}")
    else:
        text = f"{name} at {where} is {result.outcome.value}: {result.summary}"
    return FunctionFinding(name, source, app.created_at, result.outcome, wrong, text, app.cls)


def wrt(wrong: Sequence[str]) -> str:
    """'wrong w.r.t. x, w', or how a probe found it wrong without naming inputs."""
    return f"wrong w.r.t. {', '.join(wrong)}" if wrong else "found wrong by a probe of it alone"
