"""Issue 55: no wrong gradient passes where -inf is by design (a causal mask, -inf padding), in
every comparison mode; each wrong Function beside its correct twin, which must pass."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES, load_fixture, result

import gradtool

M = load_fixture("masked_attention")
REF = f"{FIXTURES / 'masked_attention.py'}:masked_ref"
PADDED_REF = f"{FIXTURES / 'masked_attention.py'}:padded_ref"


def _gradient(target, inputs, **settings):
    return result(gradtool.check(target, inputs, checks=["gradient"], **settings), "gradient")


@pytest.mark.parametrize("mode", ["full", "probe"])
@pytest.mark.parametrize("name,expected", [("PaddedAV", "passed"), ("PaddedAVNegated", "failed"),
                                           ("PaddedAVRolled", "failed")])
def test_float64_with_minus_inf_padding_given(mode, name, expected):
    """(a): -inf padding in a given input made the measured first bound's rtol inf (from
    max |x|), so a negated dv passed full mode with max abs diff 1.4."""
    check = _gradient(getattr(M, name).apply, M.padded_inputs(), mode=mode)
    assert check.outcome.value == expected, check.summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 6), (2, 2, 5, 5)])
@pytest.mark.parametrize("name,expected", [("MaskedAV", "passed"), ("MaskedAVNegated", "failed"),
                                           ("MaskedAVRolled", "failed"),
                                           ("MaskedAVDroppedTerm", "failed")])
def test_low_precision_with_a_causal_mask_inside(dtype, shape, name, expected):
    """(b): the issue's reproducer at float32 and bfloat16 against its float64 reference, 2-D
    and 4-D causal: the -inf inside made every rounding bound inf."""
    inputs = M.causal_inputs(dtype, shape=shape)
    check = _gradient(getattr(M, name).apply, inputs, reference=REF)
    assert check.outcome.value == expected, check.summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,expected", [("PaddedAV", "passed"), ("PaddedAVNegated", "failed")])
def test_low_precision_with_minus_inf_padding_given(dtype, name, expected):
    check = _gradient(getattr(M, name).apply, M.padded_inputs(dtype), reference=PADDED_REF)
    assert check.outcome.value == expected, check.summary


@pytest.mark.parametrize("name,expected", [("MaskedAV", "passed"), ("MaskedAVNegated", "failed")])
def test_low_precision_against_the_target_in_float64(name, expected):
    """No reference: the target itself run in float64 is the reference (and its own gradient
    is checked there)."""
    check = _gradient(getattr(M, name).apply, M.causal_inputs(torch.float32))
    assert check.outcome.value == expected, check.summary


@pytest.mark.parametrize("name,expected", [("MaskedAV", "passed"), ("MaskedAVNegated", "failed")])
def test_reference_takes_a_callable(name, expected):
    """(c): reference= a callable raised InternalError at targets/ops.py:22."""
    check = _gradient(getattr(M, name).apply, M.causal_inputs(torch.float32),
                      reference=M.masked_ref)
    assert check.outcome.value == expected, check.summary


def test_reference_a_function_class_runs_as_its_apply():
    check = _gradient(M.MaskedAVNegated.apply, M.causal_inputs(torch.float32),
                      reference=M.MaskedAV)
    assert check.outcome.value == "failed", check.summary


def test_reference_neither_callable_nor_name_is_a_clear_error():
    from gradtool.errors import GradtoolError

    with pytest.raises(GradtoolError, match="reference= takes a callable"):
        gradtool.check(M.MaskedAV.apply, M.causal_inputs(torch.float32), reference=3)


# ---------------------------------------------------------------- (d) forward determinism

@pytest.mark.parametrize("fn", ["drifting", "drifting_huge"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_forward_that_drifts_without_drawing_fails_under_its_own_rule(fn, dtype):
    """It was 'stochastic: RNG frozen' then inconclusive ('a lower-precision computation
    inside'), or an internal error (atol ... got -nan at numerics/steps.py:180)."""
    x = torch.randn(3, 4, dtype=getattr(torch, dtype))
    report = gradtool.check(getattr(M, fn), (x,), checks=["gradient"])
    check = result(report, "gradient")
    assert check.outcome.value == "failed", check.summary
    assert [f.rule for f in check.findings] == ["gradient.forward_drift"]
    assert "output by " in check.summary and " of 12 elements" in check.summary
    notes = " ".join(report.targets[0].cases[0].notes)
    assert "stochastic" not in notes  # it follows no seed


def test_a_forward_that_follows_the_seed_is_stochastic_and_its_twin_plain():
    x = torch.randn(3, 4, dtype=torch.float64)
    report = gradtool.check(M.dropout_like, (x,), checks=["gradient"])
    assert report.ok() and "stochastic" in " ".join(report.targets[0].cases[0].notes)
    report = gradtool.check(M.steady, (x,), checks=["gradient"])
    assert report.ok() and "stochastic" not in " ".join(report.targets[0].cases[0].notes)


def test_a_nan_output_in_the_batched_check_is_no_internal_error():
    """steps.py read atol from max |output|: NaN made torch.allclose raise (internal error)."""
    from gradtool.numerics.bounds import finite_max

    assert finite_max(torch.tensor([float("nan"), 2.0, -float("inf")])) == 2.0


# ------------------------------------------- (e) never read what the user's code freed

_FREES = f"""
import sys, torch, gradtool
sys.path.insert(0, {str(FIXTURES)!r})
import masked_attention as M
x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
assert gradtool.check(M.frees_intermediate, (x,)).ok()
assert gradtool.check(M.FreesInput.apply, (x.detach(),)).ok()
assert gradtool.gradcheck(M.frees_intermediate, (x,))
assert gradtool.gradcheck(M.frees_intermediate, (x,), fast_mode=True)
assert torch.autograd.gradcheck(M.frees_intermediate, (x,))  # gradcheck's verdict: passes
print("survived")
"""


def _subprocess(args, **kw):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=300, **kw)


def test_a_function_that_frees_its_input_does_not_crash_the_library():
    """gradtool.check and gradtool.gradcheck died with SIGSEGV (torch.equal in the probe's
    purity test on the freed copy, then the contract reading the leaves forward freed)."""
    done = _subprocess(["-c", _FREES])
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_function_that_frees_its_input_does_not_crash_the_pytest_drop_in(tmp_path):
    (tmp_path / "test_frees.py").write_text(
        f"import sys, torch\nsys.path.insert(0, {str(FIXTURES)!r})\n"
        "import masked_attention as M\n\n"
        "def test_frees():\n"
        "    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)\n"
        "    assert torch.autograd.gradcheck(M.frees_intermediate, (x,))\n")
    done = _subprocess(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--gradtool-gradcheck",
                        str(tmp_path / "test_frees.py")], cwd=tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, (done.returncode,
                                                                 done.stdout[-2000:])


def test_released_names_a_freed_storage_only():
    from gradtool.targets.probe import released

    x = torch.randn(3)
    assert not released(x) and not released(torch.empty(0)) and not released(3)
    y = x * 1
    y.untyped_storage().resize_(0)
    assert released(y) and not released(torch.randn(2, 2).to_sparse())


@pytest.mark.parametrize("fast_mode", [False, True])
def test_the_drop_in_fails_a_drifting_forward_as_gradcheck_does(fast_mode):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert not gradtool.gradcheck(M.drifting, (x,), fast_mode=fast_mode, raise_exception=False)
    assert gradtool.gradcheck(M.steady, (x,), fast_mode=fast_mode, raise_exception=False)


def _gradcheck(fn, x):
    return torch.autograd.gradcheck(fn, (x.detach().requires_grad_(),), raise_exception=False)


@pytest.mark.parametrize("fn,dtype", [("shuffled_sum", torch.float64),
                                      ("index_added", torch.float64),
                                      ("index_added", torch.float32)])
def test_a_summation_order_that_varies_between_calls_is_no_drift(fn, dtype):
    """CUDA atomics (index_add_ with duplicate indices, scatter_add_): the low bits of a sum
    differ between calls (up to 1e-10 beside terms of 1e6). Exact maths, a correct gradient:
    it failed 'forward returns different values ... by up to 2.85e-11'; gradcheck passes it."""
    x = M.summation_inputs(dtype, big=1e6 if dtype == torch.float64 else 1e4)
    report = gradtool.check(getattr(M, fn), (x,), checks=["gradient"])
    check = result(report, "gradient")
    assert check.outcome.value == "passed", check.summary
    notes = " ".join(report.targets[0].cases[0].notes)
    assert "stochastic" not in notes
    if dtype == torch.float64:
        assert _gradcheck(getattr(M, fn), x)  # gradcheck judges float64 only
        assert gradtool.gradcheck(getattr(M, fn), (x.requires_grad_(),), raise_exception=False)


@pytest.mark.parametrize("drift,expected", [(1e-7, "failed"), (1e-9, "passed")])
def test_a_drift_finite_differences_resolve_fails_and_one_below_passes(drift, expected):
    """2 * x.sum() over 12 elements moved by `drift` every other call: its bound is
    2 eps (atol + rtol * 24) = 4.8e-8 (|J| estimated along all ones: 24); 1e-7 is beyond it and
    beyond gradcheck's tolerance (0.05 against 2e-3), 1e-9 within both."""
    x = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    M.DRIFT[0] = drift
    try:
        report = gradtool.check(M.drifting_by, (x,), checks=["gradient"])
        check = result(report, "gradient")
        assert check.outcome.value == expected, check.summary
        assert _gradcheck(M.drifting_by, x) == (expected == "passed")
        assert gradtool.gradcheck(M.drifting_by, (x.requires_grad_(),),
                                  raise_exception=False) == (expected == "passed")
    finally:
        M.DRIFT[0] = 0.0
    rules = [f.rule for f in check.findings]
    assert rules == (["gradient.forward_drift"] if expected == "failed" else [])
    notes = " ".join(report.targets[0].cases[0].notes)
    assert ("below what the checks resolve" in notes) == (expected == "passed")
    if expected == "failed":
        # the slope's own central difference carries the drift: 24 - 1e-7 / 2e-6
        assert "beyond the 4.79e-08 the checks could resolve" in check.summary


def test_a_complex_forward_drifting_fails_and_its_summation_order_passes():
    x = torch.randn(3, 4, dtype=torch.complex128)
    check = result(gradtool.check(M.drifting, (x,), checks=["complex"]), "complex")
    assert [f.rule for f in check.findings] == ["complex.forward_drift"], check.summary
    z = torch.complex(M.summation_inputs(), M.summation_inputs().flip(0))
    report = gradtool.check(M.shuffled_sum, (z,))
    assert report.ok(), [(c.name, c.summary) for _, _, c in report.checks()]
    assert _gradcheck(M.shuffled_sum, z)


def test_judge_compares_complex_outputs_part_by_part_and_names_garbage():
    """complex outputs always counted as drift (the last-bits test took floating tensors only);
    a NaN on one call only, or a difference of the values' own size, is drift at any scale."""
    from gradtool.numerics.problem import Problem
    from gradtool.targets.drift import judge

    x = torch.randn(6, dtype=torch.complex128)
    problem = Problem(lambda v: v * 2, [x], ["x"], [0])
    close = judge(problem, [x], [x * (1 + 4e-16)])
    assert not close.failing and close.benign and "of 6 elements" in close.benign[0][1]
    far = judge(problem, [x], [x + 1e-3j])
    assert far.failing and "beyond the" in far.failing[0][1]
    nan = torch.where(torch.arange(6) == 3, complex("nan"), x)
    assert "NaN on one call only at 1" in judge(problem, [x], [nan]).failing[0][1]
    assert not judge(problem, [x], [x.clone()]).benign


# ------------------------------------------------- item 5: an approximate backward named

def test_an_approximate_backward_is_named_with_its_size_and_the_verdict_stays():
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    check = result(gradtool.check(M.SeriesExp.apply, (x,)), "gradient")
    assert check.outcome.value == "failed"  # gradcheck's verdict, at the tolerance given
    line = next(d for d in check.details if d.startswith("an approximate backward"))
    assert "nonlinear in grad_output by" in line and "tighten it" in line


def test_a_wrong_linear_backward_is_not_called_approximate():
    from gradtool.run.approximate import approximate_noted

    check = result(gradtool.check(M.PaddedAVNegated.apply, M.padded_inputs(), mode="full",
                                  checks=["gradient"]), "gradient")
    assert check.outcome.value == "failed"
    assert not any("approximate" in d for d in check.details)
    assert approximate_noted([check]) == [check]  # no contract finding: nothing said


def _additive_mask(s_factor: float, mask_factor: float = 1.0):
    """softmax(s + mask) with its gradients scaled (1.0: correct): the -1e9 additive mask of
    attention, as a second input."""
    class Attn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, s, mask):
            p = torch.softmax(s + mask, -1)
            ctx.save_for_backward(p)
            return p

        @staticmethod
        def backward(ctx, g):
            p, = ctx.saved_tensors
            gs = p * (g - (g * p).sum(-1, keepdim=True))
            return gs * s_factor, gs * mask_factor
    return Attn.apply


def _masked_inputs(fill: float, into_scores: bool = False):
    gen = torch.Generator().manual_seed(5)
    s = torch.randn(4, 8, dtype=torch.float64, generator=gen)
    mask = torch.zeros(4, 8, dtype=torch.float64)
    if into_scores:      # the huge value in the same input as the scores beside it
        s[:, 5:] = fill
    else:
        mask[:, 5:] = fill
    return [s.requires_grad_(), mask.requires_grad_()]


@pytest.mark.parametrize("fill", [-1e9, -3.4e38])
@pytest.mark.parametrize("into_scores", [False, True])
@pytest.mark.parametrize("s_factor,mask_factor,expected", [
    (1.0, 1.0, "passed"), (1.5, 1.0, "failed"), (1.1, 1.0, "failed"), (1.7, 1.0, "failed"),
    (0.6, 1.0, "failed"), (1.0, 1.5, "failed")])
def test_a_huge_finite_mask_does_not_loosen_the_first_bound(fill, into_scores, s_factor,
                                                           mask_factor, expected):
    """The measured first bound's step-rounding term read max |x| over every input: a -1e9
    additive mask gave rtol 1.8, and a gradient 50 % wrong passed (gradcheck fails it). Each
    column's rtol is now its own |x_j|; the verdicts match gradcheck's."""
    inputs = _masked_inputs(fill, into_scores)
    fn = _additive_mask(s_factor, mask_factor)
    check = _gradient(fn, inputs)
    assert check.outcome.value == expected, check.summary
    theirs = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
    assert theirs == (expected == "passed")


def _expanded(x):
    """(x - 1)^10 as its expanded polynomial: correct, terms up to 252 cancel."""
    import math
    coefficients = [math.comb(10, k) * (-1) ** (10 - k) for k in range(11)]
    return sum(c * x ** k for k, c in enumerate(coefficients))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn,x", [
    (_expanded, lambda: 0.5 + torch.rand(8, dtype=torch.float64, generator=torch.Generator()
                                         .manual_seed(0))),
    (lambda x: x * 1000.0 - x * 999.0, lambda: torch.randn(8, generator=torch.Generator()
                                                           .manual_seed(0)))])
def test_correct_cancellation_in_low_precision_is_never_a_wrong_forward(dtype, fn, x):
    """The door cut a genuinely simulated rounding bound (terms that cancel) and called correct
    bfloat16 code a wrong forward; a difference within the uncut simulated bound is
    inconclusive (never passed by the cap, never failed as wrong)."""
    check = _gradient(fn, [x().to(dtype)])
    assert check.outcome.value in ("passed", "inconclusive"), check.summary
    if check.outcome.value == "inconclusive":
        assert "cannot resolve" in check.summary


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_wrong_cancelling_forward_in_low_precision_still_fails(dtype):
    """The twin: the same cancellation with a term off (999 -> 900), beyond any rounding the
    simulation saw, fails."""
    x = torch.randn(8, generator=torch.Generator().manual_seed(0)).to(dtype)
    check = _gradient(lambda v: v * 1000.0 - v * 999.0, [x], reference=f"{__file__}:_wrong_ref")
    assert check.outcome.value == "failed", check.summary


def _wrong_ref(v):
    return v.double() * 1000.0 - v.double() * 900.0
