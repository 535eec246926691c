"""Outputs constant over the perturbation (normalisations over one element, a summed softmax):
their gradients are judged at the noise of the terms that cancel, measured from the outputs'
own variation across the stencil, never at |f0| ~ 0; a small but real wrong gradient still fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradtool
from conftest import load_fixture, outcomes, result
from gradtool.numerics.measured import K
from gradtool.numerics.stencil_noise import Pooled

F = load_fixture("constant_norm")


def test_group_norm_one_element_per_group_float64_run_passes():
    # nn.GroupNorm(4, 4) checked in float32: its float64 run's finite differences at one
    # element drift exactly linearly (-2.09e-10, backward's exact 0), so its own fourth
    # differences see no noise; it failed "the float64 run's own gradient is wrong" on these
    for seed, shape in ((3, "3x4"), (3, "2x4x1"), (4, "5x4")):
        report = gradtool.check(nn.GroupNorm(4, 4), [shape], dtype="float32", seed=seed,
                                checks=["gradient"])
        assert outcomes(report) == {"gradient": "passed"}, str(report)


def test_group_norm_input_gradient_noise_is_judged_at_backward_s_measured_rounding():
    # the float32 input gradient is rounding residue of terms rstd·g ~ 316 (here -1.53e-05,
    # half an ulp of them) where the float64 reference is 0; the bound from the largest
    # gradient (8.1e-06: the bias's, ~1) missed their scale, inconclusive before; backward at
    # (1 + 2^-7)·grad_output shows it (3.1e-05)
    report = gradtool.check(nn.GroupNorm(4, 4), ["3x4"], dtype="float32", seed=1,
                            checks=["gradient"])
    assert outcomes(report) == {"gradient": "passed"}, str(report)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_low_precision_gradient_where_the_reference_has_none_still_fails(seed):
    # 1e-3·grad_output in float32 only: the measured rounding of a linear mistake is rounding
    bad = result(gradtool.check(F.OneElementNormLowLeak, ["4x2x1"], dtype="float32", seed=seed,
                                checks=["gradient"]), "gradient")
    assert [f.rule for f in bad.findings] == ["gradient.rounding"], bad.summary


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_one_element_norm_twins(dtype):
    good = gradtool.check(F.OneElementNorm, ["4x2x1"], dtype=dtype, seed=0,
                          checks=["gradient"])
    assert outcomes(good) == {"gradient": "passed"}, str(good)
    bad = result(gradtool.check(F.OneElementNormLeaky, ["4x2x1"], dtype=dtype, seed=0,
                                checks=["gradient"]), "gradient")
    assert bad.outcome.value == "failed", bad.summary
    assert "gradient.mismatch" in [f.rule for f in bad.findings]
    # the seeded 1e-6 stands at most elements, beside a noise of ~1e-8
    assert sum(b.mismatched for b in bad.blocks) >= 5


def _stencil(drift: float, noise: float, n: int, seed: int = 0) -> torch.Tensor:
    """(7, n) outputs at -3h..3h: a linear drift plus white noise."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.arange(-3, 4, dtype=torch.float64)[:, None]
    return drift * steps + noise * torch.randn(7, n, generator=g, dtype=torch.float64)


def test_block_noise_reaches_a_constant_output_only():
    # one output tensor of 4 elements: three noisy (sigma 1e-14) that moved, one drifting
    # exactly linearly (its own sigma 0)
    noisy = _stencil(0.0, 1e-14, 3)
    points = torch.cat([noisy, _stencil(2e-16, 0.0, 1)], 1)[:, None, :]   # (7, 1 column, 4)
    sigma2 = torch.tensor([[1e-28, 1e-28, 1e-28, 0.0]], dtype=torch.float64)
    pooled = Pooled.empty(torch.zeros(4), 1).add(points, sigma2, [0, 4])
    assert pooled.block_n.tolist() == [4.0]
    noise = (3e-28 / 4) ** 0.5
    own = torch.zeros(1, dtype=torch.float64)
    lifted = pooled.cancelled(points[:, 0, 3:], own, torch.tensor([3]), [0, 4], K)
    assert lifted.item() == pytest.approx(noise)
    # a real gradient moves its output beyond K x that noise over the stencil: its own noise
    real = _stencil(K * noise, 0.0, 1)
    kept = pooled.cancelled(real, own, torch.tensor([3]), [0, 4], K)
    assert kept.item() == 0.0


def test_unmoved_outputs_do_not_dilute_the_block_noise():
    # a second output tensor that the column leaves exactly unchanged: no noise counted there
    moved = _stencil(0.0, 1e-14, 2)
    still = torch.zeros(7, 2, dtype=torch.float64)
    points = torch.cat([moved, still], 1)[:, None, :]
    sigma2 = torch.tensor([[4e-28, 4e-28, 0.0, 0.0]], dtype=torch.float64)
    pooled = Pooled.empty(torch.zeros(4), 2).add(points, sigma2, [0, 2, 4])
    assert pooled.block_n.tolist() == [2.0, 0.0]
    assert pooled.block_sum[0].item() == pytest.approx(8e-28)


def _summed_softmax(x):
    return torch.softmax(x, -1).sum()


CORRECT = [(lambda: nn.GroupNorm(4, 4), ("3x4", "2x4x1", "5x4")),
           (lambda: nn.LayerNorm(1), ("4x1", "3x2x1")),
           (lambda: nn.RMSNorm(1, eps=1e-6), ("4x1", "3x2x1")),
           (lambda: _summed_softmax, ("3x4", "(5,)", "(7,)", "2x3"))]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("make, shapes", CORRECT,
                         ids=["group_norm", "layer_norm", "rms_norm", "summed_softmax"])
def test_constant_outputs_pass_every_default_check_over_seeds(make, shapes, dtype):
    # GroupNorm(4, 4) failed 8 of 18 in float32 and 7 of 18 in bfloat16 before (gradient);
    # the summed softmax over (5,) in float32 contract.nonlinear at seed 1 (judged at its
    # terms' scale now: tests/test_cancelled.py)
    for shape in shapes:
        for seed in range(6):
            report = gradtool.check(make(), [shape], dtype=dtype, seed=seed)
            assert set(outcomes(report).values()) <= {"passed", "skipped"}, str(report)
