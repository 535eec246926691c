"""A forward that computes coarser than the dtype it is given is a finding of its own
(gradient.forward_precision, silenceable), its gradient judged at the precision it has: a wrong
backward fails, an exact one is not left "inconclusive"."""

from __future__ import annotations

import torch

import gradtool
from conftest import load_fixture, outcomes, result
from gradtool.numerics.coarse import coarse_dtype

F = load_fixture("precision_loss")
LOSS = ["6:float64", "6:float64"]


def _rules(check):
    return {f.rule for f in check.findings}


def test_the_exact_twin_passes():
    assert result(gradtool.check(F.SquaredLoss.apply, LOSS), "gradient").outcome.value == "passed"


def test_a_float32_rounding_forward_given_float64_is_its_own_finding():
    check = result(gradtool.check(F.SquaredLossFloat32.apply, LOSS, checks=["gradient"]),
                   "gradient")
    assert check.outcome.value == "failed"
    assert _rules(check) == {"gradient.forward_precision"}
    data = next(iter(check.findings)).data
    assert (data["given"], data["computes_in"]) == ("float64", "float32")
    assert not any(b.mismatched for b in check.blocks)  # its gradient is right at float32


def test_ignoring_the_finding_passes_the_exact_gradient():
    check = result(gradtool.check(F.SquaredLossFloat32.apply, LOSS, checks=["gradient"],
                                  ignore=("gradient.forward_precision",)), "gradient")
    assert check.outcome.value == "passed"


def test_a_wrong_backward_behind_a_float32_forward_fails_with_its_diagnosis():
    check = result(gradtool.check(F.SquaredLossFloat32Wrong.apply, LOSS, checks=["gradient"],
                                  ignore=("gradient.forward_precision",)), "gradient")
    assert check.outcome.value == "failed"
    assert {"gradient.mismatch", "gradient.factor"} <= _rules(check)
    bad = [b for b in check.blocks if b.mismatched]
    assert [b.input for b in bad] == ["x"]  # y's gradient is right
    factor = next(f for f in check.findings if f.rule == "gradient.factor")
    assert abs(factor.data["factor"] - 2) < 1e-3


def test_coarse_dtype_is_detected_not_assumed():
    x = torch.randn(20, dtype=torch.float64)
    assert coarse_dtype([x], torch.float64) is None
    assert coarse_dtype([x.float().double()], torch.float64) == torch.float32
    assert coarse_dtype([x.half().double()], torch.float64) == torch.float16
    assert coarse_dtype([x.bfloat16().double()], torch.float64) == torch.bfloat16
    assert coarse_dtype([torch.tensor([0., 1., 2.5, -3.], dtype=torch.float64)],
                        torch.float64) is None  # simple values prove nothing
    assert coarse_dtype([x.float()], torch.float32) is None


def test_a_float32_kernel_checked_in_float32_passes_every_check():
    report = gradtool.check(F.Float32Tanh, ["3x4:float32"])
    assert set(outcomes(report).values()) == {"passed"}, str(report)


def test_its_exact_second_derivative_passes_given_float64():
    report = gradtool.check(F.Float32Tanh, ["3x4:float64"], checks=["double_backward"])
    assert outcomes(report) == {"double_backward": "passed"}, str(report)


def test_a_wrong_second_derivative_of_a_float32_kernel_fails_in_both_dtypes():
    for dtype in ("float64", "float32"):
        check = result(gradtool.check(F.Float32TanhDetached, [f"3x4:{dtype}"],
                                      checks=["double_backward"]), "double_backward")
        assert check.outcome.value == "failed", dtype
        assert {"double_backward.mismatch", "double_backward.untracked"} <= _rules(check)


def test_a_forward_wrong_at_one_dtype_fails_and_its_exact_twin_passes():
    # float64 activations rounded to float16 inside (a quantised layer's dequantisation):
    # never "inconclusive", whichever backward
    assert outcomes(gradtool.check(F.Linear, ["2x4:float64"], checks=["gradient"])) == \
        {"gradient": "passed"}
    for layer in (F.QuantisedLinear, F.QuantisedLinearWrong):
        got = outcomes(gradtool.check(layer, ["2x4:float64"], checks=["gradient"]))
        assert got == {"gradient": "failed"}, layer.__name__
