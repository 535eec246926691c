"""Deliberate non-gradients: a straight-through round, a gradient reversal layer, a clamp STE."""

import torch
from torch.autograd import Function


class RoundSTE(Function):
    """round(x) forward; backward passes grad_output straight through (round's true grad is 0)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class GradientReversal(Function):
    """Identity forward; backward multiplies by -lambda_ (domain-adversarial training)."""

    @staticmethod
    def forward(ctx, x, lambda_):
        ctx.lambda_ = lambda_
        return x.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return -ctx.lambda_ * grad_output, None


class ClampSTE(Function):
    """Quantise to integers in [-1, 1]; backward passes grad_output only where -1 <= x <= 1."""

    LO, HI = -1.0, 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.round(torch.clamp(x, ClampSTE.LO, ClampSTE.HI))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        inside = (x >= ClampSTE.LO) & (x <= ClampSTE.HI)
        return grad_output * inside


def reversal_grad(x, lambda_, grad_output):
    """Oracle for GradientReversal: called as oracle(*inputs, *grad_outputs)."""
    return -lambda_ * grad_output, None
