"""The failing path's second look: re-estimates at other steps that tell a mistake in backward
from a non-differentiable point (kink, tie) of forward, reusing what the sweep evaluated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..config.settings import CheckConfig
from .compare import BlockTally
from .problem import Problem, flat_cat
from .steps import KINK_TEST, at_far, element, one_sided


@dataclass
class Evaluations:
    """What the sweep already evaluated: f(x), and f(x ± h e_col) per input (col -> pair)."""

    f0: torch.Tensor
    kept: Sequence[dict[int, tuple[torch.Tensor, torch.Tensor]]]
    confirmed: dict = field(default_factory=dict)  # (input, output) -> confirm's answer
    far: Sequence[dict] = ()  # per input: col -> f(x ± 10h e_col), evaluated by measured.py


# Backward this many spreads of the estimates outside them all: wrong, whatever their spread.
OUTSIDE = 10.0
# One-sided estimates disagreeing this many times less at 10h than at h: rounding (its error
# falls as 1/h, 10 times on average), not a kink (whose one-sided slopes differ at any step).
ROUNDING_FALL = 3.0
# and each side's estimate moving by at least this fraction of the other's: rounding moves
# both at random, a jump or a kink leaves its smooth side unmoved.
BOTH_SIDES = 0.1


def confirm(problem: Problem, config: CheckConfig, tally: BlockTally, i: int, out_offset: int,
            has_reference: bool, done: Evaluations | None = None) -> tuple[list, bool, bool]:
    """Worst elements, each marked inconclusive when finite differences disagree there, and
    whether rounding, not a kink, is what most unreliable elements show.

    Economy: a whole-tensor mistake (one ratio analytical / numerical over several columns: a
    factor, a sign, a detached term) is no kink and needs no re-estimate; otherwise elements
    are re-estimated worst first until one stands (the verdict is then settled), from the
    evaluations the sweep kept plus two at ten times the step."""
    exact = [tally.element(r, c, a, n) for _, r, c, a, n in tally.worst]
    if has_reference:  # a declared surrogate is exact: nothing to re-estimate
        return exact, False, False
    if not tally.worst:  # failures counted past the budget of exact columns: no values
        return [], False, False
    votes: list[bool | None] = []  # per unreliable element: rounding (True) or a kink (False)
    h = config.tolerance("eps")
    cache: dict[int, dict[str, torch.Tensor]] = {}
    elements = list(exact)
    # columns already evaluated at ±10h (the measured tolerance's sample) are tried first
    far = done.far[i] if done is not None and i < len(done.far) else {}
    order = sorted(range(len(tally.worst)), key=lambda k: tally.worst[k][2] not in far)
    for step, k in enumerate(order):
        _, r, c, a, n = tally.worst[k]
        if c not in cache:  # a common ratio: one-sided estimates already kept show a tie
            near = step == 0 and _whole_tensor(tally.worst)
            cache[c] = _estimates(problem, i, c, h, done, near)
        at = {name: e[out_offset + r].item() for name, e in cache[c].items()}
        estimates = [at[name] for name in KINK_TEST if name in at]
        spread = max(estimates) - min(estimates)
        shaky = (not math.isfinite(spread) or spread > tally.kink_tolerance(n)) \
            and not _outside(a, estimates, spread, tally.kink_tolerance(n))
        elements[k] = tally.element(r, c, a, n, inconclusive=shaky)
        if not shaky:  # a standing element settles the verdict: failed
            return elements, False, False
        votes.append(_rounding(at))
    return elements, True, votes.count(True) > votes.count(False)


def _outside(analytical: float, estimates: Sequence[float], spread: float,
             tolerance: float) -> bool:
    """Whether backward's value lies far outside every estimate, by many times their spread:
    estimates that disagree with each other (rounding, or a kink: a subgradient lies between
    its one-sided slopes) but together disagree with backward far more is a wrong backward."""
    if not math.isfinite(spread) or not math.isfinite(analytical):
        return False
    gap = max(min(estimates) - analytical, analytical - max(estimates), 0.0)
    return gap > OUTSIDE * spread + tolerance


def confirmed(problem: Problem, config: CheckConfig, tallies: list[list[BlockTally]], i: int,
               evaluated: Evaluations, again: bool = False) -> bool:
    """Whether input i's sweep found a failure the kink test confirms (remembered in
    `evaluated.confirmed`, so the verdict does not test it twice; `again`: the sweep compared
    more since, so what was remembered is forgotten first)."""
    if again:
        forget(evaluated, i)
    if problem.cache.pass_only and any(t.mismatched for t in tallies[i]):
        from .columns import NotAPass  # its caller takes a pass or nothing: nothing to confirm

        raise NotAPass(f"input {i}: a failing comparison")
    offset = 0
    for o, tally in enumerate(tallies[i]):
        if tally.mismatched:
            answer = evaluated.confirmed.get((i, o)) or confirm(problem, config, tally, i,
                                                                  offset, False, evaluated)
            evaluated.confirmed[(i, o)] = answer
            if not answer[1]:
                return True
        offset += math.prod(tally.output_shape)
    return False


def forget(evaluated: Evaluations, i: int) -> None:
    """Drop input i's remembered answers: its tallies grew after they were given."""
    for key in [k for k in evaluated.confirmed if k[0] == i]:
        del evaluated.confirmed[key]


def _rounding(at: dict[str, float]) -> bool | None:
    """Whether the one-sided estimates' disagreement falls as 1/h, both sides moving (None:
    no estimates at 10h)."""
    if "right x10" not in at:
        return None
    near, far = abs(at["right"] - at["left"]), abs(at["right x10"] - at["left x10"])
    # Each side moves between h and 10h: a kink or a jump leaves its smooth side where it is.
    sides = sorted(abs(at[side] - at[f"{side} x10"]) for side in ("right", "left"))
    if not all(math.isfinite(v) for v in (near, far, *sides)):
        return None
    return near > ROUNDING_FALL * far and sides[0] > BOTH_SIDES * sides[1]


def _whole_tensor(worst: Sequence[tuple[float, int, int, float, float]]) -> bool:
    """Three or more worst elements over two or more columns share one ratio a / n."""
    ratios = [a / n for _, _, _, a, n in worst if n != 0 and math.isfinite(a / n)]
    if len(ratios) < 3 or len(ratios) < len(worst) or len({c for _, _, c, _, _ in worst}) < 2:
        return False
    return max(ratios) - min(ratios) <= 1e-3 * max(1.0, max(abs(x) for x in ratios))


def _estimates(problem: Problem, i: int, col: int, h: float, done: Evaluations | None,
               near: bool = False) -> dict[str, torch.Tensor]:
    """steps.one_sided's estimates, reusing f(x) and f(x ± h e_col) where already evaluated
    (near: only those, no new evaluation)."""
    if done is None or col not in done.kept[i]:
        return one_sided(problem, problem.inputs, i, col, h)
    plus, minus = done.kept[i][col]
    f0 = done.f0
    near_only = {"right": (plus - f0) / h, "left": (f0 - minus) / h,
                 "central": (plus - minus) / (2 * h)}
    if near:
        return near_only
    far = list(done.far[i][col]) if i < len(done.far) and col in done.far[i] else []
    if not far:
        work = [v.detach().clone() for v in problem.inputs]
        at_col = element(work[i].shape, col)
        original = work[i][at_col].item()
        for delta in (10 * h, -10 * h):
            work[i][at_col] = original + delta
            far.append(flat_cat(problem.outputs(work)))
    return {**near_only, **at_far(f0, far[0], far[1], 10 * h)}



def kink_note(tally: BlockTally, elements: Sequence, rounding: bool = False) -> str:
    where = ", ".join(f"{tally.input}{list(e.input_index)}" for e in elements[:3])
    if rounding:
        return (f"inconclusive: finite differences disagree across step sizes at {where} — "
                f"{ROUNDING_CAUSE}: their one-sided estimates disagree about 10 times less at "
                "10 times the step (rounding, error ∝ 1/h); compute in float64 throughout")
    return (f"inconclusive: finite differences disagree across step sizes at {where} — "
            f"{KINK_CAUSE}")


KINK_CAUSE = "a non-differentiable point (kink, tie) near the input; try --resample"
ROUNDING_CAUSE = "a lower-precision computation inside (float32 rounding or coarser), not a kink"
