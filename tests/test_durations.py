"""Every second of a run is told: a check's duration holds what was done on its behalf (a
model's culprit search, hooks), the cases' setup and the run's own time are told apart, and
together they are the run's wall time."""

from __future__ import annotations

import json
import time

import pytest
from conftest import load_fixture, result
from torch import nn

import gradtool
from gradtool.run import second

FX = load_fixture("truth")


class _Slowed(nn.Module):
    """A model of two custom Functions (sin, then cube) whose forward takes 5 ms more, so the
    run lasts long enough (about 0.5 s) for a scheduler's hiccup outside the run to stay
    far below 5 % of it."""

    cube = FX.Cube

    def forward(self, x):
        time.sleep(0.005)
        return self.cube.apply(FX.Sine.apply(x) + 0.5)


class _SlowedDetached(_Slowed):
    cube = FX.DetachedCube


def _timed(model, **kw):
    start = time.perf_counter()
    report = gradtool.check(model, ["3x4"], **kw)
    return report, time.perf_counter() - start


@pytest.mark.parametrize("model, ok", [(_Slowed, True), (_SlowedDetached, False)])
def test_the_durations_of_a_run_add_up_to_its_wall_time(model, ok):
    gradtool.check(model, ["2x2"], checks=("gradient",))  # imports, first calls: not measured
    report, wall = _timed(model)
    assert report.ok() is ok
    parts = report.time_parts()
    assert sum(parts.values()) == pytest.approx(report.duration_s, abs=1e-9)
    # every interval is some check's or a case's setup: the run's own is collection only
    assert parts["checks"] + parts["setup"] >= 0.95 * report.duration_s, parts
    assert report.duration_s == pytest.approx(wall, rel=0.05)
    assert all(c.setup_s > 0 for t in report.targets for c in t.cases)  # the probe phase


def test_a_hook_is_timed_with_its_check(monkeypatch):
    """The double-backward culprit search, made to last 0.2 s, is inside that check's time,
    not anywhere else."""
    real = second.annotate_double

    def slow(*args, **kw):
        time.sleep(0.2)
        return real(*args, **kw)

    monkeypatch.setattr(second, "annotate_double", slow)
    report, _ = _timed(_SlowedDetached, checks=("double_backward",))
    assert result(report, "double_backward").duration_s >= 0.2
    parts = report.time_parts()
    assert parts["setup"] < 0.2 and parts["run"] < 0.2, parts


def test_every_report_tells_the_parts():
    from gradtool.render.html import render_html
    from gradtool.render.json import render_json
    from gradtool.render.junit import render_junit
    from gradtool.render.terminal import render_plain

    report = gradtool.check(FX.SineCube, ["3x4"])
    data = json.loads(render_json(report))
    assert set(data["time"]) == {"checks", "setup", "run"}
    assert data["targets"][0]["cases"][0]["setup_s"] > 0
    assert "setting up cases (inputs, probe phase)" in render_plain(report, verbose=True)
    assert "setting up cases" not in render_plain(report)
    assert "setting up cases" in render_html(report)
    assert 'name="time.setup"' in render_junit(report)

