"""The contract's linearity and determinism tests below float64: what rounding allows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config.settings import CheckConfig


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
                     shared: float = 0.0) -> str | None:
    """How far `result` is from sum c·t beyond what rounding in `dtype` allows (the worst
    element, and its bound), or None within it everywhere. `rounded_input`: the two sides ran
    on grad_outputs rounded differently (the linearity test; determinism's are the same).
    `shared`: the scale of the backward's other gradients (shared_scale)."""
    from ..numerics.rounding import combination_bound

    expected = sum(c * t.detach().double() for c, t in terms)
    diff = (result.detach().double() - expected).abs()
    bound = combination_bound([(1, result), *terms], dtype, summed, rounded_input,
                              shared) + noise
    beyond = ~(diff <= bound) & ~(diff.isnan() & expected.isnan() & result.isnan())
    if not bool(beyond.any()):
        return None
    worst = int(torch.argmax(torch.where(beyond, diff / bound, torch.zeros_like(diff))))
    return (f"by {float(diff.reshape(-1)[worst]):.3g} at element {worst}, beyond the "
            f"{float(bound.reshape(-1)[worst]):.3g} that rounding in {dtype} allows there "
            f"({int(beyond.sum())} of {diff.numel()} elements beyond it)")
