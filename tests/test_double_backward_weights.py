"""Double backward's random grad_outputs weigh second derivatives as gradgradcheck's do.

gradgradcheck's fixed tolerance judges backward's Jacobian at grad_outputs in [-1, 1]; a backward
computed to a tolerance (an iterative solve) is off by its solver's error times those weights.
gradtool draws ±[0.5, 1): never a larger weight than gradgradcheck's, so such a backward within
its tolerance passes (a normal draw's weights reach 3 and failed it), and never a tiny one, so a
wrong second derivative is not hidden under atol.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import gradtool
from gradtool.checks.double_backward import _weights
from gradtool.results import Outcome

from conftest import result

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import bugs  # noqa: E402

SOLVER = 8e-6  # the solver's error in backward: its derivative, unseen by autograd


class SolvedCube(bugs.Cube):
    """y = x³; backward 3x² g plus a solver's smooth error, 8e-6 sin(x) g, computed without a
    graph (as a solve to a tolerance is): the second derivative misses 8e-6 cos(x) g, within
    gradgradcheck's atol for any weight in [-1, 1]."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x ** 2 + grad * (SOLVER * torch.sin(x)).detach()


class DetachedCube(SolvedCube):
    """The broken twin: 3x² computed without a graph, so the second derivative drops 6x g."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (3 * x ** 2).detach()


def _x() -> torch.Tensor:
    # second derivatives 6x g of ~1e-3: the solver's error is what decides at atol 1e-5
    gen = torch.Generator().manual_seed(5)
    return (2e-4 * torch.rand(24, generator=gen, dtype=torch.float64)).requires_grad_()


def test_weights_lie_in_gradgradchecks_range_and_none_is_tiny():
    gen = torch.Generator().manual_seed(0)
    w = _weights(torch.empty(1000, dtype=torch.float64), gen)
    assert 0.5 <= float(w.abs().min()) and float(w.abs().max()) < 1
    assert (w > 0).any() and (w < 0).any() and w.dtype == torch.float64
    c = _weights(torch.empty(100, dtype=torch.complex128), gen)
    assert c.dtype == torch.complex128 and float(c.abs().max()) < 1
    assert _weights(torch.empty(3, dtype=torch.float32), gen).dtype == torch.float32


def test_a_backward_within_gradgradchecks_tolerance_passes_as_it_does_there():
    assert torch.autograd.gradgradcheck(SolvedCube.apply, (_x(),))
    for seed in range(3):
        report = gradtool.check(SolvedCube.apply, (_x(),), checks=("double_backward",),
                                seed=seed)
        assert result(report, "double_backward").outcome is Outcome.PASSED, report


@pytest.mark.parametrize("seed", range(2))
def test_a_dropped_second_derivative_still_fails(seed):
    report = gradtool.check(DetachedCube.apply, (_x(),), checks=("double_backward",),
                            seed=seed)
    assert result(report, "double_backward").outcome is Outcome.FAILED, report
