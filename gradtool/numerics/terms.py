"""The scale of the terms a backward combines: its intermediates that follow grad_output."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# An intermediate follows grad_output when doubling grad_output doubles it: exactly, since a
# power of two commutes with every rounding; this much relative slack admits a kernel whose
# sums run in a varying order (GPU atomics), while a constant (1x) or a square (4x) stays out.
FOLLOWS = 2.0 ** -6


class _Recorder(TorchDispatchMode):
    """Per floating result of every op run under it: (op, shape, root-mean-square, sum)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...], float, float]] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # as rounding.py's SimulatedRounding: dynamo's wrapper would import torch._dynamo
        return "torch._dynamo" in sys.modules

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) \
                    and t.numel() and t.layout == torch.strided and not t._is_zerotensor():
                d = t.detach()
                mag = d.abs().double()
                real = (d.real if d.is_complex() else d).double()
                self.seen.append((str(func), tuple(t.shape), float(mag.pow(2).mean().sqrt()),
                                  float(real.sum())))
        return out


def _record(backward: Callable[[list[torch.Tensor]], Any], grads: Sequence[torch.Tensor]
            ) -> list[tuple[str, tuple[int, ...], float, float]] | None:
    """What backward(grads) computes on the way, or None where it cannot run under the
    recorder (then nothing is learnt: the finding it would widen stands)."""
    recorder = _Recorder()
    try:
        with recorder:
            backward(list(grads))
    except Exception:  # noqa: BLE001 - it ran before without the recorder: a measurement lost
        return None
    return recorder.seen


def terms_scale(backward: Callable[[list[torch.Tensor]], Any],
                grads: Sequence[torch.Tensor]) -> dict[int, float]:
    """Per element count, the largest root-mean-square of a value backward(grads) computes
    that follows grad_output (doubles with it): the size of the terms its sums combine, which
    a gradient that cancels whole is the rounding noise of, wherever they hide (a summed
    softmax's g − g·Σs, each term ~|g| while the result is a few ulps of it), at most
    grad_output's own root-mean-square. A gradient takes those of its own element count (in any shape: a
    kernel's flattened view), so an unrelated larger value elsewhere in backward does not make
    a small but real gradient look like noise. Values that do not follow grad_output (saved
    tensors, a recomputed forward) are not terms of it. Empty where nothing is learnt
    (backward's ops unseen: a compiled kernel's)."""
    # At most grad_output's own scale: a value S·g that backward scales back (t = S·g; t / S)
    # cancels nothing, and taken as a term it let a nonlinearity the size of the gradient
    # itself pass as rounding (review: S = 100 in bfloat16, 1e6 in float32).
    cap = max((float(g.detach().double().pow(2).mean().sqrt()) for g in grads if g.numel()),
              default=0.0)
    once = _record(backward, grads)
    twice = _record(backward, [2 * g for g in grads])
    if not once or twice is None or len(once) != len(twice):
        return {}
    found: dict[int, float] = {}
    for (op1, shape1, r1, s1), (op2, shape2, r2, s2) in zip(once, twice):
        n = math.prod(shape1)
        if (op1, shape1) == (op2, shape2) and r1 > 0 and abs(r2 - 2 * r1) <= FOLLOWS * 2 * r1 \
                and abs(s2 - 2 * s1) <= FOLLOWS * 2 * r1 * n:
            found[n] = max(found.get(n, 0.0), min(r1, cap))
    return found
