"""A forward computing coarser than its inputs gets the same verdict in every mode: detected
once per check (not only on full mode's failing path), and probe mode judging at that dtype's
steps and rounding as full mode does. The mode auto picks depends on predicted cost, hence on
machine load: a verdict that changed with it would change with load."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import load_fixture, result

F = load_fixture("precision_loss")
LOSS = ["6:float64", "6:float64"]
PRECISION = "gradient.forward_precision"
# (target, inputs, outcome, rules): right backwards fail by the finding alone, wrong ones by a
# mismatch too; float64 twins are unaffected.
CASES = {
    "loss_float32": (F.SquaredLossFloat32.apply, LOSS, "failed", {PRECISION}),
    "loss_float32_wrong": (F.SquaredLossFloat32Wrong.apply, LOSS, "failed",
                           {PRECISION, "gradient.mismatch", "gradient.factor"}),
    "tanh_float32": (F.Float32Tanh, ["3x4:float64"], "failed", {PRECISION}),
    "tanh_float32_wrong": (F.Float32TanhWrong, ["3x4:float64"], "failed",
                           {PRECISION, "gradient.mismatch"}),
    "loss_float64": (F.SquaredLoss.apply, LOSS, "passed", set()),
    "linear_float64": (F.Linear, ["2x4:float64"], "passed", set()),
}
MODES = ("full", "probe", "auto")


def _rules(check):
    return {f.rule for f in check.findings}


@pytest.mark.parametrize("name", CASES)
def test_the_verdict_and_its_rules_are_the_same_in_every_mode(name):
    fn, inputs, outcome, rules = CASES[name]
    for mode in MODES:
        check = result(gradtool.check(fn, inputs, checks=["gradient"], mode=mode), "gradient")
        assert (check.outcome.value, _rules(check) & (rules | {PRECISION, "gradient.mismatch"})
                ) == (outcome, rules), (mode, str(check))


@pytest.mark.parametrize("name", ["loss_float32", "tanh_float32"])
def test_ignoring_the_finding_passes_a_right_backward_in_every_mode(name):
    fn, inputs, _, _ = CASES[name]
    for mode in MODES:
        check = result(gradtool.check(fn, inputs, checks=["gradient"], mode=mode,
                                      ignore=(PRECISION,)), "gradient")
        assert check.outcome.value == "passed", (mode, str(check))


@pytest.mark.parametrize("name", ["loss_float32_wrong", "tanh_float32_wrong"])
def test_ignoring_the_finding_still_fails_a_wrong_backward_in_every_mode(name):
    fn, inputs, _, _ = CASES[name]
    for mode in MODES:
        check = result(gradtool.check(fn, inputs, checks=["gradient"], mode=mode,
                                      ignore=(PRECISION,)), "gradient")
        assert check.outcome.value == "failed" and "gradient.mismatch" in _rules(check), mode


def test_the_forward_is_detected_once_at_one_forward_at_most():
    # a float64 forward's outputs are not float32 numbers: no forward more than before
    plain = gradtool.check(F.SquaredLoss.apply, LOSS, checks=["gradient"], mode="probe")
    coarse = gradtool.check(F.SquaredLossFloat32.apply, LOSS, checks=["gradient"], mode="probe")
    calls = [result(r, "gradient").calls["forward"] for r in (plain, coarse)]
    assert calls[1] <= calls[0] + 1, calls


@pytest.mark.parametrize("fixture,fails", [("Float32Tanh", False), ("Float32TanhDetached", True)])
def test_double_backward_of_a_float32_kernel_is_the_same_in_every_mode(fixture, fails):
    for mode in MODES:
        check = result(gradtool.check(getattr(F, fixture), ["3x4:float64"], mode=mode,
                                      checks=["double_backward"]), "double_backward")
        assert check.outcome.value == ("failed" if fails else "passed"), (mode, str(check))
        if fails:
            assert {"double_backward.mismatch", "double_backward.untracked"} <= _rules(check)


def _args(name):
    gen = torch.Generator().manual_seed(0)
    shapes = [(6,), (6,)] if name.startswith("loss") else [(3, 4)]
    return tuple(torch.randn(s, dtype=torch.float64, generator=gen, requires_grad=True)
                 for s in shapes)


@pytest.mark.parametrize("name", ["loss_float32", "tanh_float32", "loss_float32_wrong",
                                  "tanh_float32_wrong", "loss_float64"])
def test_the_drop_in_gradcheck_agrees_with_itself_in_fast_mode(name):
    fn = CASES[name][0]
    fn = fn.apply if isinstance(fn, type) else fn
    verdicts = {fast: gradtool.gradcheck(fn, _args(name), fast_mode=fast, raise_exception=False)
                for fast in (True, False)}
    assert verdicts[True] == verdicts[False] == (CASES[name][2] == "passed"), verdicts


def _float32_numbers(*shape):
    gen = torch.Generator().manual_seed(3)
    return torch.randn(*shape, generator=gen).double()  # float64 values that are float32's


def _scaled(x):
    return 2 * x  # float32 numbers at x, not at a moved point


BUFFER = _float32_numbers(4)


def _with_buffer(x):
    return x.sum() * 0 + BUFFER  # outputs float32 numbers that do not move with x


def _rounded(x):
    return torch.round(x * 8) / 8 + 0 * x  # multiples of 1/8: simple values


@pytest.mark.parametrize("fn", [_scaled, _with_buffer, _rounded])
def test_float32_numbers_that_prove_nothing_are_no_finding(fn):
    # inputs that happen to be float32 numbers, an output that does not move, simple values
    for mode in MODES:
        check = result(gradtool.check(fn, [_float32_numbers(4)], checks=["gradient"],
                                      mode=mode), "gradient")
        assert PRECISION not in _rules(check), (mode, str(check))
        assert check.outcome.value != "failed", (mode, str(check))


def _residue(x):
    # mathematically 0: float64's residue of the cancellation, a few ulps (2^-53), is a number
    # of every dtype -- as entmax's budget_bisect at budget 0 returns -- and proves nothing
    return torch.sin(x) ** 2 + torch.cos(x) ** 2 - 1


def test_float64_rounding_residue_is_no_finding():
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for mode in MODES:
        check = result(gradtool.check(_residue, [x], checks=["gradient"], mode=mode), "gradient")
        assert PRECISION not in _rules(check), (mode, str(check))
        assert check.outcome.value != "failed", (mode, str(check))
