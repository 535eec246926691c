"""True numbers (issue 57): the time left comes from the measured cost per evaluation times the
evaluations the check's mode needs; every stop says how far the check got as done/total and
percent; `gradtool list` warns of a long full mode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import deque
from types import SimpleNamespace

import pytest

from gradtool import heartbeat
from gradtool.cli.progress import Watch, cost_text

SLOW = '''import time, torch
def slowfn(x):
    time.sleep({sleep})
    scale = 1.0 + 0.0 * float(x.detach().sum())  # no vmap: one evaluation per column
    return torch.tanh(x @ x.T).sum(0) * scale
'''


@pytest.fixture
def published():
    states: list[dict] = []
    heartbeat.install(lambda data: states.append(json.loads(data)))
    heartbeat.install_reports(lambda kind, data: None)
    yield states
    heartbeat.install(None)
    heartbeat.install_reports(None)


def test_the_heartbeat_counts_evaluations_against_the_mode_s_total(published):
    heartbeat.enter(target="t", case="case 0", check="gradient")
    calls = heartbeat.Calls()
    calls["forward"] += 1
    heartbeat.expect(99)  # the mode is chosen after one evaluation: 99 more
    for _ in range(49):
        calls["forward"] += 1
    calls["backward"] += 1
    state = published[-1]
    assert (state["done"], state["total"]) == (51, 100)
    assert heartbeat.place(state) == ("gradient check (backward call 1; 51/100 evaluations, "
                                      "51%)")
    heartbeat.enter(check="layout")  # a new check starts over, its total unknown
    assert (published[-1]["done"], published[-1]["total"]) == (0, 0)
    assert heartbeat.place({**published[-1], "phase": "forward", "call": 3}) == \
        "layout check (forward call 3)"


class FakeWorker:
    def __init__(self, index, state):
        self.index, self._state, self.steps = index, state, []

    def state(self):
        return dict(self._state)


def test_time_left_is_the_measured_cost_times_the_evaluations_left():
    """3200 evaluations at 20 ms: 64 s. The old estimate (4 forwards a gradient check) said
    ~0 s left from the first line on."""
    now = [0.0]
    watch = Watch(lambda _: None, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="t", cases=[SimpleNamespace(label="case 0")], mode="auto", checks=("gradient",))
    worker = FakeWorker(0, {"check": "gradient", "phase": "forward", "call": 0})
    supervisor = SimpleNamespace(collected=SimpleNamespace(jobs=[job]), workers=[worker],
                                 results={}, pending=deque(), _job=lambda i: job)
    lefts = []
    for tick in range(1, 400):
        now[0] = tick * 0.1
        done = int(now[0] / 0.02)
        worker._state.update(call=done, done=done, total=3200)
        watch.tick(supervisor)
        if tick % 50 == 0:
            lefts.append((64 - now[0], watch.left_s(supervisor, now[0])))
    for truth, told in lefts:
        assert truth / 3 <= told <= truth * 3, (truth, told)


def test_list_warns_of_a_long_full_mode():
    auto = cost_text({"forward": 0.02}, ["contract", "gradient"])
    assert auto == "estimated cost: under 1 s"
    full = cost_text({"forward": 0.02}, ["contract", "gradient"], {"gradient": 3200})
    assert "gradient ~1m04s" in full and "--mode full evaluates forward twice" in full


def test_a_timeout_says_how_far_the_check_got(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW.format(sleep=0.005))
    done = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", "slow.py:slowfn", "-i", "40x40",
         "--mode", "full", "--check", "gradient", "--timeout", "6"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "timed out after 6 s in" in x)
    assert " evaluations, " in line and "%)" in line and "/3" in line, line


def _spans(states: list[dict]) -> list[list[dict]]:
    """The published states cut where a check (or the probe phase) begins: its count at 0."""
    spans: list[list[dict]] = []
    for state in states:
        if not state["phase"] and state["done"] == 0:
            spans.append([])
        elif spans and state["phase"]:
            spans[-1].append(state)
    return [span for span in spans if span]


def test_contract_and_layout_declare_the_evaluations_they_make(published):
    """Issue 57 item 3's gap: a stop in the contract or layout check said only 'forward call
    N'. Each declares its evaluations before the first one (so every stop says done/total), and
    on correct code makes exactly those (a Function, two outputs, a module, a 4-d input)."""
    import torch

    import gradtool
    from conftest import load_fixture

    catalogue = load_fixture("catalogue")

    class Two(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y, x + y

        @staticmethod
        def backward(ctx, ga, gb):
            x, y = ctx.saved_tensors
            return ga * y + gb, ga * x + gb

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    targets = [(catalogue.Square, [rand(3, 4)]), (Two, [rand(3, 4), rand(3, 4)]),
               (lambda x: (x.sin(), x.cos()), [rand(3, 4)]),
               (torch.nn.Linear(4, 3).double(), [rand(3, 4)]),
               (torch.nn.Conv2d(2, 3, 3).double(), [rand(2, 2, 5, 5)])]
    for fn, args in targets:
        for checks in (["contract", "layout"], ["layout"]):
            published.clear()
            assert gradtool.check(fn, args, checks=checks).ok()
            spans = _spans(published)
            assert [s[0]["check"] for s in spans] == [checks[0], *checks], (fn, spans)
            for span in spans:
                assert all(s["total"] for s in span), span  # declared before the first
                assert span[-1]["done"] == span[-1]["total"], (fn, span[-1])
                assert heartbeat.how_far(span[0]).startswith(f"; 1/{span[0]['total']} ")


def test_time_left_of_a_check_not_begun_is_its_evaluations_at_the_measured_cost():
    """The first contract evaluation has taken 3 s, none timed yet: the gradient and layout
    checks to come (10 evaluations each) counted nothing before, 15 s told for 75 s."""
    now = [0.0]
    watch = Watch(lambda _: None, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="t", cases=[SimpleNamespace(label="case 0")], mode="auto", checks=("contract", "gradient", "layout"))
    worker = FakeWorker(0, {"check": "contract", "phase": "forward", "call": 1, "done": 1,
                            "total": 6})
    supervisor = SimpleNamespace(collected=SimpleNamespace(jobs=[job]), workers=[worker],
                                 results={}, pending=deque(), _job=lambda i: job)
    watch.tick(supervisor)
    now[0] = 3.0
    watch.tick(supervisor)
    truth = 5 * 3 + 2 * 10 * 3
    told = watch.left_s(supervisor, now[0])
    assert truth / 3 <= told <= truth * 3, (truth, told)


SLOW_CALLS = '''import time, torch
class SlowBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        time.sleep(1.0)
        (x,) = ctx.saved_tensors
        return g * x.cos()

def slowfwd(x):
    time.sleep(1.0)
    return x.sin()
'''


@pytest.mark.parametrize("target, check, after", [("SlowBack", "contract", "4"),
                                                   ("slowfwd", "layout", "2")])
def test_a_timeout_in_contract_or_layout_says_how_far_it_got(tmp_path, target, check, after):
    """A 1 s backward (forward) stopped in the contract (layout) check: 'N/M evaluations, P%'."""
    (tmp_path / "slow.py").write_text(SLOW_CALLS)
    done = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"slow.py:{target}", "-i", "3x4",
         "--check", check, "--timeout", after],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if f"timed out after {after} s in" in x)
    assert re.search(rf"in {check} check \(\w+ call \d+; \d+/\d+ evaluations, \d+%\)", line), line
