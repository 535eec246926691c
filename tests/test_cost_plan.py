"""The cost plan after a failure: an expensive target's failing probe sweeps only as far as a
confirmed failing block (the input whose own probe fails first), double backward of a backward
without a graph goes to its stopping sweep unprobed, and batching that costs more than plain
calls is dropped; a target compiling per argument layout (numba) compiles only what the checks
need. Verdicts and rule ids never change; --exhaustive gathers everything."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
import torch
from torch.autograd import Function, gradcheck, gradgradcheck
from torch.autograd.function import once_differentiable

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
    columns along v are the rows of J the gradient check computed, so none is evaluated.
    (--exhaustive: every column of both blocks, so the saving is the reuse's alone; the cut
    at a confirmed failure of a zero block is tested below.)"""
    def double(checks):
        before = DetachedScaled.backwards
        report = gradtool.check(DetachedScaled, ["(12,)"], checks=checks, mode="full",
                                exhaustive=True)
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


# --- a target that compiles per argument signature (numba's dispatcher) -------------------------

class Compiling:
    """numpy kernels behind a per-signature compile cache, as numba's dispatcher: a signature is
    each array's (dtype, ndim, 'C' contiguous or 'A' any layout); compiles and calls counted."""

    def __init__(self) -> None:
        self.compiled: dict[str, set] = {"forward": set(), "backward": set()}
        self.calls: Counter = Counter()

    def run(self, kind: str, fn, *arrays):
        self.compiled[kind].add(tuple((a.dtype.str, a.ndim, "C" if a.flags.c_contiguous else "A")
                                      for a in arrays))
        self.calls[kind] += 1
        return fn(*arrays)

    def signatures(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.compiled.items()}


def _lse(x):
    top = x.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def compiled_lse(factor: float = 1.0, once: bool = False) -> tuple[Compiling, type]:
    """Row-wise log-sum-exp on compiled kernels, backward grad * softmax with the softmax from a
    kernel (no graph to x: its second derivative is wrong, as pysdtw's soft-DTW's is), or
    @once_differentiable (as such kernels are declared); `factor` seeds a first-order bug."""
    kernels = Compiling()

    class CompiledLogSumExp(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.from_numpy(kernels.run("forward", _lse, x.detach().numpy()))

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            s = torch.from_numpy(kernels.run("backward", _softmax, x.detach().numpy()))
            return g.unsqueeze(-1) * s * factor

    if once:
        CompiledLogSumExp.backward = staticmethod(once_differentiable(
            CompiledLogSumExp.backward))
    return kernels, CompiledLogSumExp


def _torch_checks(fn, x: torch.Tensor) -> None:
    for check in (gradcheck, gradgradcheck):
        try:
            check(fn, (x,), raise_exception=False)
        except RuntimeError:  # once_differentiable: gradgradcheck raises
            pass


@pytest.mark.parametrize("factor, once", [(1.0, False), (2.0, False), (1.0, True), (2.0, True)])
def test_a_compiling_target_compiles_only_the_layouts_the_checks_need_and_calls_less(factor, once):
    """Each layout gradtool hands a per-signature compiler costs a compilation (~5 s for a
    numba kernel): the layout check's non-contiguous input is the one signature beyond
    gradcheck's, a run without layout compiles exactly gradcheck's, a warm run compiles nothing,
    and every default check together calls the kernels no more than gradcheck slow +
    gradgradcheck slow (a correct twin, a seeded one; a backward without a graph, and one
    declared once-differentiable)."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    kernels, cls = compiled_lse(factor, once)
    fn = lambda v: cls.apply(v)  # noqa: E731 - a model that is the Function, as a user writes
    ours = gradtool.check(fn, (x,), checks=("contract", "gradient", "double_backward"))
    assert kernels.signatures() == {"forward": 1, "backward": 1}
    report = gradtool.check(fn, (x,))
    assert kernels.signatures() == {"forward": 2, "backward": 2}  # the layout check's 'A'
    outcomes = {c.name: c.outcome for _, _, c in report.checks()}
    assert outcomes["gradient"] is (Outcome.PASSED if factor == 1.0 else Outcome.FAILED)
    assert outcomes["double_backward"] is (Outcome.SKIPPED if once else Outcome.FAILED)
    assert outcomes["layout"] is outcomes["contract"] is Outcome.PASSED
    assert {c.name: c.outcome for _, _, c in ours.checks()}.items() <= outcomes.items()
    kernels.calls.clear()
    gradtool.check(fn, (x,))
    warm = sum(kernels.calls.values())
    assert kernels.signatures() == {"forward": 2, "backward": 2}  # warm: nothing compiles
    kernels.calls.clear()
    _torch_checks(fn, x)
    assert warm <= sum(kernels.calls.values()), (warm, dict(kernels.calls))


# --- double backward after a failing gradient: a zero block stops at its first failing column ---

def _double_backward_run(fn, x, kernels, **extra):
    """Gradient then double backward (the first order's failure is what lets double backward
    stop): the double backward check, and the backward kernel's calls the whole run made."""
    kernels.calls.clear()
    report = gradtool.check(fn, (x,), checks=("gradient", "double_backward"), **extra)
    checks = {c.name: c for _, _, c in report.checks()}
    return checks, kernels.calls["backward"], report


@pytest.mark.parametrize("model", [False, True])
def test_a_failing_double_backward_after_a_failing_gradient_stops_at_one_failing_column(model):
    """A backward computed from a kernel's saved result (no graph to x: its second derivative
    is zero throughout, pysdtw's case) and wrong at first order: double backward compares
    columns of x until one failure is confirmed, not all 32, and skips the dense block and heat
    map; verdicts, rule ids, the diagnosis's kind and where to look are those of --exhaustive,
    and the report says what was cut."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    kernels, cls = compiled_lse(factor=2.0)
    fn = (lambda v: cls.apply(v) * 3.0) if model else cls
    cut, cut_calls, report = _double_backward_run(fn, x, kernels)
    whole, whole_calls, _ = _double_backward_run(fn, x, kernels, exhaustive=True)
    assert {k: c.outcome for k, c in cut.items()} == {k: c.outcome for k, c in whole.items()} \
        == {"gradient": Outcome.FAILED, "double_backward": Outcome.FAILED}
    for name in cut:
        assert _rules(cut[name]) == _rules(whole[name]), name
        assert cut[name].source == whole[name].source, name
    cut_db, whole_db = cut["double_backward"], whole["double_backward"]
    assert _rules(cut_db) == ["double_backward.mismatch", "double_backward.untracked"]
    x_cut, x_whole = cut_db.blocks[0], whole_db.blocks[0]  # the input's own block
    assert [(f.rule, f.data["input"]) for f in cut_db.findings] == \
        [(f.rule, f.data["input"]) for f in whole_db.findings if f.data["input"] == x_cut.input]
    assert not x_cut.exhaustive and x_whole.exhaustive
    assert 0 < x_cut.checked < x_whole.checked == 32 * 32
    assert x_cut.grid is None and x_whole.grid is not None  # no heat map of a part
    # gradient's own kernel calls are the same both ways: the cut is double backward's 64
    # evaluations of x's columns down to a few
    assert cut_calls + 40 <= whole_calls, (cut_calls, whole_calls)
    said = "\n".join(cut_db.details)
    assert "compared in part" in said and "--exhaustive" in said
    assert "compared in part" not in "\n".join(whole_db.details)
    assert "not swept whole" in report.text()


class WrongSecondOrder(Function):
    """x³ with backward 6x²g, one x of it detached: wrong at first order, and its second
    derivative half the finite differences' (6xg tracked of 12xg) but not zero: double
    backward's x block is compared whole, the cut never applies."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 6 * x * x.detach() * g


def test_a_failing_double_backward_whose_block_is_not_zero_is_compared_whole():
    def run(**extra):
        report = gradtool.check(WrongSecondOrder, ["(12,)"],
                                checks=("gradient", "double_backward"), **extra)
        return next(c for _, _, c in report.checks() if c.name == "double_backward")

    cut, whole = run(), run(exhaustive=True)
    assert cut.outcome is whole.outcome is Outcome.FAILED
    assert _rules(cut) == _rules(whole) == ["double_backward.factor", "double_backward.mismatch"]
    x = next(b for b in cut.blocks if b.input == "x")
    assert x.exhaustive and x.checked == 144 and x.grid is not None
    assert "compared in part" not in "\n".join(cut.details)
