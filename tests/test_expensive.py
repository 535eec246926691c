"""Hand-written adjoints of expensive forwards (issue 35's fixtures): each correct twin passes
every default check, each seeded bug fails the check it breaks, and a second order of a backward
already wrong at first order stops at its first failure, saying so."""

from __future__ import annotations

import pytest
from conftest import load_fixture, result

import gradtool

E = load_fixture("expensive")
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


def test_second_order_of_a_backward_wrong_at_first_order_stops_at_its_first_failure():
    cls, inputs = E.BROYDEN["W sign"], INPUTS["Broyden root"]
    both = gradtool.check(cls, inputs, checks=("gradient", "double_backward"), mode="full")
    assert result(both, "gradient").outcome.value == "failed"
    stopped = result(both, "double_backward")
    assert stopped.outcome.value == "failed"
    assert any(d.startswith("not checked: input(s) 'grad_output', for cost: backward is "
                            "already wrong at first order") for d in stopped.details)
    alone = result(gradtool.check(cls, inputs, checks=("double_backward",), mode="full"),
                   "double_backward")
    assert alone.outcome.value == "failed"
    assert not any(d.startswith("not checked") for d in alone.details)
    assert stopped.calls["forward"] < alone.calls["forward"]
    # the blocks it did check say the same as the whole run
    seen = [(b.input, b.output, b.mismatched) for b in stopped.blocks if b.checked]
    assert seen == [(b.input, b.output, b.mismatched) for b in alone.blocks
                    if b.input != "grad_output"]


def test_a_second_order_failure_is_still_found_when_the_first_order_passes():
    report = gradtool.check(E.ADJOINT_ODE["detached 2nd order"], INPUTS["adjoint ODE (RK4)"],
                            checks=("gradient", "double_backward"), mode="full")
    assert result(report, "gradient").outcome.value == "passed"
    second = result(report, "double_backward")
    assert second.outcome.value == "failed"
    assert not any(d.startswith("not checked") for d in second.details)
