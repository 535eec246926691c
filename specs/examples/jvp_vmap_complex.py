"""Custom Functions with more faces than backward: a jvp, a vmap rule, complex numbers."""

from __future__ import annotations

import torch
from torch.autograd import Function


class ScaledTanh(Function):
    """tanh(x) * w with backward and forward-mode jvp."""

    @staticmethod
    def forward(x, w):
        return torch.tanh(x) * w

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w = inputs
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad * (1 - torch.tanh(x) ** 2) * w, grad * torch.tanh(x)

    @staticmethod
    def jvp(ctx, dx, dw):
        x, w = ctx.saved_tensors
        return (1 - torch.tanh(x) ** 2) * w * dx + torch.tanh(x) * dw


class Softplus(Function):
    """log(1 + exp(x)); generate_vmap_rule lets torch.func.vmap batch it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.nn.functional.softplus(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


class ComplexExp(Function):
    """exp(z) for complex z: holomorphic, so backward is grad * exp(z).conj()."""

    @staticmethod
    def forward(ctx, z):
        out = torch.exp(z)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out.conj()


class RealToComplex(Function):
    """x -> x * exp(i x): real input, complex output (fft-like)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.exp(1j * x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad * (torch.exp(1j * x) * (1 + 1j * x)).conj()).real
