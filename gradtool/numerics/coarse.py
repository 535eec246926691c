"""A forward that computes coarser than the dtype it is given (float64 in, float32 inside):
detected from its outputs once per problem, in every mode, and its gradient judged at that
dtype's steps and tolerances."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..config.settings import CheckConfig
from ..results import CheckResult, Finding, Outcome, Severity
from .problem import Problem, flat_cat

if TYPE_CHECKING:
    from .jacobian import Verdict

# Narrower dtypes, finest first, and the unit roundoff each computes with.
COARSER = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
# Values that are all multiples of this are "simple" (integers, halves...): representable in
# any dtype, they prove nothing about the precision a forward computes in.
SIMPLE = 2.0 ** -6
# An output below this fraction of the inputs' scale (or of 1) is float64's residue of a
# cancellation (a probability that is 0 but for 7 * 2^-54): a few ulps of the operands, a number
# of any dtype, it proves nothing either.
RESIDUE = 2.0 ** -36
RULE = "gradient.forward_precision"


def coarse_dtype(values: Sequence[torch.Tensor], given: torch.dtype) -> torch.dtype | None:
    """The coarsest dtype below `given` that holds every value exactly, when the values are
    not simple (a float64 computation's results are float32 numbers only by chance: 2^-29 per
    element); None when none does."""
    flat = torch.cat([v.detach().reshape(-1).double() for v in values])
    flat = flat[torch.isfinite(flat)]
    if not flat.numel() or bool(((flat / SIMPLE).round() * SIMPLE == flat).all()):
        return None
    # the coarsest that holds them all (bfloat16's numbers in float16's range are float16's,
    # both are float32's): the precision judged is then never finer than the forward's
    for dtype in sorted(COARSER, key=COARSER.get, reverse=True):
        if COARSER[dtype] > _unit(given) and _holds(flat, dtype):
            return dtype
    return None


def _holds(flat: torch.Tensor, dtype: torch.dtype) -> bool:
    info = torch.finfo(dtype)
    if bool((flat.abs() > info.max).any()):
        return False
    return bool((flat.to(dtype).double() == flat).all())


def _unit(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def forward_dtype(problem: Problem, outs: Sequence[torch.Tensor] | None = None
                  ) -> torch.dtype | None:
    """The dtype a forward computes in where that is coarser than its inputs' (float64 given,
    float32 inside), else None; learnt once per problem, in every mode. `outs`: the outputs at
    the inputs, already evaluated (the priming forward's). A forward whose outputs there are
    not all numbers of a coarser dtype costs nothing more; otherwise one forward at a moved
    point, whose inputs are not numbers of that dtype, decides: its outputs that changed must
    all be such numbers too (inputs that happen to be float32 numbers, a constant output, or
    integer values prove nothing)."""
    memo = problem.cache.forward_dtype
    if memo is not None:
        return memo[0]
    found = _detected(problem, outs)
    problem.cache.forward_dtype = (found,)
    return found


def second_order_dtype(forward: Problem, derived: Problem, outs: Sequence[torch.Tensor]
                       ) -> torch.dtype | None:
    """The dtype double backward is judged at: the coarser of the forward's and the
    backward's own (its outputs, the gradients, at `outs`). A backward kernel that computes in
    float32 though given float64 (a Triton kernel's) rounds every gradient to float32, and
    float64's finite-difference steps over it are noise (1e-7 / 1e-6): gradgradcheck at
    float32's tolerances passes what float64's call unreliable."""
    memo = derived.cache.forward_dtype
    if memo is None:
        derived.cache.forward_dtype = memo = (_detected(derived, outs, each=True),)
    found = [d for d in (forward_dtype(forward), memo[0]) if d is not None]
    return max(found, key=COARSER.get, default=None)


def second_order_whose(forward: Problem, dtype: torch.dtype) -> str:
    """Whose precision double backward was judged at: the forward's, or its backward's."""
    return "the forward's" if forward_dtype(forward) == dtype else "the backward's"


def _detected(problem: Problem, outs: Sequence[torch.Tensor] | None, each: bool = False
              ) -> torch.dtype | None:
    """As forward_dtype; `each`: the coarsest of the outputs one by one (a backward's
    gradients: one summed over a broadcast in float64 holds float32 rounding without being a
    float32 number, the others are)."""
    given = _given(problem)
    if given not in _GIVEN:
        return None
    outs = problem.outputs(problem.inputs) if outs is None else outs
    if not outs or any(o.is_complex() or o.layout != torch.strided for o in outs):
        return None  # complex or sparse outputs: other checks judge them
    sizes = [o.numel() for o in outs] if each else [sum(o.numel() for o in outs)]
    f0 = flat_cat([o.detach() for o in outs])
    floor = RESIDUE * max([1.0] + [float(v.detach().abs().max()) for v in problem.inputs
                                   if v.is_floating_point() and v.numel()])
    dtypes = {coarse_dtype([p[p.abs() > floor]], given) for p in f0.split(sizes)} - {None}
    if not dtypes:
        return None
    moved = [v + 1e-3 * (v.abs() + 1) if v.is_floating_point() else v for v in problem.inputs]
    floating = [v.reshape(-1).double() for v in moved if v.is_floating_point()]
    if all(_holds(v[torch.isfinite(v)], dtype) for v in floating for dtype in dtypes):
        return None  # the moved inputs are numbers of that dtype too: they prove nothing
    try:
        f1 = flat_cat(problem.outputs(moved))
    except Exception:  # noqa: BLE001 - outside the forward's domain there: nothing shown
        return None
    if f1.shape != f0.shape:
        return None
    found = [_moved(a, b, floor, given) for a, b in zip(f0.split(sizes), f1.split(sizes))]
    return max((d for d in found if d is not None), key=COARSER.get, default=None)


def _moved(f0: torch.Tensor, f1: torch.Tensor, floor: float, given: torch.dtype
           ) -> torch.dtype | None:
    """The coarse dtype the values that changed between the two points all belong to."""
    changed = (f1 != f0) & torch.isfinite(f0) & torch.isfinite(f1) & \
        (f0.abs() > floor) & (f1.abs() > floor)
    if not bool(changed.any()):
        return None
    return coarse_dtype([f0[changed], f1[changed]], given)


def _given(problem: Problem) -> torch.dtype | None:
    """The finest floating dtype among the inputs."""
    return min((v.dtype for v in problem.inputs if v.is_floating_point()), key=_unit,
               default=None)


def at_precision(config: CheckConfig, dtype: torch.dtype) -> CheckConfig:
    """The configuration judging a gradient at `dtype`'s steps and tolerances where coarser
    than the configuration's own (a step or tolerance set for float64, gradcheck's drop-in's
    say, cannot judge a float32 forward: its rounding over a 1e-6 step is noise), never
    tighter than the user's."""
    from ..config.settings import DEFAULT_TOLERANCES

    name = _name(dtype)
    coarse = DEFAULT_TOLERANCES[name]
    if coarse["eps"] <= config.tolerance("eps"):
        return config
    return config.with_(dtype=name, **{k: max(config.tolerance(k), coarse[k])
                                       for k in ("eps", "atol", "rtol")})


def judged_note(dtype: torch.dtype, whose: str = "the forward's") -> str:
    """What the report says of a gradient judged at a coarse forward's (or backward's)
    precision."""
    name = _name(dtype)
    return (f"judged at {name}'s precision, {whose}: {name}'s finite-difference steps "
            f"and tolerances")


def reworded(details: Sequence[str], dtype: torch.dtype) -> list[str]:
    """The verdict's notes where the forward (or backward) is shown to compute in `dtype`:
    finite differences that disagree across steps there are its rounding as likely as a
    kink, and are not called a kink (issue 55: "kink" only where one is shown)."""
    from .confirm import KINK_CAUSE

    name = _name(dtype)
    cause = (f"it computes in {name} (its outputs are {name} numbers), whose rounding finite "
             f"differences at {name}'s steps cannot resolve here, not a kink shown; check it in "
             f"{name} against a float64 reference (--dtype {name} --reference module:fn)")
    return [d.replace(KINK_CAUSE, cause) for d in details]


def with_finding(problem: Problem, verdict: Verdict, dtype: torch.dtype) -> tuple[
        Verdict, Finding]:
    """A first-order verdict judged at a coarse forward's precision, failed by the finding
    gradient.forward_precision (ignored, its blocks decide); an inconclusive one stays so."""
    outcome = Outcome.INCONCLUSIVE if verdict.outcome is Outcome.INCONCLUSIVE else \
        Outcome.FAILED
    verdict = replace(verdict, outcome=outcome, details=[*verdict.details, judged_note(dtype)])
    return verdict, _finding(problem, _given(problem), dtype)


def expected(result: CheckResult) -> CheckResult:
    """A float64 run of a target checked below float64: its forward computing in the lower
    dtype is what the user checks, not a finding; its gradient judged at that precision."""
    kept = tuple(f for f in result.findings if f.rule != RULE)
    if len(kept) == len(result.findings):
        return result
    failed = any(b.mismatched for b in result.blocks) or any(
        f.severity is Severity.FAILURE for f in kept)
    return replace(result, findings=kept, outcome=result.outcome if failed else Outcome.PASSED,
                   summary=result.summary if failed else
                   "matches finite differences at the precision the target computes in")


_GIVEN = (torch.float64, torch.float32)


def _finding(problem: Problem, given: torch.dtype, dtype: torch.dtype) -> Finding:
    low, high = _name(dtype), _name(given)
    text = (f"forward computes in {low} though given {high}: every output it returns is a {low} "
            f"number, so its result is {low}-accurate (about {COARSER[dtype]:.1g} relative) and "
            f"finite differences in {high} cannot judge its gradient; the gradient was judged at "
            f"{low}'s precision instead; fix: compute in the dtype given (no .float(), "
            f"torch.Tensor(...) or float32 buffer on the way), or check it in {low} "
            f"(--dtype {low}); ignore: {RULE} if {low} is what you intend")
    return Finding(RULE, text, data={"given": high, "computes_in": low,
                                     "inputs": list(problem.input_names)})


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
