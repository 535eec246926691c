"""A gradient that cancels to rounding noise (an output constant over its input) is judged at
the scale of the terms that cancel, measured: no contract.nonlinear, layout or measured-tolerance
false alarm on normalisations at sizes 1 and 2, while a real nonlinearity still fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradtool
from conftest import load_fixture, outcomes, result

F = load_fixture("cancelled")
NORMS = [(lambda: nn.LayerNorm(2), "4x2"), (lambda: nn.RMSNorm(1, eps=1e-6), "4x1"),
         (lambda: nn.GroupNorm(2, 2), "3x2x1"), (lambda: F.CentredScaled, "4x2")]


@pytest.mark.parametrize("make, shape", NORMS, ids=["layer_norm", "rms_norm", "group_norm",
                                                    "function"])
def test_constant_outputs_keep_the_contract_and_layouts_in_float32(make, shape):
    for seed in range(3):
        report = gradtool.check(make(), [shape], dtype="float32", seed=seed,
                                checks=["contract", "layout"])
        assert set(outcomes(report).values()) <= {"passed", "skipped"}, str(report)


def test_a_real_nonlinearity_on_a_constant_output_still_fails():
    check = result(gradtool.check(F.CentredScaledNonlinear, ["4x2"], dtype="float32",
                                  checks=["contract"]), "contract")
    assert [f.rule for f in check.findings] == ["contract.nonlinear"], check.summary


def test_a_cancelled_float64_gradient_is_not_failed_by_the_measured_tolerance():
    # LayerNorm over one element: the weight's gradient is rounding noise (~1e-14), finite
    # differences exactly 0; it failed "gradient.mismatch" before
    report = gradtool.check(nn.LayerNorm(1), ["4x1"], checks=["gradient"])
    assert outcomes(report) == {"gradient": "passed"}, str(report)
    assert torch.get_default_dtype() == torch.float32
