"""The seeded random vectors the probes draw: probe mode's directions u and cotangents v
(numerics/probe.py), forward mode's direction and cotangent (numerics/forward.py). Kept apart
from those engines so that the drop-in's lean path (dropin/lean.py, lean_forward.py) draws the
same vectors without importing the full and probe engines on a passing call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..config.settings import CheckConfig
    from .problem import Problem


def probe_vectors(problem: Problem, outs: Sequence[torch.Tensor], config: CheckConfig,
                  seed: int) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Seeded directions u and cotangents v, every entry in ±[1, 2): no tiny entry that would
    hide an element, and continuous, so no exact cancellation between two elements."""
    # One direction already makes an exact cancellation a probability-0 event; two cotangents
    # square the chance of a near one. More probes, more directions.
    n_dirs, n_cots = max(1, config.probes // 4), min(config.probes, 2)
    values = [x.detach() for x in problem.inputs]
    sizes = [x.numel() for x in values]
    n_in, n_out = sum(sizes), sum(o.numel() for o in outs)
    drawn, v = _drawn(seed, n_dirs * n_in, n_out, n_cots, values[0].dtype, values[0].device)
    u = [[d.view(x.shape) for d, x in zip(drawn[k * n_in:(k + 1) * n_in].split(sizes), values)]
         for k in range(n_dirs)]
    return u, v


DRAWN_KEEP, DRAWN_MAX = 64, 4096  # entries kept; elements per draw worth keeping


class Kept(dict):
    """Draws kept by key, DRAWN_KEEP at most (the oldest dropped), those of DRAWN_MAX
    elements or fewer: a suite's many tiny calls draw the same few vectors over and over (the
    generator's setup and the draw cost ~10 small-tensor operations, a tenth of a tiny probe
    check). Callers hand out copies (user code receives v as grad_output, and may write it)."""

    def drawn(self, key: Any, size: int, draw: Callable[[], Any]) -> Any:
        kept = self.get(key)
        if kept is None:
            kept = draw()
            if size <= DRAWN_MAX:
                if len(self) >= DRAWN_KEEP:
                    self.pop(next(iter(self)))
                self[key] = kept
        return kept


_DRAWN = Kept()


def _drawn(seed: int, n_u: int, n_out: int, n_cots: int, dtype: torch.dtype,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The draw the directions are read from, and the (n_cots, n_out) cotangents: fresh copies."""
    size = max(n_u, n_out + 1)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed + 7919)
        # The generator costs more than a forward at 1e5 elements, so one draw serves u and v:
        # v is the draw read from an offset (rotated), so each output weight comes from another
        # position than the input weights it meets in an elementwise op, and stays independent.
        drawn = _uniform(size, gen, torch.empty((), dtype=dtype, device=device))
        shift = max(1, n_out // 2)
        return drawn, torch.stack([drawn.roll(shift + k)[:n_out] for k in range(n_cots)])

    kept = _DRAWN.drawn((seed, n_u, n_out, n_cots, dtype, device), size, draw)
    return kept[0].clone(), kept[1].clone()


def _uniform(size: int, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """±[1, 2) in like's dtype and on its device, from float32 draws on the CPU (half the
    generator's and the memory's work of float64; the same probes on every device)."""
    r = torch.rand(size, generator=gen, dtype=torch.float32, device="cpu").mul_(2)   # [0, 2)
    return torch.where(r < 1, r - 2, r).to(like)                  # [-2, -1) ∪ [1, 2)


def direction(v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """±[1, 2) per element in v's shape, dtype and device: no element hidden by a tiny weight."""
    return _uniform(v.numel(), gen, v).view(v.shape)
