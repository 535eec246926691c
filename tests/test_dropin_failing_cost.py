"""A failing drop-in call costs no more evaluations than torch's failing call (issue 56, item 6).

torch's failing gradcheck evaluates the function 2 n_in + 1 times forward and runs backward
n_out times twice (its Jacobian, then reentrancy), fast mode after its failing projection too.
The drop-in's lean path judges the call first; where it does not pass it, gradtool.check runs
for the report, reading the lean path's evaluations (f(x), the probe's and the colours' points,
its VJPs through the call's own graph: numerics/handed.py) instead of paying them again, and
its fast mode sweeps the failing pair's columns where they cost less than bisecting. Counted
in the user's Function (tests/fixtures/counted.py): a cheap tiny one, an adaptive solver vmap
cannot batch (every evaluation a plain call, as an ODE solver's), a fixed-step one it can.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import gradtool
from gradtool.numerics.handed import Handed, recording, record, served, serving

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from counted import Loss, counted, make  # noqa: E402

KINDS = [("tiny", 10), ("adaptive", 8), ("solver", 64)]


def _input(n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n)
    return torch.randn(n, dtype=torch.float64, generator=gen).requires_grad_()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("bug", ["scale", "sign", "one"])
@pytest.mark.parametrize("kind,n", KINDS, ids=[k for k, _ in KINDS])
def test_a_failing_call_evaluates_no_more_than_torchs(kind, n, bug, fast):
    func = make(kind, bug).apply
    x = _input(n)
    theirs_pass, theirs = counted(torch.autograd.gradcheck, func, (x,), fast_mode=fast)
    ours_pass, ours = counted(gradtool.gradcheck, func, (x,), fast_mode=fast)
    assert not ours_pass
    if theirs_pass:  # one element 1% off: torch's fast projection cannot see it
        assert bug == "one" and fast
        return
    assert ours["forward"] + ours["backward"] <= theirs["forward"] + theirs["backward"], \
        (ours, theirs)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
def test_the_cheaper_report_still_names_the_element_and_the_cause(fast):
    x = _input(10)
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradcheck(make("tiny", "scale").apply, (x,), fast_mode=fast)
    text = str(failed.value)
    assert "extra factor 1.01" in text and "mismatched elements 10 / 100" in text
    assert "look at:" in text and "reproduce:" in text
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradcheck(make("adaptive", "one").apply, (_input(8),), fast_mode=fast)
    assert "(2)->(2)" in str(failed.value)  # counted.py's element: n // 3


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("kind,n", KINDS, ids=[k for k, _ in KINDS])
def test_the_correct_twin_passes(kind, n, fast):
    assert gradtool.gradcheck(make(kind).apply, (_input(n),), fast_mode=fast)


def test_a_hand_over_serves_only_its_own_function_and_point():
    def f(a):
        return a * 2

    def g(a):
        return a * 2

    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    handed = Handed.of_call(f, (x, 1.0))
    with recording(handed):
        record(f, [0], [x.detach()], [torch.full((3,), 2.0, dtype=torch.float64)])
        record(g, [0], [x.detach() + 1], [torch.zeros(3, dtype=torch.float64)])  # not f: no
    assert served(f, [0], [x.detach()]) is None  # outside the hand-over
    with serving(handed):
        kept = served(f, [0], [x.detach()])
        assert kept is not None and torch.equal(kept[0], torch.full((3,), 2.0,
                                                                   dtype=torch.float64))
        kept[0].zero_()  # a copy: the record stays
        assert served(f, [0], [x.detach()])[0].sum() == 6
        assert served(g, [0], [x.detach()]) is None  # another function
        assert served(f, [0], [x.detach() + 1]) is None  # another point
        assert served(f, [0], [x.detach()], mask=[False]) == []


def test_a_random_forward_hands_nothing_over():
    """A forward drawing from torch's RNG fails the lean path's purity test: nothing recorded,
    the report's pipeline evaluates (and freezes the RNG) as before."""
    from torch.autograd import Function

    class Noisy(Function):
        @staticmethod
        def forward(ctx, x):
            return x * (1 + 1e-3 * torch.rand(()))

        @staticmethod
        def backward(ctx, grad):
            return 1.5 * grad

    x = _input(5)
    with pytest.raises(GradcheckError):
        gradtool.gradcheck(Noisy.apply, (x,))
    handed = Handed.of_call(Noisy.apply, (x,))
    from gradtool.dropin.lean import passes

    with recording(handed):
        passes(Noisy.apply, (x,), Noisy.apply(x), {"masked": False, "mode": "full",
                                                   "nondet_tol": 0.0, "eps": 1e-6,
                                                   "atol": 1e-5, "rtol": 1e-3,
                                                   "module_parameters": False})
    assert not handed.recorded and not handed.backwards


LABEL = torch.tensor([1, 3])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("label", [False, True], ids=["plain", "label"])
@pytest.mark.parametrize("kind,n", KINDS, ids=[k for k, _ in KINDS])
def test_a_module_hiding_a_wrong_function_costs_what_torchs_failing_call_does(kind, n, label,
                                                                             fast):
    """An nn.Module (entmax's losses' shape: a Function inside, an integer label beside): the
    report's pipeline calls a private copy of it, which reads the lean path's evaluations of
    the user's instance; the culprit search, a sweep of the Function alone as long as the
    model's, is said, not paid (read off the call's own graph: no recording forward). Beyond
    torch's: the lean path's purity forward (a passing call needs it) and, in fast mode, the
    probe's third point (its measured error)."""
    module = Loss(kind, "scale", n)
    args = (_input(n), LABEL) if label else (_input(n),)
    theirs_pass, theirs = counted(torch.autograd.gradcheck, module, args, fast_mode=fast)
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradcheck(module, args, fast_mode=fast)
    _, ours = counted(gradtool.gradcheck, module, args, fast_mode=fast)
    assert not theirs_pass
    extra = 2 if fast else 1
    assert ours["forward"] + ours["backward"] <= theirs["forward"] + theirs["backward"] + extra, \
        (ours, theirs)
    text = str(failed.value)
    assert f"{kind.capitalize()}Scale) not checked alone, for cost" in text
    assert "exhaustive=True" in text


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
def test_a_cheap_culprit_is_still_named_and_the_command_lines_search_is_unchanged(fast):
    """A Function of few elements is checked alone in the drop-in too; gradtool.check (the
    command line's run) checks a Function alone whatever it costs."""
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradcheck(Loss("tiny", "scale", 4), (_input(4),), fast_mode=fast)
    assert "TinyScale (" in str(failed.value) and "is wrong w.r.t. x" in str(failed.value)
    report = gradtool.check(Loss("tiny", "scale", 10), (_input(10),), checks=("gradient",))
    text = report.text() if hasattr(report, "text") else str(report)
    assert "is wrong w.r.t. x" in text and "not checked alone" not in text


def test_a_modules_private_copy_is_served_but_no_wrapper_around_it():
    """targets/cases.py declares a module's uncast copy to stand for the instance; a wrapper
    made around that call (functools.wraps copies attributes, not the declaration) is not."""
    import functools

    from gradtool.numerics.handed import stands_for

    module = Loss("tiny", None, 3)

    def call(*a):
        return module(*a)

    @functools.wraps(call)
    def wrapper(*a):
        return call(*a) * 2

    stands_for(call, module)
    x = _input(3)
    handed = Handed.of_call(module, (x,))
    with recording(handed):
        record(module, [0], [x.detach()], [torch.ones(())])
    with serving(handed):
        assert served(call, [0], [x.detach()]) is not None
        assert served(wrapper, [0], [x.detach()]) is None


def test_a_culprit_whose_evaluations_are_not_cheap_is_offered_not_paid(monkeypatch):
    """The same few-element Function, its forward taken as costly (the budget's time at zero):
    the drop-in says how to check it alone and replays nothing; exhaustive=True pays it."""
    from gradtool.run import budget

    monkeypatch.setattr(budget, "CHEAP_S", 0.0)
    module, x = Loss("tiny", "scale", 4), _input(4)
    _, ours = counted(gradtool.gradcheck, module, (x,))
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradcheck(module, (x,))
    assert "TinyScale) not checked alone, for cost (about 9 more" in str(failed.value)
    assert ours["forward"] <= 2 * 4 + 3  # the call, purity, its columns, the recording forward
    report = gradtool.check(module, (x,), checks=("gradient",), module_parameters=False,
                            exhaustive=True)
    assert "is wrong w.r.t. x" in report.text()


# gradgradcheck: torch's failing slow mode evaluates backward (a forward and a backward each)
# 2 n + 1 times over the inputs and grad_outputs, then runs backward of backward for its first
# failing output's rows, twice (reentrancy); the drop-in's slow mode stops at its first block
# with a confirmed failure (numerics/stopping.py:dropin_slow), its fast mode at its probe's.
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("kind,n", KINDS, ids=[k for k, _ in KINDS])
def test_a_failing_gradgradcheck_evaluates_no_more_than_torchs(kind, n, fast):
    func = make(kind, "double", tap=True).apply
    x = _input(n)
    assert counted(torch.autograd.gradcheck, func, (x,), fast_mode=fast)[0]  # first order right
    theirs_pass, theirs = counted(torch.autograd.gradgradcheck, func, (x,), fast_mode=fast)
    ours_pass, ours = counted(gradtool.gradgradcheck, func, (x,), fast_mode=fast)
    assert not theirs_pass and not ours_pass
    assert sum(ours.values()) <= sum(theirs.values()), (ours, theirs)
    assert ours["double"] <= theirs["double"], (ours, theirs)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("kind,n", KINDS, ids=[k for k, _ in KINDS])
def test_the_correct_double_backward_passes(kind, n, fast):
    assert gradtool.gradgradcheck(make(kind, tap=True).apply, (_input(n),), fast_mode=fast)


def test_a_stopped_gradgradcheck_report_names_element_cause_and_the_rest_left():
    x = _input(10)
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradgradcheck(make("tiny", "double", tap=True).apply, (x,))
    text = str(failed.value)
    assert "mismatched elements" in text and "diagnosis:" in text
    assert "look at:" in text and "reproduce:" in text
    assert "not checked: input(s) 'grad_output'" in text and "exhaustive=True" in text
    # exhaustive=True in gradcheck's scope: every block swept, the same verdict
    from gradtool.dropin.functions import _backward_of

    grad_output = torch.ones(10, dtype=torch.float64, requires_grad=True)
    backward = _backward_of(make("tiny", "double").apply, (x,), (grad_output,))
    for exhaustive in (True, False):
        report = gradtool.check(backward, (x, grad_output), mode="full", exhaustive=exhaustive,
                                module_parameters=False, checks=["gradient"])
        assert not report.ok()
        blocks = [b for _, _, c in report.checks() for b in c.blocks]
        assert all(b.exhaustive for b in blocks) == exhaustive
        assert sum(b.mismatched > 0 for b in blocks) == (2 if exhaustive else 1)


def test_a_failing_gradgradcheck_of_a_composite_costs_no_more_than_torchs():
    """A composite calling a Function whose double backward is wrong: gradgradcheck's failing
    call evaluates no more than torch's and its report points at the function, not at 'code
    between' the Functions inside (checked alone at first order, they pass)."""
    inner = make("tiny", "double")

    def composite(x):
        return inner.apply(x * 1.5) + x

    x = _input(6)
    assert torch.autograd.gradcheck(composite, (x,)) and gradtool.gradcheck(composite, (x,))
    theirs_pass, theirs = counted(torch.autograd.gradgradcheck, composite, (x,))
    ours_pass, ours = counted(gradtool.gradgradcheck, composite, (x,))
    assert not theirs_pass and not ours_pass
    assert ours["forward"] + ours["backward"] <= theirs["forward"] + theirs["backward"], \
        (ours, theirs)
    with pytest.raises(GradcheckError) as failed:
        gradtool.gradgradcheck(composite, (x,))
    text = str(failed.value)
    assert "code between them" not in text and "mismatched elements" in text
    assert "look at:" in text


def test_gradgradchecks_backward_gets_no_first_order_culprit_search(monkeypatch):
    """The culprit search checks each Function inside alone at first order: on gradgradcheck's
    function (backward itself) it cannot show the wrong second derivative, so it is not paid;
    gradcheck's failing call of the same composite still runs it."""
    from gradtool.run import received

    searched = []
    real = received.annotate
    monkeypatch.setattr(received, "annotate", lambda *a, **k: searched.append(1) or real(*a, **k))
    inner, good = make("tiny", "double"), make("tiny", None)
    x = _input(6)
    with pytest.raises(GradcheckError):
        gradtool.gradgradcheck(lambda t: inner.apply(t) + good.apply(t), (x,))
    assert not searched
    wrong = make("tiny", "scale")
    with pytest.raises(GradcheckError):
        gradtool.gradcheck(lambda t: wrong.apply(t) + good.apply(t), (x,))
    assert searched
