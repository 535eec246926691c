"""Values reach the user's code alone in their storage: as_strided-family ops address storage."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import outcomes
from gradtool.targets.inputs import TensorSpec


def window(x):
    """Overlapping 2x2 windows from storage offset 1: depends on where x's storage begins."""
    return torch.as_strided(x, (2, 2), (1, 2), 1).exp()


def window_wrong(x):
    return torch.as_strided(x, (2, 2), (1, 2), 1).exp().detach() + x[1:5].view(2, 2) * 0.5


@pytest.mark.parametrize("mode", ["full", "probe"])
def test_as_strided_checks_agree_with_gradcheck(mode):
    # Perturbed values were rows of one batch (views at storage offsets): as_strided read the
    # neighbouring row, and double backward failed where gradgradcheck passes.
    report = gradtool.check(window, [TensorSpec((6,))], mode=mode)
    assert outcomes(report) == {"contract": "passed", "gradient": "passed",
                                "double_backward": "passed", "layout": "passed"}
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(window, (x,))


def test_a_wrong_gradient_through_as_strided_is_still_caught():
    report = gradtool.check(window_wrong, [TensorSpec((6,))], mode="full")
    assert outcomes(report)["gradient"] == "failed"
