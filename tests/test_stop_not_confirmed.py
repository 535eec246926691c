"""Full mode stopped at its first failing block (the probe failed on an expensive target): when
that block turns out inconclusive (a solver's gap within gradcheck's tolerance, forward with a
data-dependent stopping test), the blocks it left must still be compared. Found on qpth, whose
interior-point forward made its first block inconclusive and left a wrong gradient unchecked."""

from __future__ import annotations

import pytest
import torch

import gradtool


def newton_sqrt(b: torch.Tensor) -> torch.Tensor:
    s = torch.ones_like(b)
    while (s * s - b).abs().max().item() > 1e-12:  # a solver's stopping test
        s = 0.5 * (s + b / s)
    return s


class SolverMul(torch.autograd.Function):
    """a * sqrt(b), sqrt by Newton; backward's 'a' gradient 2e-4 off: within gradcheck's rtol, beyond the
    measured finite-difference error (the size of a solver's gap)."""

    b_factor = 1.0

    @staticmethod
    def forward(ctx, a, b):
        s = newton_sqrt(b)
        ctx.save_for_backward(a, s)
        return a * s

    @classmethod
    def backward(cls, ctx, g):
        a, s = ctx.saved_tensors
        return g * s * (1 + 2e-4), cls.b_factor * g * a / (2 * s)


class SolverMulWrongB(SolverMul):
    b_factor = 2.0  # a wrong gradient for b, far beyond any tolerance


INPUTS = ["6x6", "6x6:[0.5,2]"]


def outcome(fn):
    report = gradtool.check(fn, INPUTS, checks=["gradient"], full_budget_s=0.0, seed=0)
    (_, _, check), = report.checks()
    return check


def test_the_solver_gap_alone_is_inconclusive():
    assert outcome(SolverMul).outcome.value == "inconclusive"


def test_a_wrong_block_after_an_inconclusive_one_fails():
    check = outcome(SolverMulWrongB)
    assert check.outcome.value == "failed", check
    assert any(b.input == "b" and b.mismatched for b in check.blocks), check.blocks


def test_the_solver_gap_is_named_in_the_summary_not_unreliable_differences():
    # it read "finite differences are unreliable at 36 of 1296 elements": they were measured
    # reliable; what is undecided is a gap the size of a solver's tolerance
    summary = outcome(SolverMul).summary
    assert summary.startswith("36 of 1296 elements of 'a' undecided: backward is beyond the "
                              "measured finite-difference error"), summary
    assert "forward is a solver" in summary and "unreliable" not in summary
