"""forward_ad: the Function's jvp (J·u) against finite differences and against its backward."""

from __future__ import annotations

from dataclasses import replace

from ..config.settings import CheckConfig
from ..numerics.forward import forward_mode
from ..diagnosis.block import Diagnosis
from ..numerics.jacobian import Verdict
from ..numerics.problem import Problem
from ..results import Block, CheckResult, Finding, Outcome
from ..targets.cases import Case
from ..targets.load import source_of
from ._common import Context
from .gradient import diagnose_first_order, jacobian_result

NAME = "forward_ad"
REVERSE = "forward and reverse mode disagree"  # numerics/forward.py's consistency line


def applies(case: Case, context: Context) -> str | None:
    """On for a Function that defines jvp; on any target under `forward_any` (gradcheck's
    check_forward_ad, the drop-in's: forward-mode AD through whatever it calls)."""
    from torch.autograd import Function

    cls = context.target.function_cls
    if case.problem.sparse:
        return ("sparse inputs: forward mode through sparse layouts is not checked (torch "
                "supports few sparse tangents)")
    if context.config.forward_any:
        return None  # a Function without jvp then raises, as under torch's gradcheck
    if cls is None:
        return "not a custom Function: forward mode is only checked for a Function's own jvp"
    if getattr(cls, "jvp", Function.jvp) is Function.jvp:
        return "the Function defines no jvp (forward-mode AD is not supported by it)"
    return None


def run(case: Case, context: Context) -> CheckResult:
    """Full mode: every column J·e_j by jvp against central differences; probe mode: random
    directions, a failing one bisected to its element; both: ⟨v, J·u⟩ against ⟨vᵀJ, u⟩."""
    result = jacobian_result(NAME, case.problem, context.target, context.config, case.seed,
                             None, None, _diagnose, engine=forward_mode)
    if result.outcome not in (Outcome.FAILED, Outcome.INCONCLUSIVE):
        return result
    if result.outcome is Outcome.FAILED and not result.findings:
        # Failed with no block mismatched (no finding): only forward against reverse mode can
        # fail so (numerics/forward.py puts its line first). jvp agrees with finite
        # differences: what disagrees with both is backward.
        backward = source_of(cls.backward) if (cls := context.target.function_cls) else None
        summary = (f"jvp agrees with finite differences, but backward does not agree with jvp "
                   f"({result.details[0].removeprefix(REVERSE + ': ')}): backward is the wrong "
                   "one (the gradient check names its elements)")
        return replace(result, summary=summary, details=result.details[1:],
                       source=backward or result.source,
                       findings=(Finding(f"{NAME}.reverse_disagrees", summary),))
    cls = context.target.function_cls
    where = source_of(cls.jvp) if cls is not None and hasattr(cls, "jvp") else None
    return replace(result, summary=_summary(result), source=where or result.source)


def _diagnose(problem: Problem, verdict: Verdict, block: Block, i: int, o: int,
              config: CheckConfig) -> Diagnosis | None:
    """The gradient check's words, said of jvp: the same Jacobian, computed column-wise."""
    found = diagnose_first_order(problem, verdict, block, i, o, config)
    if found is None:
        return None
    return replace(found, text=found.words(actor="jvp", cotangent="the tangent"))


def _summary(result: CheckResult) -> str:
    bad = [b for b in result.blocks if b.mismatched]
    if not bad:
        return result.details[0] if result.details else result.summary
    first = bad[0]
    where = (f"{first.mismatched} of {first.checked} elements" if first.exhaustive
             else f"{first.mismatched} located element(s)")
    more = f", and {len(bad) - 1} more (input, output) pair(s)" if len(bad) > 1 else ""
    if result.outcome is Outcome.INCONCLUSIVE:
        return result.summary  # the gradient check's words, with the cause when one is known
    return (f"jvp's derivative of {first.output} along '{first.input}' disagrees with finite "
            f"differences at {where}{more}")
