"""A custom Function whose forward applies another Function (nested application, pypose's
SE3/Sim3 operations): the outer application is captured and checked alone, its inner apply
included, so the wrong Function is named; a right outer one is never blamed, whatever the
inner one's backward (autograd never runs it: the inner application has no graph)."""

from __future__ import annotations

import pytest

import gradtool
from conftest import load_fixture, result
from gradtool.config.settings import CheckConfig
from gradtool.results import Outcome
from gradtool.run.culprit import locate_functions, record
from gradtool.targets.cases import build_case
from gradtool.targets.inputs import parse_input
from gradtool.targets.resolve import make_target

N = load_fixture("nested_functions")
STYLES = ["", "classic_"]  # PyTorch 2's setup_context style, forward(ctx, ...)


def _problem(fn):
    return build_case(make_target(fn, "fixture"), [parse_input("3x4")], CheckConfig(), 0).problem


def _gradient(fn):
    return result(gradtool.check(fn, ["3x4"], checks=["gradient"]), "gradient")


@pytest.mark.parametrize("style", STYLES)
def test_the_wrong_outer_function_is_named(style):
    check = _gradient(getattr(N, style + "outer_wrong"))
    name = ("Classic" if style else "") + "OuterWrong"
    assert check.outcome is Outcome.FAILED
    text = "\n".join(check.details)
    assert f"{name} at " in text and "is wrong w.r.t. x" in text, text
    assert "not captured" not in text, text
    assert check.source == gradtool.targets.load.source_of(getattr(N, name).backward)


@pytest.mark.parametrize("style", STYLES)
def test_the_outer_application_is_captured_and_the_inner_one_has_no_node(style):
    used, missed = record(_problem(getattr(N, style + "outer_wrong")))
    assert [app.cls.__name__ for app in used] == [("Classic" if style else "") + "OuterWrong"]
    assert missed == []


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("fn", ["inner_wrong", "both_right"])
def test_a_right_outer_function_passes_and_is_never_blamed(style, fn):
    """The inner Function's wrong backward is never run by autograd: the model is right."""
    target = getattr(N, style + fn)
    assert _gradient(target).outcome is Outcome.PASSED
    findings = locate_functions(_problem(target), CheckConfig())
    assert [f.outcome for f in findings] == [Outcome.PASSED], [f.summary for f in findings]


def test_only_the_wrong_outer_function_is_blamed_beside_a_right_one_applied_directly():
    check = _gradient(N.outer_wrong_beside_square)
    text = "\n".join(check.details)
    assert check.outcome is Outcome.FAILED
    assert "OuterWrong at " in text and "is wrong w.r.t. x" in text, text
    findings = locate_functions(_problem(N.outer_wrong_beside_square), CheckConfig())
    verdicts = {f.qualname: f.outcome for f in findings}
    assert verdicts == {"OuterWrong": Outcome.FAILED, "Square": Outcome.PASSED}, verdicts
