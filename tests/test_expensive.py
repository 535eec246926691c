"""Hand-written adjoints of expensive forwards (issue 35's fixtures): each correct twin passes
every default check, each seeded bug fails the check it breaks, and a second order of a backward
already wrong at first order stops at its first failure, saying so."""

from __future__ import annotations

import pytest
from conftest import load_fixture, result

import gradtool

E = load_fixture("expensive")
B = load_fixture("bugs")
INPUTS = {"adjoint ODE (RK4)": ["(6,)", "(6,)"], "shifted CG solve": ["5x5", "(5,)"],
          "Broyden root": ["(8,)", "8x8:[-0.15,0.15]"],
          "scan recurrence": ["8x5", "(5,)", "5x5:[-0.4,0.4]"]}
# which checks each seeded bug fails (the second order of a wrong backward may stay consistent)
FAILS = {"detached 2nd order": {"double_backward"}}
ROWS = [(family, bug) for family, bugs in E.HANDWRITTEN.items() for bug in bugs]


@pytest.mark.parametrize("family, bug", ROWS, ids=[f"{f}-{b}" for f, b in ROWS])
def test_correct_twins_pass_and_seeded_bugs_fail(family, bug):
    report = gradtool.check(E.HANDWRITTEN[family][bug], INPUTS[family], mode="full")
    failed = {c.name for _, _, c in report.checks() if c.outcome.value != "passed"
              and c.outcome.value != "skipped"}
    if bug == "correct":
        assert not failed
    else:
        assert FAILS.get(bug, {"gradient"}) <= failed, failed
        assert failed <= {"gradient", "double_backward"}


def _counted(cls, counter):
    class Counted(cls):
        @staticmethod
        def forward(ctx, *args):
            counter["forward"] += 1
            return cls.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            counter["backward"] += 1
            return cls.backward(ctx, *grads)

    Counted.__name__ = cls.__name__
    return Counted


def test_second_order_of_a_backward_wrong_at_first_order_stops_at_its_first_failure():
    """W's gradient has the wrong sign: the second order is swept from W (whose first order
    failed), compared output by output, and stops at its first confirmed block, (W, grad of x),
    whose analytical rows are the only ones computed; the whole run finds the same block."""
    from collections import Counter

    cls, inputs = E.BROYDEN["W sign"], INPUTS["Broyden root"]
    calls: Counter = Counter()
    both = gradtool.check(_counted(cls, calls), inputs, checks=("gradient", "double_backward"),
                          mode="full")
    assert result(both, "gradient").outcome.value == "failed"
    stopped = result(both, "double_backward")
    assert stopped.outcome.value == "failed"
    assert any(d.startswith("not checked: input(s) 'args[0]', 'grad_output' and "
                            "'grad of args[1]' w.r.t. 'args[1]', for cost: backward is already "
                            "wrong at first order") for d in stopped.details)
    assert {f.rule for f in stopped.findings} == {"double_backward.mismatch",
                                                  "double_backward.no_pattern"}
    alone = result(gradtool.check(_counted(cls, Counter()), inputs,
                                  checks=("double_backward",), mode="full"), "double_backward")
    assert alone.outcome.value == "failed"
    assert not any(d.startswith("not checked") for d in alone.details)
    # the blocks it did check say the same as the whole run
    seen = [(b.input, b.output, b.mismatched) for b in stopped.blocks if b.checked]
    assert seen == [("args[1]", "grad of args[0]", 508)]
    assert seen[0] in [(b.input, b.output, b.mismatched) for b in alone.blocks]
    # At the Function: G's 64 W columns (a backward each, through the forwards the gradient
    # check's sweep ran at the same points, but the first) and only grad of x's 8 analytical
    # rows (each runs backward again through the saved root); before, x's columns were swept
    # first, each with a forward of its own, and every one of the 72 rows computed: 296
    # forwards, 233 backwards.
    assert (calls["forward"], calls["backward"]) == (151, 152)
    assert stopped.calls["forward"] < alone.calls["forward"]


def test_second_order_stops_too_when_auto_mode_probes_first_and_turns_to_full_mode():
    """Auto mode over its budget probes G; the failing probe turns to full mode, which still
    stops at the first confirmed block (it swept every column before: the adjoint-solver rows
    of benchmarks/adjoint_solvers.py paid for the whole sweep)."""
    cls, inputs = E.BROYDEN["W sign"], INPUTS["Broyden root"]
    report = gradtool.check(cls, inputs, checks=("gradient", "double_backward"),
                            full_budget_s=0.0)
    stopped = result(report, "double_backward")
    assert stopped.outcome.value == "failed"
    assert "the probe failed" in stopped.mode_reason
    assert any(d.startswith("not checked: ") for d in stopped.details)
    assert [(b.input, b.output) for b in stopped.blocks if b.mismatched] == \
        [("w", "grad of x")]


def test_second_order_stops_at_its_first_input_when_that_input_fails_first_order_only():
    """Broyden with the adjoint not transposed fails at first order in both x and W: the
    second order is swept in the usual order and stops at x, computing grad of x's rows only."""
    from collections import Counter

    cls, inputs = E.BROYDEN["adjoint not transposed"], INPUTS["Broyden root"]
    calls: Counter = Counter()
    both = gradtool.check(_counted(cls, calls), inputs, checks=("gradient", "double_backward"),
                          mode="full")
    stopped = result(both, "double_backward")
    assert stopped.outcome.value == "failed"
    seen = [(b.input, b.output, b.mismatched) for b in stopped.blocks if b.checked]
    assert seen == [("args[0]", "grad of args[0]", 62)]  # the whole run's count there too
    assert {f.rule for f in stopped.findings} <= {"double_backward.mismatch",
                                                  "double_backward.no_pattern"}
    # the 64 analytical rows of grad of W are never computed (before: 172 / 105)
    assert (calls["forward"], calls["backward"]) == (153, 40)


def test_a_second_order_failure_is_still_found_when_the_first_order_passes():
    """A backward computed without a graph (the adjoint integrated under no_grad) has a zero
    second derivative everywhere: double backward stops at its first confirmed block, swept
    from the grad_output columns (a backward each through one forward's graph), and says why;
    a backward whose gradient keeps a graph through grad_output (CubeDetached: x detached)
    is checked whole."""
    from collections import Counter

    calls: Counter = Counter()
    report = gradtool.check(_counted(E.ADJOINT_ODE["detached 2nd order"], calls),
                            INPUTS["adjoint ODE (RK4)"], checks=("gradient", "double_backward"),
                            mode="full")
    assert result(report, "gradient").outcome.value == "passed"
    second = result(report, "double_backward")
    assert second.outcome.value == "failed"
    assert any(d.startswith("not checked: input(s) 'args[0]', 'args[1]', for cost: backward's "
                            "gradients carry no graph") for d in second.details)
    assert {b.input for b in second.blocks if b.checked} == {"grad_output"}
    # the blocks left are not reported as swept whole (JSON's `exhaustive`)
    assert all(not b.exhaustive for b in second.blocks if b.input != "grad_output")
    assert any(f.rule == "double_backward.mismatch" for f in second.findings)
    # backward's whole second derivative is zero: the grad_output block is compared only up
    # to its first confirmed failing column, and said so
    assert any(d.startswith("compared in part: 2 of ") for d in second.details)
    # at the Function, gradient and double backward together (before: 33 and 48; 30 and 23
    # before the zero block's cut at its first confirmed failing column)
    assert (calls["forward"], calls["backward"]) == (30, 15)

    kept = result(gradtool.check(B.CubeDetached, ["(5,)"], checks=("double_backward",),
                                 mode="full"), "double_backward")
    assert kept.outcome.value == "failed"
    assert not any(d.startswith("not checked") for d in kept.details)
    assert {b.input for b in kept.blocks if b.mismatched} == {"x"}


class _Slow(E.Function):
    """x * 2 with a forward that takes 110 ms (the probe times it); backward's factor set below."""

    factor = 2.0

    @staticmethod
    def forward(ctx, x):
        import time

        time.sleep(0.11)
        return x * 2

    @classmethod
    def backward(cls, ctx, grad):
        return grad * cls.factor


class _SlowWrong(_Slow):
    factor = 3.0


def test_an_expensive_forward_whose_gradient_failed_skips_layouts_and_says_how_to_run_them():
    failed = gradtool.check(_SlowWrong, ["(2,)"])
    assert result(failed, "gradient").outcome.value == "failed"
    layout = result(failed, "layout")
    assert layout.outcome.value == "skipped"
    assert layout.summary.startswith("skipped for cost: each forward takes")
    assert "the gradient check failed" in layout.summary
    assert "--check layout runs it" in layout.summary
    asked = result(gradtool.check(_SlowWrong, ["(2,)"], checks=("gradient", "layout")), "layout")
    assert asked.outcome.value != "skipped"
    assert "--exhaustive" in layout.summary  # which keeps every check whole
    whole = result(gradtool.check(_SlowWrong, ["(2,)"], exhaustive=True), "layout")
    assert whole.outcome.value != "skipped"
    correct = gradtool.check(_Slow, ["(2,)"])
    assert result(correct, "layout").outcome.value == "passed"


def test_the_probe_times_the_forward():
    from gradtool.config.settings import CheckConfig
    from gradtool.targets.cases import build_case
    from gradtool.targets.inputs import parse_input
    from gradtool.targets.probe import probe
    from gradtool.targets.resolve import make_target

    case = build_case(make_target(_Slow, "slow"), [parse_input("(2,)")], CheckConfig(), 0)
    assert probe(case).forward_seconds >= 0.1


class _NonlinearInGrad(E.HANDWRITTEN["adjoint ODE (RK4)"]["correct"]):
    """A broken twin for the mirror: backward not linear in grad_output (grad * |grad|)."""

    @staticmethod
    def backward(ctx, grad):
        grads = E.HANDWRITTEN["adjoint ODE (RK4)"]["correct"].backward(ctx, grad * grad.abs())
        return grads


@pytest.mark.parametrize("cls", [E.HANDWRITTEN["adjoint ODE (RK4)"]["correct"],
                                 E.HANDWRITTEN["adjoint ODE (RK4)"]["detached 2nd order"],
                                 _NonlinearInGrad])
def test_grad_output_columns_mirror_their_plus_side_only_when_backward_is_linear(
        cls, monkeypatch):
    from collections import Counter

    from gradtool.checks import double_backward

    def run():
        counter = Counter()
        # exhaustive: every grad_output column, so what is saved is the mirror's alone (the
        # cut at a zero block's first confirmed failure would compare 2 of them)
        report = gradtool.check(_counted(cls, counter), INPUTS["adjoint ODE (RK4)"],
                                mode="full", checks=("contract", "double_backward"),
                                exhaustive=True)
        check = result(report, "double_backward")
        return counter, check.outcome, [(b.input, b.output, b.mismatched) for b in check.blocks]

    def report_of(cls):
        return gradtool.check(cls, INPUTS["adjoint ODE (RK4)"], checks=("contract",))

    mirrored = run()
    monkeypatch.setattr(double_backward, "linear_inputs", lambda problem, n, k: ())
    plain = run()
    assert mirrored[1:] == plain[1:]  # the same verdict, block by block
    saved = plain[0]["backward"] - mirrored[0]["backward"]
    if cls is _NonlinearInGrad:  # the contract found backward nonlinear: nothing mirrored
        assert saved == 0
        assert result(report_of(cls), "contract").outcome.value == "failed"
    else:  # one backward per grad_output column, and one at the base point
        assert saved >= 6 - 1
