"""gradtool.gradcheck / gradgradcheck against torch's own functions: the same return value or
exception type on correct twins and seeded bugs over gradcheck's keywords, gradtool's report as
the message."""

from __future__ import annotations

import inspect
import re
import sys

import pytest
import torch
from torch.autograd import Function

import gradtool
from fixtures.bugs import (Cube, CubeDetached, CubeMissingFactor, CubeOneElement, CubeScaled,
                           CubeSignFlip, Linear, LinearDetached, LinearOneElement, LinearSignFlip)

GradcheckError = sys.modules["torch.autograd.gradcheck"].GradcheckError
D = torch.float64


class Double(Function):
    """2x with a jvp; the wrong twin's jvp is 1% off (backward right)."""

    factor = 2.0

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2

    @classmethod
    def jvp(cls, ctx, t):
        return t * cls.factor


class DoubleJvpWrong(Double):
    factor = 2.02


class TwoOutputs(Function):
    """(2x, 3x); the wrong twin does not handle an undefined grad_output."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        return (0 if g1 is None else g1 * 2) + (0 if g2 is None else g2 * 3)


class TwoOutputsUndefined(TwoOutputs):
    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * 2 + g2 * 3


class Noisy(Cube):
    """backward adds noise far below any tolerance: not reentrant at nondet_tol 0."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x ** 2 + 1e-9 * torch.rand_like(x)


class Twice(Function):
    """2z on complex values; the wrong twin's backward conjugates its gradient."""

    @staticmethod
    def forward(ctx, z):
        return z * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TwiceConjugated(Twice):
    @staticmethod
    def backward(ctx, g):
        return (g * 2).conj()


def _z(n):
    return torch.randn(n, dtype=torch.complex128, requires_grad=True)


def _x(*shape):
    return torch.randn(*shape, dtype=D, requires_grad=True)


def _linear():
    return (_x(3, 4), _x(2, 4), _x(2))


def _pad(x, mode):
    return torch.nn.functional.pad(x, (1, 1), mode=mode) * x.sum()


# name: (func, inputs maker, correct?)
FIXTURES = {
    "cube": (Cube.apply, lambda: (_x(2, 3),), True),
    "cube one element": (CubeOneElement.apply, lambda: (_x(2, 3),), False),
    "cube scaled": (CubeScaled.apply, lambda: (_x(2, 3),), False),
    "cube sign": (CubeSignFlip.apply, lambda: (_x(2, 3),), False),
    "cube factor": (CubeMissingFactor.apply, lambda: (_x(2, 3),), False),
    "cube detached": (CubeDetached.apply, lambda: (_x(2, 3),), "second"),
    "linear": (Linear.apply, _linear, True),
    "linear one element": (LinearOneElement.apply, _linear, False),
    "linear sign": (LinearSignFlip.apply, _linear, False),
    "linear detached": (LinearDetached.apply, _linear, "second"),
    "composite": (lambda x: Cube.apply(x).sin(), lambda: (_x(5),), True),
    "composite scaled": (lambda x: CubeScaled.apply(x).sin(), lambda: (_x(5),), False),
    "jvp": (lambda x: Double.apply(x).sin(), lambda: (_x(4),), True),
    "jvp wrong": (lambda x: DoubleJvpWrong.apply(x).sin(), lambda: (_x(4),), "forward"),
    "two outputs": (TwoOutputs.apply, lambda: (_x(3),), True),
    "two outputs undefined": (TwoOutputsUndefined.apply, lambda: (_x(3),), "undefined"),
    "noisy": (Noisy.apply, lambda: (_x(4),), "reentrant"),
    "complex": (lambda z: Twice.apply(z) * 1j, lambda: (_z(3),), True),
    "complex conjugated": (lambda z: TwiceConjugated.apply(z) * 1j, lambda: (_z(3),), False),
    "module": (torch.nn.Linear(3, 2).double(), lambda: (_x(2, 3),), True),
    "string argument": (_pad, lambda: (_x(1, 2, 3), "replicate"), True),
}

GRADCHECK_KEYWORDS = [
    {}, {"fast_mode": True}, {"check_batched_grad": True}, {"check_forward_ad": True},
    {"check_forward_ad": True, "check_backward_ad": False, "check_batched_forward_grad": True},
    {"check_undefined_grad": False}, {"raise_exception": False},
    {"check_grad_dtypes": True, "nondet_tol": 1e-6},
    {"fast_mode": True, "check_forward_ad": True, "check_batched_grad": True},
]
GRADGRADCHECK_KEYWORDS = [
    {}, {"fast_mode": True}, {"check_batched_grad": True}, {"check_fwd_over_rev": True},
    {"gen_non_contig_grad_outputs": True}, {"raise_exception": False},
    {"check_undefined_grad": False}, {"check_rev_over_rev": False, "check_fwd_over_rev": True},
]
QUICK = ({}, {"fast_mode": True}, {"check_forward_ad": True})


def outcome(fn, *args, **kwargs):
    """("returned", value) or (exception kind, exception): a GradcheckError is one kind."""
    try:
        return "returned", fn(*args, **kwargs)
    except GradcheckError as exc:
        return "GradcheckError", exc
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return type(exc).__name__, exc


def same_verdict(name, theirs, ours, keywords):
    func, make, correct = FIXTURES[name]
    torch.manual_seed(0)
    inputs = make()
    expected = outcome(theirs, func, inputs, **keywords)
    got = outcome(ours, func, inputs, **keywords)
    if correct is not True and got[0] == "GradcheckError" and \
            getattr(got[1], "report", None) is not None:
        return got  # gradtool found the seeded bug (torch may miss it, or stop elsewhere first)
    if expected == ("returned", True) and correct is not True:
        # torch's finite differences or fast mode may miss a seeded bug; gradtool may not
        assert got[0] in ("returned", "GradcheckError"), got
        return got
    assert (got[0], got[1] if got[0] == "returned" else None) == \
        (expected[0], expected[1] if expected[0] == "returned" else None), (expected, got)
    return got


@pytest.mark.parametrize("keywords", QUICK, ids=str)
@pytest.mark.parametrize("name", list(FIXTURES))
def test_gradcheck_agrees_with_torch(name, keywords):
    got = same_verdict(name, torch.autograd.gradcheck, gradtool.gradcheck, keywords)
    if got[0] == "GradcheckError" and isinstance(got[1], gradtool.dropin.GradcheckFailure) \
            and got[1].report is not None:
        assert "look at:" in str(got[1]) and "reproduce:" in str(got[1])


@pytest.mark.slow
@pytest.mark.parametrize("keywords", GRADCHECK_KEYWORDS, ids=str)
@pytest.mark.parametrize("name", list(FIXTURES))
def test_gradcheck_keywords_agree_with_torch(name, keywords):
    same_verdict(name, torch.autograd.gradcheck, gradtool.gradcheck, keywords)


@pytest.mark.parametrize("keywords", QUICK[:2], ids=str)
@pytest.mark.parametrize("name", ["cube", "cube detached", "linear", "linear detached",
                                  "composite", "module"])
def test_gradgradcheck_agrees_with_torch(name, keywords):
    same_verdict(name, torch.autograd.gradgradcheck, gradtool.gradgradcheck, keywords)


@pytest.mark.slow
@pytest.mark.parametrize("keywords", GRADGRADCHECK_KEYWORDS, ids=str)
# Noisy's backward is random: torch's finite differences of it fail on that noise alone, where
# gradtool freezes the RNG around each evaluation (its second derivative is right).
@pytest.mark.parametrize("name", [n for n in FIXTURES if n != "noisy"])
def test_gradgradcheck_keywords_agree_with_torch(name, keywords):
    same_verdict(name, torch.autograd.gradgradcheck, gradtool.gradgradcheck, keywords)


# As a command line run here would load it: its dotted name where that imports from the working
# directory, else its file (run/reproduce.py:loadable_location).
CLASS_NAMED = re.compile(r"(fixtures\.bugs|\S*fixtures/bugs\.py):CubeScaled")


def test_a_wrong_gradient_raises_torchs_error_with_gradtools_report():
    x = _x(2, 3)
    with pytest.raises(GradcheckError) as raised:
        gradtool.gradcheck(CubeScaled.apply, (x,))
    text = str(raised.value)
    assert "CubeScaled" in text and "factor 1.01" in text and "look at:" in text
    assert CLASS_NAMED.search(text)  # named by its class, not Function.apply
    assert gradtool.gradcheck(CubeScaled.apply, (x,), raise_exception=False) is False


def test_caller_grad_outputs_are_used():
    x, v = _x(3), torch.zeros(3, dtype=D, requires_grad=True)
    # At v = 0 the detached backward's loss of its second derivative along x is invisible
    # (v multiplies it), as for torch's own gradgradcheck at the same v.
    assert gradtool.gradgradcheck(CubeDetached.apply, (x,), (v,)) is \
        torch.autograd.gradgradcheck(CubeDetached.apply, (x,), (v,)) is True
    with pytest.raises(GradcheckError):
        gradtool.gradgradcheck(CubeDetached.apply, (x,), (torch.ones(3, dtype=D),))


def test_the_users_exception_propagates_unchanged():
    class Boom(Exception):
        pass

    class RaisesInBackward(Cube):
        @staticmethod
        def backward(ctx, grad):
            raise Boom("backward")

    def forward_raises(x):
        raise Boom("forward")

    for func in (forward_raises, RaisesInBackward.apply):
        with pytest.raises(Boom):
            gradtool.gradcheck(func, (_x(3),))


def test_a_modules_parameters_are_not_checked():
    module = torch.nn.Linear(3, 2).double()
    calls = []
    module.register_forward_hook(lambda *a: calls.append(1))
    report = gradtool.check(module, (_x(4, 3),), module_parameters=False, checks=("gradient",))
    inputs = report.targets[0].cases[0].inputs
    assert [i.name for i in inputs if i.differentiable] == ["input"]
    assert gradtool.gradcheck(module, (_x(4, 3),)) is True


def test_a_module_checked_without_its_parameters_is_called_without_swapping(monkeypatch):
    import torch.nn.utils.stateless as stateless

    real, swaps = stateless._reparametrize_module, []
    monkeypatch.setattr(stateless, "_reparametrize_module",
                        lambda *a, **k: (swaps.append(1), real(*a, **k))[1])
    module = torch.nn.Linear(3, 2).double()
    assert gradtool.check(module, (_x(4, 3),), module_parameters=False,
                          checks=("gradient",)).ok()
    assert swaps == []  # gradtool's own copy, nothing of it checked: called as it is
    assert gradtool.check(module, (_x(4, 3),), checks=("gradient",)).ok()
    assert swaps  # its parameters checked: swapped in on every call


def test_extra_checks_opt_in_runs_gradtools_default_checks():
    from gradtool.config.registry import DEFAULT_CHECKS

    x = _x(3)
    assert gradtool.gradcheck(Cube.apply, (x,), extra_checks=True) is True
    with pytest.raises(GradcheckError) as raised:
        gradtool.gradcheck(CubeDetached.apply, (x,), extra_checks=True)  # double backward
    names = {k.name for _, _, k in raised.value.report.checks()}
    assert {"contract", "gradient", "double_backward", "layout"} <= names <= set(DEFAULT_CHECKS)
    failed = {k.name for _, _, k in raised.value.report.checks() if k.outcome.value == "failed"}
    assert failed == {"double_backward"}


@pytest.mark.parametrize("ours,theirs", [(gradtool.gradcheck, torch.autograd.gradcheck),
                                         (gradtool.gradgradcheck, torch.autograd.gradgradcheck)])
def test_signatures_are_torchs(ours, theirs):
    mine, torchs = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    assert list(mine)[:len(torchs)] == list(torchs) and list(mine)[len(torchs):] == \
        ["extra_checks"]
    for name, param in torchs.items():
        assert (mine[name].kind, mine[name].default) == (param.kind, param.default), name


def test_keyword_combinations_torch_refuses_are_refused_alike():
    for keywords in ({"check_backward_ad": False},
                     {"check_batched_forward_grad": True},
                     {"check_batched_grad": True, "check_backward_ad": False,
                      "check_forward_ad": True}):
        assert outcome(gradtool.gradcheck, Cube.apply, (_x(2),), **keywords)[0] == \
            outcome(torch.autograd.gradcheck, Cube.apply, (_x(2),), **keywords)[0] == \
            "AssertionError"


def test_a_report_is_true_exactly_when_ok():
    x = _x(2, 3)
    wrong = gradtool.check(CubeScaled, (x,), checks=("gradient",))
    with pytest.raises(AssertionError):
        assert wrong
    assert not wrong.ok() and bool(gradtool.check(Cube, (x,), checks=("gradient",)))


def test_a_function_given_as_apply_is_named_by_its_class_everywhere(monkeypatch):
    import json

    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # else reproduce: names this test, not the target

    from gradtool.render.json import render_json as render

    report = gradtool.check(CubeScaled.apply, (_x(3),), checks=("gradient",))
    target = report.targets[0]
    assert CLASS_NAMED.fullmatch(target.target) and target.kind == "function"
    assert json.loads(render(report))["targets"][0]["target"] == target.target
    assert f"gradtool check {target.target} " in report.targets[0].cases[0].reproduce


def test_a_module_that_cannot_be_copied_is_checked_as_torch_checks_it():
    """A module gradtool cannot deep-copy (a lock) is called itself with its state swapped for
    clones (issue 48): the same verdict as torch's, its weights untouched."""
    import threading

    module = torch.nn.Linear(3, 2).double()
    module.lock = threading.Lock()
    before = module.weight.detach().clone()
    x = _x(2, 3)
    assert gradtool.gradcheck(module, (x,)) is torch.autograd.gradcheck(module, (x,)) is True
    assert torch.equal(module.weight, before) and module.weight.grad is None


def test_gradgradchecks_report_reproduces_the_users_call_not_gradtools_wrapper():
    with pytest.raises(GradcheckError) as raised:
        gradtool.gradgradcheck(CubeDetached.apply, (_x(4),))
    text = str(raised.value)
    assert "reproduce: gradtool.gradgradcheck(CubeDetached.apply, <the same inputs>)" in text
    assert "dropin/functions.py" not in text  # look at: the user's backward, not the wrapper


@pytest.mark.parametrize("ours, theirs, keywords", [
    (gradtool.gradcheck, torch.autograd.gradcheck, {"check_backward_ad": False}),
    (gradtool.gradcheck, torch.autograd.gradcheck, {"check_batched_forward_grad": True}),
    (gradtool.gradgradcheck, torch.autograd.gradgradcheck, {"check_rev_over_rev": False}),
    (gradtool.gradgradcheck, torch.autograd.gradgradcheck,
     {"check_rev_over_rev": False, "check_fwd_over_rev": True, "check_undefined_grad": False,
      "check_batched_grad": True})])
def test_a_refused_keyword_combination_is_refused_in_torchs_words(ours, theirs, keywords):
    words = []
    for check in (ours, theirs):
        with pytest.raises(AssertionError) as raised:
            check(Cube.apply, (_x(2),), **keywords)
        words.append(str(raised.value))
    assert words[0] == words[1]
