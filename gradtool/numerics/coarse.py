"""A forward that computes coarser than the dtype it is given (float64 in, float32 inside):
detected from its outputs, then its gradient judged at the precision it has."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..config.settings import CheckConfig
from ..results import Block, CheckResult, Element, Finding, Outcome, Severity
from .jacobian import Verdict
from .problem import Problem, flat_cat
from .steps import element

# Narrower dtypes, finest first, and the unit roundoff each computes with.
COARSER = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
# Values that are all multiples of this are "simple" (integers, halves...): representable in
# any dtype, they prove nothing about the precision a forward computes in.
SIMPLE = 2.0 ** -6
# A re-estimate stands (the backward is wrong) when it is this many times its own error bound
# away from the analytical value; its estimates are from steps the forward's rounding allows.
STANDS = 10.0
RULE = "gradient.forward_precision"
ELEMENTS = 5  # re-estimated per block (its worst shown), four forwards each


@dataclass(frozen=True)
class Estimate:
    """Derivative estimates of one Jacobian element at steps H and 2H."""

    central: float        # Richardson of the central differences at H and 2H
    error: float          # their truncation (difference) plus the forward's rounding over H
    kink: bool            # one-sided differences disagree as much at 2H as at H: a kink


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


def estimate(problem: Problem, i: int, col: int, row: int, unit: float, f0: torch.Tensor,
             seen: list[torch.Tensor]) -> Estimate:
    """Element (row, col) of input i's block re-estimated at steps suited to a forward that
    rounds at `unit`: H = unit^(1/3) |x| (central differences' best step), and 2H."""
    work = [v.detach().clone() for v in problem.inputs]
    at = element(work[i].shape, col)
    x = work[i][at].item()
    step = unit ** (1 / 3) * max(1.0, abs(x))
    f = {}
    for m in (1, -1, 2, -2):
        work[i][at] = x + m * step
        out = flat_cat(problem.outputs(work))
        seen.append(out)
        f[m] = out[row].item()
    base = f0[row].item()
    c1, c2 = (f[1] - f[-1]) / (2 * step), (f[2] - f[-2]) / (4 * step)
    scale = max(abs(v) for v in (*f.values(), base))
    rounding = 4 * unit * scale / step
    near = abs((f[1] - base) - (base - f[-1])) / step   # one-sided disagreement at H
    far = abs((f[2] - base) - (base - f[-2])) / (2 * step)  # and at 2H
    # Smooth: the disagreement doubles at 2H (H f''); a kink's is the slope's jump at both.
    kink = far > 4 * rounding and far < 1.5 * near
    return Estimate(c1 + (c1 - c2) / 3, abs(c1 - c2) + rounding, kink)


def rejudge(problem: Problem, config: CheckConfig, verdict: Verdict,
            shown_by: Problem | None = None) -> tuple[Verdict, Finding | None]:
    """A gradient finite differences could not settle, of a forward that computes coarser than
    its inputs' dtype: each element shown judged again at the forward's precision (failed where
    it stands there, a kink only where one-sided differences show one, else right at that
    precision), and the finding gradient.forward_precision. `shown_by`: the problem whose
    forward's outputs show the dtype (double backward's: the target's own), then no finding:
    the gradient check reports the forward."""
    shaky = [(k, b) for k, b in enumerate(verdict.blocks) if b.mismatched and b.worst]
    given = min((v.dtype for v in problem.inputs if v.is_floating_point()), key=_unit,
                default=None)
    noisy = any(e.inconclusive for _, b in shaky for e in b.worst)
    if verdict.outcome is Outcome.PASSED or not noisy or given not in _GIVEN:
        return verdict, None
    f0 = flat_cat(problem.outputs(problem.inputs))
    offsets = _offsets(problem, verdict.blocks)
    # every element shown, standing or not: where the forward is coarse, finite differences at
    # the given dtype's step are noise for all of them
    where = {(k, e): (problem.input_names.index(b.input), _flat(e.input_index, b.input_shape),
                      offsets[b.output] + _flat(e.output_index, b.output_shape))
             for k, b in shaky for e in b.worst[:ELEMENTS]}
    # measured at float32's steps first: every output evaluated there shows the dtype
    seen = [f0] if shown_by is None else _outputs(shown_by)
    unit = COARSER[torch.float32]
    found = {key: estimate(problem, *at, unit, f0, seen if shown_by is None else [])
             for key, at in where.items()}
    dtype = coarse_dtype(seen, given)
    if dtype is None:
        return verdict, None
    if COARSER[dtype] != unit:  # coarser than float32: steps for its rounding
        unit = COARSER[dtype]
        found = {key: estimate(problem, *at, unit, f0, []) for key, at in where.items()}
    blocks = list(verdict.blocks)
    for k, block in shaky:
        blocks[k] = _judged(block, {e: found[(k, e)] for e in block.worst if (k, e) in found},
                            config)
    kinks = sum(e.inconclusive for k, _ in shaky for e in blocks[k].worst)
    stand = sum(not e.inconclusive for k, _ in shaky for e in blocks[k].worst
                if blocks[k].mismatched)
    note = (f"judged at {_name(dtype)}'s precision, the forward's (steps ~{unit ** (1 / 3):.1g} "
            f"relative): {len(found)} element(s) re-estimated, {stand} wrong, {kinks} at a "
            f"kink, {len(found) - stand - kinks} right")
    outcome = Outcome.FAILED if stand else Outcome.INCONCLUSIVE if kinks else Outcome.PASSED
    if shown_by is None:
        outcome = Outcome.FAILED  # the finding fails it; ignored, the blocks decide
    return (replace(verdict, outcome=outcome, blocks=blocks, details=[note], cause=None,
                    dense={}, mismatch={}),
            _finding(problem, given, dtype) if shown_by is None else None)


def _outputs(problem: Problem) -> list[torch.Tensor]:
    """A forward's outputs at its inputs and at inputs moved by about a thousandth."""
    moved = [v + 1e-3 * (v.abs() + 1) if v.is_floating_point() else v for v in problem.inputs]
    return [flat_cat(problem.outputs(problem.inputs)), flat_cat(problem.outputs(moved))]


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


def _judged(block: Block, estimates: dict[Element, Estimate], config: CheckConfig) -> Block:
    """The block with its unreliable elements judged at the forward's precision: the ones that
    stand are failures (the re-estimate as numerical), a kink stays inconclusive, the rest
    agree and leave the count."""
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    worst = []
    for e in block.worst:
        est = estimates.get(e)
        if est is None or est.kink:  # not re-estimated, or a kink shown: unreliable still
            worst.append(replace(e, inconclusive=True))
            continue
        gap = abs(e.analytical - est.central)
        if gap > STANDS * est.error + atol + rtol * abs(est.central):
            worst.append(replace(e, numerical=est.central, abs_diff=gap,
                                 rel_diff=gap / max(abs(est.central), 1e-300),
                                 inconclusive=False))
    standing = [e for e in worst if not e.inconclusive]
    if standing:  # a located failure: only the elements re-judged count
        return replace(block, worst=tuple(standing), mismatched=len(standing),
                       max_abs_diff=max(e.abs_diff for e in standing),
                       max_rel_diff=max(e.rel_diff for e in standing), exhaustive=False,
                       grid=None)
    if worst:
        return replace(block, worst=tuple(worst))
    return replace(block, worst=(), mismatched=0, grid=None)


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


def _flat(index: Sequence[int], shape: Sequence[int]) -> int:
    flat = 0
    for k, size in zip(index, shape):
        flat = flat * size + k
    return flat


def _offsets(problem: Problem, blocks: Sequence[Block]) -> dict[str, int]:
    """Each output's offset in the flattened outputs, in the problem's output order."""
    shapes = {b.output: b.output_shape for b in blocks}
    offsets, at = {}, 0
    for name in problem.output_names:
        offsets[name] = at
        at += math.prod(shapes.get(name, ()))
    return offsets
