"""The contract's linearity and determinism tests, below float64 bounded by rounding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics.problem import Problem
from ..numerics.rounding import FOLLOW_SCALE
from ..results import Finding
from ..targets.probe import comparable


def rounded(config: CheckConfig, *grads: torch.Tensor) -> str | None:
    """The gradients' dtype when it is below float64 and no atol or rtol is set: the linearity
    and determinism tests then allow what rounding in that dtype allows, and no more (a fixed
    tolerance is too tight where a half-precision sum cancels, too loose elsewhere)."""
    from ..numerics.rounding import dtype_name
    from .precision import coarsest

    if config.atol is not None or config.rtol is not None or \
            not all(g.is_floating_point() for g in grads):
        return None
    found = coarsest({dtype_name(g.dtype) for g in grads})
    return None if found in (None, "float64") else found


def summed(grads: Sequence[torch.Tensor]) -> int:
    """The most terms a gradient element can sum: one per grad_output element."""
    return sum(g.numel() for g in grads)


def shared_scale(*results: Sequence[torch.Tensor | None], weights: Sequence[float]) -> float:
    """The largest root-mean-square, over the inputs, of sum w·|result|: the scale of the terms
    one backward sums, which a gradient that cancels whole is rounding noise of."""
    from ..numerics.rounding import rms

    scales = [float(rms(sum(w * t.detach().double().abs() for w, t in zip(weights, per_input))))
              for per_input in zip(*results)
              if all(t is not None and t.numel() and t.is_floating_point() for t in per_input)
              and len({t.shape for t in per_input}) == 1]
    return max(scales, default=0.0)


def beyond_rounding(result: torch.Tensor, terms: list[tuple[float, torch.Tensor]], dtype: str,
                     summed: int, noise: float, rounded_input: bool = True,
                     shared: float = 0.0, measured: float | torch.Tensor = 0.0,
                     widened: str | None = None) -> str | None:
    """How far `result` is from sum c·t beyond what rounding in `dtype` allows (the worst
    element, and its bound), or None within it everywhere. `rounded_input`: the two sides ran
    on grad_outputs rounded differently (the linearity test; determinism's are the same).
    `shared`: the scale of the backward's other gradients (shared_scale). `noise`: the user's
    --nondet-tol share, never cut; `measured`: backward's own rounding, measured, named by
    `widened`. The bound goes through the door (numerics/bounds.py): finite, and below the
    size of the values compared (the largest of them, or `shared` where the tensor cancels)."""
    from ..numerics.bounds import admit, finite_max
    from ..numerics.rounding import combination_bound

    expected = sum(c * t.detach().double() for c, t in terms)
    diff = (result.detach().double() - expected).abs()
    bound = combination_bound([(1, result), *terms], dtype, summed, rounded_input,
                              shared) + noise + measured
    origin = f"{dtype} rounding of the combination" + (f" + {widened}" if widened else "")
    door = admit(bound, result.detach(), expected, origin=origin, floor=noise,
                 scale=max(finite_max(result, expected, *(t for _, t in terms)), shared))
    bound = door.tol
    beyond = ~(diff <= bound) & ~(diff.isnan() & expected.isnan() & result.isnan())
    if not bool(beyond.any()):
        return None
    worst = int(torch.argmax(torch.where(beyond, diff / bound, torch.zeros_like(diff))))
    cut = door.words() if bool(door.capped.reshape(-1)[worst]) else None
    return (f"by {float(diff.reshape(-1)[worst]):.3g} at element {worst}, beyond the "
            f"{float(bound.reshape(-1)[worst]):.3g} that rounding in {dtype} allows there "
            f"({int(beyond.sum())} of {diff.numel()} elements beyond it"
            f"{f'; {cut}' if cut else ''})")


SCALE = FOLLOW_SCALE  # numerics/rounding.py: what backward must follow but for rounding
# Rounding noise measured so, allowed this many times in a combination of three backwards
# (2·B(g1) + 3·B(g2) - B(2·g1 + 3·g2): weights 6 in all, twice for the noise's spread).
MEASURED_SLACK = 12.0
MEASURED_WORDS = f"{MEASURED_SLACK:g} x backward's measured rounding"
# A tensor whose measured noise is this many units of its own largest value is noise itself.
CANCELLED = 64.0


def measured_noise(backward, *calls: tuple[Sequence[torch.Tensor], Sequence[Any]]
                   ) -> list[float]:
    """Per input, the largest rounding noise of backward's result, measured at each
    (grad_output, result) call given: backward at SCALE·grad_output against SCALE·result.
    Where a gradient cancels (an output constant over the input: a normalisation over one
    element), its terms' scale is hidden inside backward (a layer norm's 1/std), and only a
    measurement shows it; one call may round exactly where another does not, so several."""
    noise: list[float] = []
    for grads, results in calls:
        again = backward([SCALE * g for g in grads])
        for k, (a, b) in enumerate(zip(results, again)):
            found = 0.0
            if a is not None and b is not None and a.shape == b.shape and a.numel() \
                    and a.is_floating_point():
                d = (b.detach().double() - SCALE * a.detach().double()).abs()
                d = d[torch.isfinite(d)]
                found = float(d.max()) if d.numel() else 0.0
                # only a tensor that is rounding noise itself: one of real values keeps its
                # own bound (a small but real gradient's linearity bug still fails)
                own = a.detach().double().abs()
                own = float(own[torch.isfinite(own)].max()) if bool(torch.isfinite(own).any()) \
                    else 0.0
                if found <= CANCELLED * torch.finfo(a.dtype).eps * own:
                    found = 0.0
            noise[k:k + 1] = [max(found, noise[k] if k < len(noise) else 0.0)]
    return noise


def terms_floor(backward, *weighted: tuple[Sequence[torch.Tensor], float]
                ) -> dict[int, float]:
    """Per element count, sum w·(the scale of the terms backward(g) combines), over the
    (g, w) given: the `shared` floor of a gradient that cancels whole where neither it nor
    the other gradients show its terms' size (a summed softmax's g − g·Σs: each term ~|g|,
    the result a few ulps of it, and backward at a scaled g may round the same).
    combination_bound takes it only for a tensor within NOISE_UNITS of rounding at that
    scale, so a small but real gradient keeps its own bound. The smallest sound scale: an
    element that is the difference of rounded terms is off by a few units of the largest of
    them, not more (each rounding u|term|, sums sqrt(k) u_acc of their size), and only values
    that follow grad_output are terms (measured on the summed softmax: 1.15 units of it at
    most, 16 allowed)."""
    from ..numerics.terms import terms_scale

    found: dict[int, float] = {}
    for g, w in weighted:
        for n, scale in terms_scale(backward, g).items():
            found[n] = found.get(n, 0.0) + w * scale
    return found


def measured_elements(backward, *calls: tuple[Sequence[torch.Tensor], Sequence[Any]]
                      ) -> list[torch.Tensor | None]:
    """Per input, each element's rounding noise measured as measured_noise measures it (the
    most over the calls): where a gradient element's rounding comes from terms hidden inside
    backward and larger than it (a reverse cumulative sum whose partial sums along the way are
    many times the element: a scan's gate gradient), only its own measurement shows it, and a
    small element keeps its own (a seeded nonlinearity moves it by far more than SCALE's 2^-7
    share of itself)."""
    noise: list[torch.Tensor | None] = []
    for grads, results in calls:
        again = backward([SCALE * g for g in grads])
        for k, (a, b) in enumerate(zip(results, again)):
            found = None
            if a is not None and b is not None and a.shape == b.shape and a.numel() \
                    and a.is_floating_point():
                found = (b.detach().double() - SCALE * a.detach().double()).abs()
                found = torch.where(torch.isfinite(found), found, torch.zeros_like(found))
            if k >= len(noise):
                noise.append(found)
            elif found is not None:
                noise[k] = found if noise[k] is None else torch.maximum(noise[k], found)
    return noise


def allclose(a: torch.Tensor, b: torch.Tensor, **tolerances: float) -> bool:
    """allclose of the values as compared (NaN equal to NaN)."""
    return torch.allclose(comparable(a), comparable(b), equal_nan=True, **tolerances)


def linearity(backward, g1, g2, r1, problem: Problem, config: CheckConfig) -> list[Finding]:
    """contract.nonlinear: backward(2·g1 + 3·g2) against 2·backward(g1) + 3·backward(g2)."""
    r2 = backward(g2)
    g12 = [2 * a + 3 * b for a, b in zip(g1, g2)]
    mixed = backward(g12)
    calls = ((g1, r1), (g12, mixed))  # measured at these
    # Each of the three calls may wander by nondet_tol: 2·a + 3·b + m can by 6·nondet_tol.
    atol, rtol = config.tolerance("atol") + 6 * config.nondet_tol, config.tolerance("rtol")
    problem.cache.linear = True  # double backward mirrors grad_output columns on it
    shared = shared_scale(mixed, r1, r2, weights=(1, 2, 3))
    noise: list[float] | None = None
    elements: list[torch.Tensor | None] | None = None
    terms: dict[int, float] | None = None
    for k, (name, a, b, m) in enumerate(zip(problem.input_names, r1, r2, mixed)):
        if a is None or b is None or m is None or a.shape != m.shape:
            continue
        low = rounded(config, a, b, m)
        if low is not None:
            def beyond(extra: float | torch.Tensor = 0.0, floor: float = shared,
                       widened: str | None = None) -> str | None:
                return beyond_rounding(m, [(2, a), (3, b)], low, summed(g1),
                                       6 * config.nondet_tol, shared=floor, measured=extra,
                                       widened=widened)
            off, measured, how = beyond(), 0.0, None
            if off is not None:  # beyond the model: against backward's measured rounding too
                noise = noise or measured_noise(backward, *calls)
                measured, how = MEASURED_SLACK * noise[k], MEASURED_WORDS
                off = beyond(measured, widened=how)
            if off is not None:  # and each element against its own measured rounding
                elements = elements or measured_elements(backward, *calls)
                if elements[k] is not None:
                    measured = MEASURED_SLACK * (noise[k] + elements[k])
                    how = f"{MEASURED_WORDS}, the tensor's and each element's"
                    off = beyond(measured, widened=how)
            if off is not None:  # and a tensor that cancels whole, at its terms' scale
                if terms is None:
                    terms = terms_floor(backward, (g12, 1), (g1, 2), (g2, 3))
                off = beyond(measured, max(shared, terms.get(m.numel(), 0.0)),
                             " and ".join(filter(None, (how, "its terms' scale"))))
        else:
            off = None if allclose(m, 2 * a + 3 * b, atol=atol, rtol=rtol) else \
                f"by {(m - (2 * a + 3 * b)).abs().max().item():.3g}"
        if off is not None:
            problem.cache.linear = False
            return [Finding(
                "contract.nonlinear",
                f"backward is not linear in grad_output: for '{name}', backward(2·g1 + 3·g2) "
                f"differs from 2·backward(g1) + 3·backward(g2) {off} — the gradient must be a "
                "linear map of grad_output", data={"input": name, **_relative(m, a, b)})]
    return []


def _relative(m: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """How far from linear, relative to the combination's size (run/approximate.py reads it)."""
    want = (2 * a + 3 * b).detach().double()
    gap = (m.detach().double() - want).abs().nan_to_num(0, 0, 0)
    scale = float(want.abs().nan_to_num(0, 0, 0).max()) if want.numel() else 0.0
    return {"relative": float(gap.max()) / scale if scale and gap.numel() else 0.0}


def deterministic(backward, g1, r1, problem: Problem, config: CheckConfig) -> list[Finding]:
    """contract.nondeterministic: backward(g1) twice."""
    again = backward(g1)
    shared = shared_scale(again, r1, weights=(1, 1))
    terms: dict[int, float] | None = None
    for name, a, b in zip(problem.input_names, r1, again):
        if a is None or b is None or a.shape != b.shape:
            continue
        low = rounded(config, a, b)
        if low is not None:
            off = beyond_rounding(b, [(1, a)], low, summed(g1), config.nondet_tol, False,
                                  shared=shared)
            if off is not None:  # a tensor that cancels whole, at its terms' scale
                terms = terms_floor(backward, (g1, 2)) if terms is None else terms
                off = beyond_rounding(b, [(1, a)], low, summed(g1), config.nondet_tol, False,
                                      shared=max(shared, terms.get(b.numel(), 0.0)),
                                      widened="its terms' scale")
        else:
            diff = (a - b).abs().max().item() if a.numel() else 0.0
            off = f"by {diff:.3g} (> nondet_tol {config.nondet_tol:g})" \
                if diff > config.nondet_tol else None
        if off is not None:
            return [Finding(
                "contract.nondeterministic",
                f"backward is nondeterministic: two calls with the same grad_output give "
                f"'{name}' gradients differing {off}: raise --nondet-tol if this is expected")]
    return []
