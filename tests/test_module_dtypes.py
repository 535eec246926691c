"""A module's parameters and buffers in the check's dtype: complex ones stay complex (found on
torchkbnufft, whose interpolation tables are complex buffers: module.to(float64) made them real,
so forward ran on values the user never has and view_as_real raised, blamed on the user)."""

from __future__ import annotations

import copy

import pytest
import torch

import gradtool

W = [1 + 2j, 3 - 1j, -0.5 + 0.25j]


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w.real + x * x * w.imag

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * (w.real + 2 * x * w.imag), None


class _MulNoImag(_Mul):
    @staticmethod
    def backward(ctx, g):  # misses 2 x w.imag: invisible where w's imaginary part is dropped
        _, w = ctx.saved_tensors
        return g * w.real, None


class ViewsComplexBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.tensor(W, dtype=torch.complex128))

    def forward(self, x):
        wr = torch.view_as_real(self.w)  # raises on a real tensor
        return x * wr[:, 0] + x ** 2 * wr[:, 1]


class ComplexBufferFunction(torch.nn.Module):
    function = _Mul

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.tensor(W, dtype=torch.complex64))

    def forward(self, x):
        return self.function.apply(x, self.w)


class ComplexBufferFunctionWrong(ComplexBufferFunction):
    function = _MulNoImag


def outcomes(report):
    return {check.name: check.outcome.value for _, _, check in report.checks()}


@pytest.mark.parametrize("target", [ViewsComplexBuffer, ViewsComplexBuffer(),
                                    ComplexBufferFunction, ComplexBufferFunction()])
def test_complex_buffers_stay_complex(target):
    found = outcomes(gradtool.check(target, ["4x3"]))
    assert found["contract"] == found["gradient"] == "passed", found


@pytest.mark.parametrize("target", [ComplexBufferFunctionWrong, ComplexBufferFunctionWrong()])
def test_a_backward_wrong_in_the_imaginary_part_fails(target):
    report = gradtool.check(target, ["4x3"])
    assert outcomes(report)["gradient"] == "failed", report.text()
    assert "_MulNoImag" in report.text()


def test_the_users_complex_buffer_is_untouched_and_follows_the_precision():
    module = ComplexBufferFunction()
    before = copy.deepcopy(module.w)
    seen = []
    module.register_forward_pre_hook(lambda m, args: seen.append(m.w.dtype))
    gradtool.check(module, ["4x3"], checks=["gradient"])
    assert module.w.dtype == torch.complex64 and torch.equal(module.w, before)
    assert set(seen) == {torch.complex128}  # float64 check: complex64 becomes complex128


def test_cast_dtype():
    from gradtool.targets.cases import cast_dtype

    assert cast_dtype(torch.zeros(1), torch.float64) == torch.float64
    assert cast_dtype(torch.zeros(1, dtype=torch.complex64), torch.float64) == torch.complex128
    assert cast_dtype(torch.zeros(1, dtype=torch.complex128), torch.float32) == torch.complex64
    assert cast_dtype(torch.zeros(1, dtype=torch.complex64), torch.bfloat16) == torch.complex64
    assert cast_dtype(torch.zeros(1, dtype=torch.int64), torch.float32) == torch.int64
