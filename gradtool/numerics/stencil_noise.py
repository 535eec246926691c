"""f's noise over the measured tolerance's stencils (x + m h e_c, m = -3..3): per element from
its fourth differences, pooled over columns and over the elements of an output tensor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Pooled:
    """f's noise pooled over the measured columns: per output element (its variance summed over
    columns), and per output tensor over the elements that moved in a column (the noise of the
    terms its elements compute, which an element's own stencil can miss)."""

    row_sum: torch.Tensor     # per output element: sigma^2 summed over the measured columns
    columns: int
    block_sum: torch.Tensor   # per output tensor: sigma^2 summed over the moving elements
    block_n: torch.Tensor     # per output tensor: how many moved

    @staticmethod
    def empty(f0: torch.Tensor, blocks: int) -> Pooled:
        zeros = torch.zeros(blocks, dtype=torch.float64, device=f0.device)
        return Pooled(torch.zeros_like(f0, dtype=torch.float64), 0, zeros, zeros.clone())

    def add(self, points: torch.Tensor, sigma2: torch.Tensor, bounds: Sequence[int]) -> Pooled:
        moved = (points != points[3]).any(0) & torch.isfinite(sigma2)  # (columns, n_out)
        block = _block_of(torch.arange(sigma2.shape[1], device=sigma2.device), bounds)
        block = block.expand_as(sigma2)[moved]
        return Pooled(self.row_sum + sigma2.sum(0), self.columns + sigma2.shape[0],
                      self.block_sum.index_add(0, block, sigma2[moved]),
                      self.block_n.index_add(0, block, torch.ones_like(sigma2[moved])))

    def cancelled(self, p: torch.Tensor, sigma: torch.Tensor, r: torch.Tensor,
                  bounds: Sequence[int], k: float) -> torch.Tensor:
        """Each element's noise, at least its output tensor's where the element's output is
        constant over the stencil at that noise: a gradient that cancels (a normalisation over
        one element, f ~ 0 while its terms are ~1e2) can show its rounding as an exactly
        linear drift, so its own fourth differences see none; a real gradient moves f by
        6h|D|, beyond k of that noise, and keeps its own."""
        block = _block_of(r, bounds)
        noise = (self.block_sum / self.block_n.clamp_min(1)).sqrt()[block]
        constant = (p[-1] - p[0]).abs() <= k * noise
        return torch.where(constant, torch.maximum(sigma, noise), sigma)


def _block_of(rows: torch.Tensor, bounds: Sequence[int]) -> torch.Tensor:
    """The output tensor each flat output row belongs to."""
    inner = torch.tensor(list(bounds[1:-1]), dtype=rows.dtype, device=rows.device)
    return torch.bucketize(rows, inner, right=True)



def fourth_differences(p: torch.Tensor) -> torch.Tensor:
    """Per (column, output): mean square of the three fourth differences over 7 points / 70,
    an estimate of f's noise variance (sigma^2)."""
    w = torch.tensor([1.0, -4.0, 6.0, -4.0, 1.0], dtype=p.dtype, device=p.device)
    d4 = torch.stack([torch.tensordot(w, p[s:s + 5], dims=1) for s in range(3)])
    return (d4.nan_to_num(nan=math.inf) ** 2).mean(0) / 70.0
