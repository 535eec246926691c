"""A probe is a sum over many elements: errors spread over them, each within a fixed tolerance,
never fail it (an iterative solver's backward); one element beyond it still does.

The correct-but-imprecise Function below is what a conjugate-gradient backward solved to its
tolerance looks like: every gradient element off by ~2e-6 of itself, in a sign that varies from
element to element. Full mode at gradcheck's tolerance passes it; so must probe mode and the
drop-in's fast_mode (torch's fast and slow modes pass it). Its broken twins -- one element 1%
off, every element 1% off -- fail in every mode.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function
from torch.autograd.gradcheck import GradcheckError

import gradtool
from gradtool.render.words import block_lines
from gradtool.results import Block, Outcome

from conftest import result

N = 600
FIXED = {"atol": 1e-5, "rtol": 1e-3}  # gradcheck's


def _wobble(x: torch.Tensor) -> torch.Tensor:
    """A fixed pseudo-random sign per element (the solver's residual), from the values' shape."""
    gen = torch.Generator().manual_seed(11)
    return (torch.randint(0, 2, x.shape, generator=gen) * 2 - 1).to(x.dtype)


class ImpreciseCube(Function):
    """y = Σ x³ / 3; backward x² to a relative 2e-6 (within gradcheck's rtol 1e-3 everywhere)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x ** 3).sum() / 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x ** 2 * (1 + 2e-6 * _wobble(x))


class OneElementOff(ImpreciseCube):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        g = grad * x ** 2 * (1 + 2e-6 * _wobble(x))
        g[N // 3] *= 1.01
        return g


class AllOff(ImpreciseCube):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 1.01 * grad * x ** 2 * (1 + 2e-6 * _wobble(x))


def _x() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    return (1 + torch.rand(N, generator=gen, dtype=torch.float64)).requires_grad_()


def _check(cls: type, **settings) -> gradtool.Report:
    return gradtool.check(cls.apply, (_x(),), checks=("gradient",), **FIXED, **settings)


def test_the_spread_error_fails_the_probe_screen_yet_every_element_is_within_tolerance():
    # the premise: full mode at the same tolerance passes, and torch's modes pass
    assert _check(ImpreciseCube, mode="full").ok()
    assert torch.autograd.gradcheck(ImpreciseCube.apply, (_x(),), fast_mode=True)
    # each element is well within one element's atol; a probe's sum over 600 is not (the
    # screen fails: see the inconclusive verdict below, which a passing screen never gives)
    x = _x().detach()
    ctx = type("Ctx", (), {"saved_tensors": (x,)})()
    err = ImpreciseCube.backward(ctx, torch.tensor(1.0, dtype=torch.float64)) - x ** 2
    assert float(err.abs().max()) < FIXED["atol"] < float(err.abs().sum())


def test_probe_mode_never_fails_it_and_judges_each_element_where_full_mode_is_affordable():
    report = _check(ImpreciseCube, mode="probe")
    checked = result(report, "gradient")
    assert checked.outcome is Outcome.PASSED, report
    assert checked.mode == "full" and "judges each element" in checked.mode_reason


def test_over_budget_the_unsettled_probe_is_inconclusive_saying_how_to_judge_it():
    report = _check(ImpreciseCube, mode="probe", full_budget_s=0.0)
    checked = result(report, "gradient")
    assert checked.outcome is Outcome.INCONCLUSIVE, report
    assert checked.mode == "probe"
    words = " ".join(checked.details)
    assert "no element localised is beyond its own" in words and "--mode full" in words
    # no block claims a located mismatch it does not show
    assert not any(b.mismatched for b in checked.blocks)


def test_the_drop_in_fast_mode_gives_torchs_verdict():
    assert gradtool.gradcheck(ImpreciseCube.apply, (_x(),), fast_mode=True)
    assert gradtool.gradcheck(ImpreciseCube.apply, (_x(),))


@pytest.mark.parametrize("cls", [OneElementOff, AllOff])
@pytest.mark.parametrize("settings", [{"mode": "probe"}, {"mode": "probe", "full_budget_s": 0.0},
                                      {"mode": "full"}])
def test_the_broken_twins_still_fail(cls, settings):
    report = _check(cls, **settings)
    checked = result(report, "gradient")
    assert checked.outcome is Outcome.FAILED, report
    bad = [b for b in checked.blocks if b.mismatched]
    assert bad and bad[0].worst
    if cls is OneElementOff:
        assert any(e.input_index == (N // 3,) for e in bad[0].worst)


@pytest.mark.parametrize("cls", [OneElementOff, AllOff])
def test_the_broken_twins_fail_the_drop_in_fast_mode(cls):
    with pytest.raises(GradcheckError):
        gradtool.gradcheck(cls.apply, (_x(),), fast_mode=True)


def test_a_failing_probe_block_without_elements_says_so():
    block = Block("x", (3,), "output", (), 2, 1, 1e-3, 0.0, (), None, exhaustive=False)
    header = block_lines(block, FIXED)[0]
    assert "bisection" not in header and "no single element located" in header
