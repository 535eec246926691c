"""A forward that computes coarser than the dtype it is given is a finding of its own
(gradient.forward_precision, silenceable), its gradient judged at the precision it has: a wrong
backward fails, an exact one is not left "inconclusive"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradtool
from conftest import load_fixture, outcomes, result
from gradtool.numerics.coarse import coarse_dtype
from gradtool.results import Outcome

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


def test_a_model_that_is_one_float32_function_names_it_without_checking_it_alone(monkeypatch):
    """Its blocks are the Function's rows: a failure the forward's precision explains (no
    wrong element) names the Function from the model's own check, as a mismatch does, instead
    of a second gradient check of it alone (a numba kernel's 150 forwards)."""
    from gradtool.run import culprit

    seen: list[str] = []
    real = culprit.check_application
    monkeypatch.setattr(culprit, "check_application",
                        lambda app, *a, **k: seen.append(app.cls.__qualname__) or
                        real(app, *a, **k))
    x, y = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    alone = result(gradtool.check(F.SquaredLossFloat32.apply, (x, y), checks=["gradient"]),
                   "gradient")
    for fn in (lambda a, b: F.SquaredLossFloat32.apply(a, b),  # the Function is the model
               lambda a, b: F.SquaredLossFloat32.apply(a, b) * 2):  # code around it
        check = result(gradtool.check(fn, (x, y), checks=["gradient"]), "gradient")
        assert check.outcome is alone.outcome is Outcome.FAILED
        assert _rules(check) == _rules(alone) == {"gradient.forward_precision"}
        assert check.source == alone.source
    assert seen == ["SquaredLossFloat32"]  # only the model with code around it searched
    whole = result(gradtool.check(lambda a, b: F.SquaredLossFloat32.apply(a, b), (x, y),
                                  checks=["gradient"]), "gradient")
    named = next(d for d in whole.details if d.startswith("SquaredLossFloat32 at "))
    assert "fails gradient.forward_precision w.r.t. x, y (backward at" in named
    assert named.split(" at ")[1].startswith("tests/test_precision_loss.py:")
    assert whole.details[-1].startswith("not re-checked alone: the model is SquaredLossFloat32")
    # and the correct twin still passes as a model
    assert gradtool.check(lambda a, b: F.SquaredLoss.apply(a, b), (x, y)).ok()


@pytest.mark.slow  # a fresh interpreter reading stdin: nothing in its frames has a file
def test_a_function_applied_from_code_without_a_file_is_named_there_not_in_gradtools_hook():
    """stdin's code has no file; gradtool's hook forward has none either and is gradtool's
    own frame: the site named is the user's line, not the hook's."""
    script = ("import sys, torch, gradtool\n"
              f"sys.path.insert(0, {str(Path(__file__).parent / 'fixtures')!r})\n"
              "import precision_loss as F\n"
              "x, y = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)\n"
              "f = lambda a, b: F.SquaredLossFloat32.apply(a, b)\n"
              "print(gradtool.check(f, (x, y), checks=['gradient']))\n")
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert "SquaredLossFloat32 at <stdin>:5 fails gradient.forward_precision" in out, out
    assert "gradtool hook" not in out
