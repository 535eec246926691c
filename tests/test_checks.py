"""gradient and double_backward on the seed examples, their buggy twins, kinks and randomness."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import EXAMPLES, outcomes, result


@pytest.mark.parametrize("target", [
    "linear.py:LinearFunction", "linear.py:LinearFunctionSetup", "mul_constant.py:MulConstant",
    "cube.py:my_cube", "legendre.py:LegendrePolynomial3", "elementwise.py:F",
    "elementwise.py:LayerWithCustomGrad",
])
def test_seed_examples_pass_by_inference(target):
    report = gradtool.check(str(EXAMPLES / target))
    assert set(outcomes(report).values()) == {"passed"}, outcomes(report)
    case = report.targets[0].cases[0]
    assert case.inferred and case.inputs


def test_module_parameters_are_checked_by_name():
    report = gradtool.check(str(EXAMPLES / "elementwise.py:LayerWithCustomGrad"))
    case = report.targets[0].cases[0]
    assert [i.name for i in case.inputs] == ["x", "weights"]
    blocks = result(report, "gradient").blocks
    assert {b.input for b in blocks} == {"x", "weights"}


def test_notebook_mul_constant_names_the_element_values():
    report = gradtool.check(str(EXAMPLES / "mul_constant.py:MulConstantUnscaled"), ["3x3", "5"])
    check = result(report, "gradient")
    assert check.outcome.value == "failed"
    block = next(b for b in check.blocks if b.mismatched)
    assert block.mismatched == 9 and block.checked == 81
    element = block.worst[0]
    assert element.analytical == pytest.approx(1.0)
    assert element.numerical == pytest.approx(5.0)
    assert "factor 5" in block.diagnosis
    assert "--seed 0" in report.targets[0].cases[0].reproduce


def test_cube_without_second_order_term_fails_double_backward_only(contract_cases):
    report = gradtool.check(contract_cases.my_cube_no_second_order, ["3x4"])
    got = outcomes(report)
    assert got["gradient"] == "passed"
    assert got["double_backward"] == "failed"


def test_a_second_order_diagnosis_names_elements_in_their_shapes():
    class RootBackward(torch.autograd.Function):  # backward's sqrt(|x|) has no derivative at 0
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (1 + (x - x.detach()).abs().sqrt())

    report = gradtool.check(RootBackward, ["3x4"], checks=["double_backward"])
    check = result(report, "double_backward")
    assert check.outcome.value == "failed"
    diagnosis = check.blocks[0].diagnosis or ""
    assert "NaN/inf" in diagnosis and "first (0,0)->(0,0)" in diagnosis, diagnosis


def test_saved_intermediate_loses_second_derivative(contract_cases):
    report = gradtool.check(contract_cases.CubeSavedIntermediate, ["(6,)"])
    check = result(report, "double_backward")
    assert check.outcome.value == "failed"
    assert "zero" in (check.blocks[0].diagnosis or "")


def test_once_differentiable_is_skipped_with_reason(contract_cases):
    report = gradtool.check(contract_cases.CubeOnce, ["(6,)"])
    check = result(report, "double_backward")
    assert check.outcome.value == "skipped"
    assert "once_differentiable" in check.summary
    assert outcomes(report)["gradient"] == "passed"


def _first_sample(n: int, seed: int = 0) -> torch.Tensor:
    """The values gradtool samples for a real (n,) input under `seed`."""
    return torch.randn((n,), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_relu_exactly_at_zero_is_inconclusive_and_resample_passes():
    kink = _first_sample(5)[2].item()

    def relu_at_sample(x):
        return torch.relu(x - kink)  # x[2] - kink is exactly 0 under seed 0

    check = result(gradtool.check(relu_at_sample, ["(5,)"], checks=("gradient",)), "gradient")
    assert check.outcome.value == "inconclusive"
    assert "x[2]" in " ".join(check.details)
    again = gradtool.check(relu_at_sample, ["(5,)"], checks=("gradient",), resample=2)
    assert outcomes(again)["gradient"] == "passed"
    assert "resampled" in " ".join(again.targets[0].cases[0].notes)


def test_max_with_a_tie_is_inconclusive():
    other = _first_sample(4)

    def tied(x):
        # max over dim 0 sends the whole gradient to one of the tied entries (index 0 here),
        # while central differences see half: only one-sided estimates reveal the tie.
        return torch.stack([x, other]).max(dim=0).values

    report = gradtool.check(tied, ["(4,)"], checks=("gradient",))
    assert outcomes(report)["gradient"] == "inconclusive"
    assert report.ok() and not report.ok(strict=True)


def test_stochastic_forward_is_frozen_and_said(contract_cases):
    report = gradtool.check(contract_cases.Dropoutish, ["3x4"])
    assert set(outcomes(report).values()) == {"passed"}
    assert any("stochastic" in n for n in report.targets[0].cases[0].notes)


def test_probe_mode_passes_correct_and_fails_broken():
    good = gradtool.check(str(EXAMPLES / "legendre.py:LegendrePolynomial3"), ["(2000,)"],
                          mode="probe", checks=("gradient",))
    assert outcomes(good)["gradient"] == "passed"
    assert result(good, "gradient").mode == "probe"
    bad = gradtool.check(str(EXAMPLES / "mul_constant.py:MulConstantUnscaled"),
                         ["(2000,)", "5"], mode="probe", checks=("gradient",))
    check = result(bad, "gradient")
    assert check.outcome.value == "failed"
    element = next(b for b in check.blocks if b.mismatched).worst[0]
    assert element.analytical == pytest.approx(1.0)
    assert element.numerical == pytest.approx(5.0)


def test_auto_mode_says_which_mode_ran_and_why():
    check = result(gradtool.check(str(EXAMPLES / "legendre.py:LegendrePolynomial3"), ["(8,)"],
                                  checks=("gradient",)), "gradient")
    assert check.mode == "full" and "predicted" in check.mode_reason


def test_forward_raising_is_an_error_reported_once(tmp_path):
    module = tmp_path / "raises.py"
    module.write_text("import torch\n\nclass Boom(torch.autograd.Function):\n"
                      "    @staticmethod\n    def forward(ctx, x):\n"
                      "        raise ValueError('boom in forward')\n\n"
                      "    @staticmethod\n    def backward(ctx, g):\n        return g\n")
    report = gradtool.check(f"{module}:Boom", ["3x4"])
    got = outcomes(report)
    assert got["contract"] == "error" and not report.ok()
    assert got["gradient"] == got["double_backward"] == "skipped"  # not repeated per check
    assert "the same error as under contract" in result(report, "gradient").summary


def test_empty_tensors_are_skipped_not_errors():
    report = gradtool.check(str(EXAMPLES / "legendre.py:LegendrePolynomial3"), ["(0,)"])
    got = outcomes(report)
    assert got["gradient"] == got["double_backward"] == "skipped"


def test_float32_input_is_judged_against_float64_within_rounding_bounds():
    report = gradtool.check(str(EXAMPLES / "legendre.py:LegendrePolynomial3"), ["3x4:float32"])
    assert set(outcomes(report).values()) == {"passed"}
    assert result(report, "gradient").tolerance["unit_roundoff"] == 2.0 ** -24


def test_inference_finds_a_domain_and_shapes_where_backward_runs(tmp_path):
    module = tmp_path / "infer_me.py"
    module.write_text(
        "import torch\n\n"
        "class Sqrt(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x):\n"
        "        y = x.sqrt()\n        ctx.save_for_backward(y)\n        return y\n\n"
        "    @staticmethod\n    def backward(ctx, g):\n        (y,) = ctx.saved_tensors\n"
        "        return g / (2 * y)\n\n"
        "class AddBias(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x, b):\n        return x + b\n\n"
        "    @staticmethod\n    def backward(ctx, g):\n        return g, g.sum(0)\n")
    sqrt = gradtool.check(f"{module}:Sqrt")
    assert sqrt.ok() and "positive" in sqrt.targets[0].cases[0].inputs[0].description
    bias = gradtool.check(f"{module}:AddBias")
    assert bias.ok()
    assert [i.description for i in bias.targets[0].cases[0].inputs] == ["3x4:float64",
                                                                        "(4,):float64"]


def test_a_block_too_large_for_a_whole_diagnosis_is_diagnosed_from_its_worst_elements():
    report = gradtool.check(str(EXAMPLES / "mul_constant.py:MulConstantUnscaled"),
                            ["60x60", "5"], mode="full", checks=("gradient",))
    block = next(b for b in result(report, "gradient").blocks if b.mismatched)
    assert "backward misses a factor 5" in block.diagnosis
    assert "worst elements shown" in block.diagnosis
