"""Autograd Functions and forwards that the graph tests record (line numbers are in goldens)."""

from __future__ import annotations

import torch


class LinearFunction(torch.autograd.Function):
    """y = x W^T + b, the extending-autograd tutorial's example."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        ctx.has_bias = bias is not None
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, _ = ctx.saved_tensors
        grad_bias = grad_output.sum(0) if ctx.has_bias else None
        return grad_output.mm(weight), grad_output.t().mm(input), grad_bias


class NanForSecond(torch.autograd.Function):
    """x * y whose backward returns NaN for y: the node --grads must point at."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, torch.full_like(x, float("nan"))


def linear(input, weight, bias):
    return LinearFunction.apply(input, weight, bias)


def square_cube(x, y):
    return x**2 + y**3


def nan_then_sum(x, y):
    return (NanForSecond.apply(x, y) * 2).sum()


def shared(x):
    s = x.sin()
    return s * s.exp()


def chain(x, n: int):
    for _ in range(n):
        x = x + 1.0
    return x


def alternating(x, n: int):
    for i in range(n):
        x = x * 1.0001 if i % 2 else x + 1.0
    return x


def residual(x, n: int):
    for _ in range(n):
        x = x + x.sin()
    return x


class RaisingBackward(torch.autograd.Function):
    """A backward that raises: --grads reports it instead of crashing."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward is not implemented")


def raising(x):
    return RaisingBackward.apply(x).sum()


def rounded(x):
    return torch.round(x * 3).sum()


def cancels(x):
    return (x * 2) - (x + x)


def _double(grad):
    return grad * 2


def hooked(x):
    y = x.exp()
    y.register_hook(_double)
    return y.sum()


def made_inside(x):
    w = torch.ones(x.shape, dtype=x.dtype, requires_grad=True)
    return x * w


def two_outputs(x):
    a = x.exp()
    return a, a * 2


def quoted(x):
    return x * 2  # a "quoted" <b>label</b> #1 with a \ backslash {braces} [brackets] |pipe|
