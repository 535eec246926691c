"""Double backward of a backward that cannot be differentiated is "unsupported" (a warning
naming the fix), not an error; a backward whose second derivative is silently wrong through a
tensor saved without a graph fails, diagnosed double_backward.untracked naming the tensor."""

from __future__ import annotations

import gradtool
from conftest import load_fixture, outcomes, result

F = load_fixture("undifferentiable")


def test_a_backward_raising_when_differentiated_is_a_warning_not_an_error():
    report = gradtool.check(F.NumpySin, ["3x4"])
    check = result(report, "double_backward")
    assert check.outcome.value == "skipped"
    assert [f.rule for f in check.findings] == ["double_backward.unsupported"]
    assert "once_differentiable" in check.findings[0].message
    assert outcomes(report)["gradient"] == "passed"
    assert report.ok() and not report.ok(strict=True)


def test_the_once_differentiable_twin_is_a_clean_skip():
    report = gradtool.check(F.NumpySinOnce, ["3x4"])
    assert result(report, "double_backward").outcome.value == "skipped"
    assert not result(report, "double_backward").findings and report.ok(strict=True)


def test_a_saved_tensor_without_graph_is_diagnosed_untracked():
    check = result(gradtool.check(F.NormaliseSavedRstd, ["3x4"],
                                  checks=["double_backward"]), "double_backward")
    assert check.outcome.value == "failed"
    untracked = next(f for f in check.findings if f.rule == "double_backward.untracked")
    assert untracked.data["function"] == "NormaliseSavedRstd"
    assert (untracked.data["saved"], untracked.data["shape"]) == (1, [3, 1])


def test_the_twin_recomputing_it_in_backward_passes():
    report = gradtool.check(F.Normalise, ["3x4"])
    assert set(outcomes(report).values()) == {"passed"}


def test_a_backward_differentiable_only_once_is_a_warning_not_an_error():
    # its graph survives one pass of double backward, not the check's second (found on qpth)
    check = result(gradtool.check(F.DoubleOnce, ["3x4"], checks=["double_backward"]),
                   "double_backward")
    assert check.outcome.value == "skipped", check
    assert [f.rule for f in check.findings] == ["double_backward.unsupported"]


def test_its_twin_writing_nothing_passes():
    check = result(gradtool.check(F.DoubleTwice, ["3x4"], checks=["double_backward"]),
                   "double_backward")
    assert check.outcome.value == "passed", check


def test_the_skip_line_says_its_warning_once():
    # it printed the message, then "1 warning: " and the same message again
    text = gradtool.check(F.NumpySin, ["3x4"], checks=["double_backward"]).text()
    line = next(x for x in text.splitlines() if x.startswith("SKIP"))
    assert line.count("backward raises when differentiated") == 1, line
    assert line.endswith("1 warning: [double_backward.unsupported]"), line
