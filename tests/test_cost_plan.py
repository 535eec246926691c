"""The cost plan after a failure: an expensive target's failing probe sweeps only as far as a
confirmed failing block (the input whose own probe fails first), double backward of a backward
without a graph goes to its stopping sweep unprobed, and batching that costs more than plain
calls is dropped. Verdicts and rule ids never change; --exhaustive gathers everything."""

from __future__ import annotations

import time

import pytest
import torch
from torch.autograd import Function

import gradtool
from gradtool.results import Outcome

# full_budget_s 0: auto mode takes every target for an expensive one (probe mode first), as it
# does a model whose full mode is predicted above a second.
EXPENSIVE = {"full_budget_s": 0.0, "seed": 0}


class Affine(Function):
    """y = x Wᵀ + b, backward by hand; `wrong` names the input whose gradient is doubled."""

    wrong = ""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.T + b

    @classmethod
    def backward(cls, ctx, g):
        x, w = ctx.saved_tensors
        grads = {"x": g @ w, "w": g.T @ x, "b": g.sum(0)}
        return tuple(grads[n] * (2 if n == cls.wrong else 1) for n in ("x", "w", "b"))


class AffineXDoubled(Affine):
    wrong = "x"


class AffineBDoubled(Affine):
    wrong = "b"


INPUTS = ["3x4", "5x4", "(5,)"]


def _gradient(report):
    return next(c for _, _, c in report.checks() if c.name == "gradient")


def _rules(check):
    return sorted({f.rule for f in check.findings})


@pytest.mark.parametrize("cls, failing", [(AffineXDoubled, "x"), (AffineBDoubled, "b")])
def test_a_failing_probe_stops_at_the_input_whose_own_probe_fails(cls, failing):
    cut = _gradient(gradtool.check(cls, INPUTS, checks=("gradient",), **EXPENSIVE))
    whole = _gradient(gradtool.check(cls, INPUTS, checks=("gradient",), exhaustive=True,
                                     **EXPENSIVE))
    assert cut.outcome is whole.outcome is Outcome.FAILED
    assert _rules(cut) == _rules(whole) == ["gradient.factor", "gradient.mismatch"]
    swept = {b.input for b in cut.blocks if b.exhaustive}
    assert swept == {failing}  # the other inputs' columns were never evaluated
    assert all(b.exhaustive for b in whole.blocks)
    assert cut.calls["forward"] < whole.calls["forward"]
    text = "\n".join(cut.details)
    assert "--exhaustive" in text and f"fails for '{failing}'" in text
    assert "--exhaustive" not in "\n".join(whole.details)


def test_a_correct_twin_passes_whatever_the_plan():
    for exhaustive in (False, True):
        report = gradtool.check(Affine, INPUTS, exhaustive=exhaustive, **EXPENSIVE)
        assert report.ok(), report


class DetachedSquare(Function):
    """x², its first order right but computed without a graph: double backward sees zero."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (2 * x * g).detach()


def test_double_backward_without_a_graph_goes_to_its_sweep_unprobed():
    def run(**extra):
        report = gradtool.check(DetachedSquare, ["(12,)"], checks=("double_backward",),
                                **EXPENSIVE, **extra)
        return next(c for _, _, c in report.checks())

    cut, whole = run(), run(exhaustive=True)
    assert cut.outcome is whole.outcome is Outcome.FAILED
    assert _rules(cut) == _rules(whole)
    assert "no probe first" in cut.mode_reason and "no probe first" not in whole.mode_reason
    assert cut.calls["backward"] < whole.calls["backward"]



class CompilesPerShape:
    """A callable whose first batched call is slow, as a kernel compiled again for the batched
    shapes (numba, torch.compile) would be: batching costs more than it saves."""

    def __init__(self) -> None:
        self.compiled = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch._C._functorch.is_batchedtensor(x) and not self.compiled:  # noqa: SLF001
            time.sleep(0.3)
            self.compiled = True
        return torch.sin(x) * x.sum()


def test_batching_is_dropped_when_its_first_call_costs_more_than_plain_calls():
    report = gradtool.check(CompilesPerShape(), ["(48,)"], checks=("gradient",), mode="full")
    check = _gradient(report)
    assert check.outcome is Outcome.PASSED
    assert "batching dropped" in check.mode_reason
    assert "batching dropped" in report.text(verbose=True)


def test_batching_that_pays_is_kept():
    check = _gradient(gradtool.check(lambda x: torch.sin(x) * x.sum(), ["(48,)"],
                                     checks=("gradient",), mode="full"))
    assert "batching dropped" not in (check.mode_reason or "")


class DetachedScaled(Function):
    """x · sum(x), a dense Jacobian; first order right, computed without a graph. Its forward
    reads a number into Python, so vmap refuses it: every evaluation is a plain call, as an
    adjoint solver's."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x.sum().item()

    backwards = 0  # the user's backward runs (a reused forward's included)

    @classmethod
    def backward(cls, ctx, g):
        DetachedScaled.backwards += 1
        (x,) = ctx.saved_tensors
        return (g * x.sum() + (g * x).sum()).detach()


def test_double_backward_reads_its_grad_output_columns_from_the_gradient_checks_rows():
    """G(x, v) = vᵀJ is linear in v (the contract's linearity test says so in the run): its
    columns along v are the rows of J the gradient check computed, so none is evaluated."""
    def double(checks):
        before = DetachedScaled.backwards
        report = gradtool.check(DetachedScaled, ["(12,)"], checks=checks, mode="full")
        runs = DetachedScaled.backwards - before
        return next(c for _, _, c in report.checks() if c.name == "double_backward"), runs

    (reused, with_reuse), (alone, evaluated) = (
        double(("contract", "gradient", "double_backward")),
        double(("gradient", "double_backward")))  # no linearity test: G evaluated along v
    assert reused.outcome is alone.outcome is Outcome.FAILED
    assert _rules(reused) == _rules(alone)
    assert [b.mismatched for b in reused.blocks] == [b.mismatched for b in alone.blocks]
    # the contract's own backwards (6) included, 12 grad_output columns' fewer
    assert with_reuse + 6 <= evaluated, (with_reuse, evaluated)
