"""A QP-like layer at an active bound: the correct layer passes every check in float64 and
float32, the twin whose backward forgets the active set fails; and a layout difference too
small to show in six digits is reported with its size and bound."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import load_fixture, outcomes, result
from gradtool.checks.layout import difference

F = load_fixture("active_set")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_active_set_layer_passes_every_check(dtype):
    R, p = F.inputs()
    report = gradtool.check(F.BoxQP, [R.to(dtype).requires_grad_(), p.to(dtype).requires_grad_()])
    assert set(outcomes(report).values()) == {"passed"}, str(report)


def test_the_twin_forgetting_the_active_set_fails_its_gradient():
    R, p = F.inputs()
    check = result(gradtool.check(F.BoxQPForgetsActiveSet, [R.requires_grad_(),
                                                            p.requires_grad_()],
                                  checks=["gradient"]), "gradient")
    assert check.outcome.value == "failed"
    assert {b.input for b in check.blocks if b.mismatched} == {"R", "p"}


def test_a_layout_difference_says_its_size_when_six_digits_hide_it():
    want = torch.tensor([2.66993e-07, 2.0e-07], dtype=torch.float64)
    have = want.clone()
    have[0] = have[0] * (1 + 1e-7)  # equal in six digits, far beyond float64's rounding
    text = difference(have, want, 0.0, "p", 0.0, 0.0)
    assert text is not None and "differing by" in text and "allowed" in text


def test_a_layout_difference_never_prints_equal_values():
    want = torch.tensor([2.66993e-07, 1e-6], dtype=torch.float64)
    have = want.clone()
    have[0] = have[0] + 3e-19  # equal in 12 digits, beyond what the comparison allows
    text = difference(have, want, 0.0, "p", 0.0, 0.0)
    shown = text.split(": ", 1)[1].split(" (")[0]
    value, contiguous = shown.split(", contiguous ")
    assert value != contiguous and float(value) == have[0].item(), text


def test_the_active_set_layer_with_transposed_inputs_passes_layout():
    R, p = F.inputs()
    for dtype in (torch.float64, torch.float32):
        Rt = R.to(dtype).T.contiguous().T.requires_grad_()  # column-major, same values
        report = gradtool.check(F.BoxQP, [Rt, p.to(dtype).requires_grad_()],
                                checks=["layout", "gradient"])
        assert set(outcomes(report).values()) == {"passed"}, str(report)
