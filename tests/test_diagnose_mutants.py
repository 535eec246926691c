"""Diagnosis end to end: swapped gradients and constant terms named even on scalar blocks,
rolls and non-square transposes named through gradtool.check."""

from __future__ import annotations

from conftest import result
from torch.autograd import Function

import gradtool


def _diagnoses(target, inputs):
    check = result(gradtool.check(target, inputs, checks=["gradient"]), "gradient")
    assert check.outcome.value == "failed"
    return " | ".join(b.diagnosis or "" for b in check.blocks if b.mismatched)


class ScalarSwap(Function):
    """f(x, y) = x * y**2 on scalars; backward returns the two gradients swapped."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y ** 2

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * 2 * x * y, g * y ** 2


class DotPlusConstant(Function):
    """a scalar output (one Jacobian row): backward adds 0.01 to a's gradient."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return (a * b).sum()

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b + 0.01, g * a


class MatMulRolled(Function):
    """a @ b; a's gradient rolled by two along its first axis."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (g @ b.T).roll(2, dims=0), a.T @ g


class MatMulTransposedReshaped(Function):
    """a (3, 5) @ b; a's gradient computed transposed and laid back into (3, 5)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (g @ b.T).t().reshape(a.shape), a.T @ g


def test_swapped_scalar_gradients_are_named():
    assert "swapped" in _diagnoses(ScalarSwap, ["()", "()"])


def test_a_constant_term_on_a_scalar_output_is_named():
    assert "constant term" in _diagnoses(DotPlusConstant, ["(5,)", "(5,)"])


def test_a_rolled_gradient_is_named():
    text = _diagnoses(MatMulRolled, ["5x6", "6x3"])
    assert "rolled by +2 along input axis 0" in text, text


def test_a_non_square_transpose_laid_back_into_shape_is_named():
    text = _diagnoses(MatMulTransposedReshaped, ["3x5", "5x2"])
    assert "transposed" in text and "laid back" in text


def test_correct_twins_pass():
    class Dot(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return (a * b).sum()

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a

    check = result(gradtool.check(Dot, ["(5,)", "(5,)"], checks=["gradient"]), "gradient")
    assert check.outcome.value == "passed"
