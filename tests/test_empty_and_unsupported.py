"""Empty tensors anywhere, and derivatives torch does not implement (double backward skipped)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

import gradtool
from conftest import outcomes, result


class EmptySecondOutput(Function):
    """y = 2x, plus an empty second output (as linalg.lstsq's residuals can be)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2, x.new_zeros(0)

    @staticmethod
    def backward(ctx, grad, grad_empty):
        return 2 * grad


class WrongEmptySecondOutput(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x.new_zeros(0)

    @staticmethod
    def backward(ctx, grad, grad_empty):
        return 3 * grad


def empty_input(x, e):
    return x.sin() + e.sum(), e * 3


def empty_output(x):
    return x.sin(), x[:0] * 2


def only_empty(e):
    return e.exp()


@pytest.mark.parametrize("mode", ["full", "probe"])
@pytest.mark.parametrize("target, inputs", [
    (EmptySecondOutput, ["2x3"]), (empty_input, ["2x3", "0x2"]), (empty_output, ["2x4"])])
def test_empty_tensors_beside_others_are_checked(mode, target, inputs):
    report = gradtool.check(target, inputs, mode=mode)
    assert outcomes(report) == {"contract": "passed", "gradient": "passed",
                                "double_backward": "passed", "layout": "passed"}


@pytest.mark.parametrize("mode", ["full", "probe"])
def test_wrong_gradient_beside_an_empty_output_is_caught(mode):
    report = gradtool.check(WrongEmptySecondOutput, ["2x3"], mode=mode)
    assert outcomes(report)["gradient"] == "failed"


def test_only_empty_tensors_is_skipped_saying_so():
    report = gradtool.check(only_empty, ["0x3"])
    assert outcomes(report) == {"contract": "passed", "gradient": "skipped",
                                "double_backward": "skipped"}
    assert "empty" in result(report, "gradient").summary


def cdist(x, y):
    return torch.cdist(x, y)


def cdist_by_hand(x, y):
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1).sqrt()


def _cdist_twice_differentiable() -> bool:
    """torch 2.15 implements _cdist_backward's derivative; earlier torches raise."""
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(torch.cdist(x, x + 1).sum(), x, create_graph=True)
    try:
        torch.autograd.grad(grad.sum(), x)
    except NotImplementedError:
        return False
    return True


def test_derivative_torch_does_not_implement_skips_double_backward_in_torchs_words():
    report = gradtool.check(cdist, ["4x3", "5x3"])
    if _cdist_twice_differentiable():
        # where torch differentiates it, its double backward passes — though torch's vmap of
        # it reuses the first grad_output for a batch (a batch is trusted per input)
        assert outcomes(report)["double_backward"] == "passed"
        return
    assert outcomes(report) == {"contract": "passed", "gradient": "passed",
                                "double_backward": "skipped", "layout": "passed"}
    summary = result(report, "double_backward").summary
    assert "the derivative for '_cdist_backward' is not implemented" in summary


def test_same_distance_written_differentiably_passes_double_backward():
    report = gradtool.check(cdist_by_hand, ["4x3", "5x3"])
    assert outcomes(report)["double_backward"] == "passed"


class RaisesOtherwiseInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # only when differentiated again
            raise RuntimeError("some other failure in double backward")
        return 2 * x * grad


def test_other_double_backward_exceptions_are_unsupported_warnings():
    # raised only when differentiated (issue 48): double backward unsupported, a warning
    # naming @once_differentiable, not an error that fails the run
    report = gradtool.check(RaisesOtherwiseInBackward, ["3x2"])
    assert outcomes(report)["double_backward"] == "skipped"
    check = next(k for _, _, k in report.checks() if k.name == "double_backward")
    assert [f.rule for f in check.warnings] == ["double_backward.unsupported"]
