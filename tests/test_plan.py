"""The cost plan (run/plan.py, issue 58 item 2): every check's evaluations counted before the first
runs, against what the checks then pay (call counts, never times); the plan's order; its reads
are the ledger's; the heartbeat and the progress line get the case's whole total."""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace

import pytest
from conftest import load_fixture
from test_ledger import targets
from test_true_numbers import published  # noqa: F401 - the heartbeat's states, as published

import gradtool
from gradtool.cli.progress import Watch
from gradtool.config.registry import BY_NAME, DEFAULT_CHECKS
from gradtool.numerics.ledger import SWITCH
from gradtool.render.words import beyond_text
from gradtool.results import Outcome
from gradtool.run.plan import EXACT, order

# Correct code the plan does not count exactly, and why (each pays more than planned):
# WithPlaceholder's backward ignores an output that depends on no input (a placeholder): the
# contract pays a forward to see that it depends on none.
NOT_COUNTED = {"WithPlaceholder": "contract"}


def measured(check) -> bool:
    """Elements beyond the first bound measured at 2h and 3h (numerics/measured.py: noisy finite
    differences, an iterative solver's): evaluations outside the plan, said in the details."""
    return check.tolerance.get("measured_error", 0.0) > 0


def paid(check) -> tuple[int, int, int, int]:
    calls = check.calls
    return (calls.get("forward", 0), calls.get("backward", 0), calls.get("forward read", 0),
            calls.get("backward read", 0))


def planned(cost) -> tuple[int, int, int, int]:
    return cost.forward, cost.backward, cost.forward_read, cost.backward_read


def holds(cost, got: tuple[int, int, int, int]) -> bool:
    """Exact: each kind's paid and read together as planned (a share the ledger cannot serve at
    run time, an engine-summed gradient, is paid instead of read); at most: no more. Either way
    no more read than planned."""
    want = planned(cost)
    totals = [(got[k] + got[k + 2], want[k] + want[k + 2]) for k in (0, 1)]
    reads = got[2] <= want[2] and got[3] <= want[3]
    if cost.bound == EXACT:
        return reads and all(a == b for a, b in totals)
    return reads and all(a <= b for a, b in totals)


def compare(fixture: str, functions_only: bool = False, **options) -> int:
    """Every check of every correct target the fixture defines (every check passed or did not
    apply: a failure anywhere loses shares and pays confirmations) against its plan; the count
    of checks compared."""
    compared = 0
    for name, obj in targets(fixture, functions_only):
        try:
            report = gradtool.check(obj, seed=0, **options)
        except Exception:  # noqa: BLE001 - an input that cannot be inferred: nothing to plan
            continue
        for case in (c for t in report.targets for c in t.cases):
            costs = {p.check: p for p in case.plan}
            assert [p.check for p in case.plan] == [c.name for c in case.checks
                                                    if c.name in costs], (name, case.plan)
            if any(c.outcome not in (Outcome.PASSED, Outcome.SKIPPED) for c in case.checks):
                continue
            for check in case.checks:
                cost = costs.get(check.name)
                if check.outcome is not Outcome.PASSED or cost is None or not cost.planned \
                        or NOT_COUNTED.get(name) == check.name or measured(check) \
                        or check.findings:  # a warning's confirmations: beyond the plan too
                    continue
                assert holds(cost, paid(check)), (fixture, name, check.name, cost, check.calls)
                compared += 1
    return compared


@pytest.mark.parametrize("fixture", ("layouts", "contract_cases"))
def test_the_plan_counts_what_correct_code_pays(fixture):
    assert compare(fixture, functions_only=True) >= 12


def test_the_plan_counts_probe_mode_too():
    """--mode probe: the gradient check's and double backward's probes, at most."""
    assert compare("layouts", functions_only=True, mode="probe") >= 12


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ("truth", "bugs", "wolf", "models", "catalogue",
                                     "three_functions", "sharp", "expensive"))
def test_the_plan_counts_what_correct_code_pays_everywhere(fixture):
    assert compare(fixture) >= 5


def test_a_measured_tolerance_is_outside_the_plan_and_said():
    """A CG solve (expensive.cg, correct): its noisy finite differences are measured at 2h and
    3h beyond the first bound; those evaluations are beyond the plan's columns, and the
    details say the tolerance was measured."""
    case = _case(load_fixture("expensive").cg, checks=["gradient"])
    gradient, cost = case.checks[0], case.plan[0]
    assert gradient.outcome is Outcome.PASSED and measured(gradient)
    assert paid(gradient)[0] > cost.forward
    assert any(d.startswith("tolerance measured: finite-difference error") for d in
               gradient.details)


def _case(obj, **kwargs):
    report = gradtool.check(obj, seed=0, **kwargs)
    return report.targets[0].cases[0]


def test_the_contract_and_layout_counts_are_exact_and_their_reads_the_ledger_s(monkeypatch):
    """RowScale: contract 4 backwards and 2 read from the gradient rows, the gradient check's
    priming forward and the layout baseline read from the contract's graph, as the plan said;
    with GRADTOOL_LEDGER=0 none is planned read and none is read."""
    layouts = load_fixture("layouts")
    case = _case(layouts.RowScale)
    costs, checks = {p.check: p for p in case.plan}, {c.name: c for c in case.checks}
    assert planned(costs["contract"]) == paid(checks["contract"]) == (0, 4, 0, 2)
    assert planned(costs["layout"]) == paid(checks["layout"]) == (2, 6, 1, 1)
    assert costs["gradient"].forward_read == paid(checks["gradient"])[2] == 1
    assert costs["contract"].read_from == "the gradient rows"
    monkeypatch.setenv(SWITCH, "0")
    case = _case(layouts.RowScale)
    assert all(p.forward_read == p.backward_read == 0 for p in case.plan)
    assert all(paid(c)[2:] == (0, 0) for c in case.checks)
    costs, checks = {p.check: p for p in case.plan}, {c.name: c for c in case.checks}
    assert planned(costs["contract"]) == paid(checks["contract"]) == (0, 6, 0, 0)
    assert planned(costs["layout"]) == paid(checks["layout"]) == (3, 7, 0, 0)


def test_a_failing_target_pays_confirmations_outside_the_plan():
    """A layout bug (RowScaleFlat: the backward reads grad_output's storage as if contiguous)
    pays its confirmation backwards beyond the plan; a wrong gradient (SquareAddsConstant) its
    kink test's re-estimates and diagnosis beyond the gradient check's columns."""
    case = _case(load_fixture("layouts").RowScaleFlat)
    costs, layout = {p.check: p for p in case.plan}, next(c for c in case.checks
                                                          if c.name == "layout")
    assert layout.outcome is Outcome.FAILED
    assert paid(layout)[1] > costs["layout"].backward  # the confirmations
    extra = paid(layout)[1] + paid(layout)[3] - costs["layout"].backward - \
        costs["layout"].backward_read
    assert beyond_text(case) == (f"beyond the plan: layout {extra} backward (it failed: "
                                 "confirmations, diagnosis)")
    case = _case(load_fixture("contract_cases").SquareAddsConstant)
    costs, gradient = {p.check: p for p in case.plan}, next(c for c in case.checks
                                                            if c.name == "gradient")
    assert gradient.outcome is Outcome.FAILED
    assert paid(gradient)[0] > costs["gradient"].forward


def test_the_order_is_the_plan_s():
    """The registry's default order is the sharing order; a check asked for before what it
    reads from runs after it, and the contract right before the rows its linearity reads."""
    assert order(DEFAULT_CHECKS) == DEFAULT_CHECKS
    for names in [("layout", "contract"), ("gradient", "contract"),
                  ("double_backward", "gradient", "layout", "contract")]:
        ordered = order(names)
        assert sorted(ordered) == sorted(names)
        for k, name in enumerate(ordered):
            info = BY_NAME[name]
            later = ordered[k + 1:]
            assert not (info.reads_recorded and any(BY_NAME[n].records for n in later))
            assert info.waits_for not in later
            if info.rows_from in ordered:
                assert ordered[k + 1] == info.rows_from
    assert order(("layout", "contract")) == ("contract", "layout")
    assert order(("double_backward", "gradient")) == ("gradient", "double_backward")


def test_the_runner_runs_in_the_plan_s_order():
    """--check layout,contract: the contract runs first, and the layout check reads its graph."""
    case = _case(load_fixture("layouts").RowScale, checks=["layout", "contract"])
    assert [c.name for c in case.checks] == ["contract", "layout"]
    assert paid(case.checks[1])[2:] == (1, 1)


def test_the_heartbeat_gets_the_case_s_whole_total(published):
    """From the plan on, case_total covers the probe phase and every check; `after` the checks
    after the running one; a correct target ends within it (a bound: at most)."""
    case = _case(load_fixture("layouts").RowScale)
    total = sum(p.forward + p.backward for p in case.plan)
    planned_states = [s for s in published if s["case_total"]]
    assert planned_states, "the plan was never published"
    first = planned_states[0]
    assert first["case_total"] == first["case_done"] + total
    assert first["after"] == total
    last = published[-1]
    assert 0 < last["case_done"] <= last["case_total"]
    layout = next(s for s in published if s["check"] == "layout")
    assert layout["after"] == 0  # the last check: nothing planned after it
    gradient = next(s for s in published if s["check"] == "gradient" and s["case_total"])
    rest = {p.check: p.forward + p.backward for p in case.plan}
    assert gradient["after"] == rest["double_backward"] + rest["layout"]


class _Worker:
    def __init__(self, state):
        self.index, self._state, self.steps = 0, state, []

    def state(self):
        return dict(self._state)


def test_time_left_counts_the_checks_still_to_come():
    """The contract's first evaluations took 1 s each; the plan counts 40 evaluations after it:
    the time left says ~40 s more than the contract's own, where without a plan it counted only
    the checks' rough defaults."""
    now = [0.0]
    watch = Watch(lambda _: None, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="t", cases=[SimpleNamespace(label="case 0")], mode="auto",
                          checks=("contract", "gradient", "layout"))
    worker = _Worker({"check": "contract", "phase": "backward", "call": 0, "done": 0,
                      "total": 6, "case_done": 2, "case_total": 48, "after": 40})
    supervisor = SimpleNamespace(collected=SimpleNamespace(jobs=[job]), workers=[worker],
                                 results={}, pending=deque(), _job=lambda i: job)
    watch.tick(supervisor)
    for tick in range(1, 4):
        now[0] = float(tick)
        worker._state.update(call=tick, done=tick)
        watch.tick(supervisor)
    told = watch.left_s(supervisor, now[0])
    assert 40 <= told <= 50, told
    worker._state.update(case_total=0, after=0)  # not planned: the old estimate, far lower
    watch.tick(supervisor)
    assert watch.left_s(supervisor, now[0]) < 40


def test_verbose_prints_the_plan_and_json_carries_it(tmp_path):
    from gradtool.render.json import render_json
    from gradtool.render.terminal import report_lines

    report = gradtool.check(load_fixture("layouts").RowScale, seed=0)
    text = "\n".join(line for line, _ in report_lines(report, verbose=True))
    assert "plan: contract 4 backward (2 backward read from the gradient rows), gradient full" \
        in text, text
    data = json.loads(render_json(report))
    plan = data["targets"][0]["cases"][0]["plan"]
    assert "beyond the plan" not in text  # correct code pays no more than planned
    assert plan[0] == {"check": "contract", "mode": "", "forward": 0, "backward": 4,
                       "forward_read": 0, "backward_read": 2, "bound": "exact",
                       "read_from": "the gradient rows"}
