"""Targets that need inputs gradtool cannot sample: a tuple state, a mask= keyword, unit vectors."""

from __future__ import annotations

import torch
from torch import nn


class GatedCell(nn.Module):
    """A recurrent cell taking (x, (h, c)), like nn.LSTMCell."""

    def __init__(self, size: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        h, c = state
        new_c = torch.tanh(self.linear(x) + h) * c
        return torch.sigmoid(new_c), new_c


class MaskedLinear(nn.Module):
    """A linear layer whose output is scaled by a soft mask given as a keyword."""

    def __init__(self, size: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.linear(x)
        return y if mask is None else y * mask


class SphereProject(torch.autograd.Function):
    """x / |x| row-wise; backward assumes |x| == 1, so it is right on unit vectors only."""

    @staticmethod
    def forward(ctx, x):
        y = x / x.norm(dim=-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad - y * (grad * y).sum(-1, keepdim=True)  # the tangent projection


def unit_vectors(generator=None, dtype=torch.float64, device="cpu"):
    """An input factory: the positional arguments, rows of unit length."""
    x = torch.randn(3, 4, generator=generator, dtype=dtype)
    return ((x / x.norm(dim=-1, keepdim=True)).to(device),)
