"""True words (issue 57): a skip after forward raised says so; a diagnosis is told once per
check, naming the other blocks it holds for."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from gradtool.cli.main import main


@pytest.fixture
def here(tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "catalogue.py", tmp_path / "catalogue.py")
    monkeypatch.chdir(tmp_path)


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_skip_after_forward_raised_says_so(here):
    out = run("check", "catalogue.py:Raises2d", "-i", "3x4").output
    assert "ERROR catalogue.py:Raises2d   contract" in out, out
    assert "forward returns no tensor output" not in out
    assert "layout  — not run: forward raised TypeError" in out


def test_a_diagnosis_is_told_once_per_check(here):
    out = run("check", "catalogue.py:AdjointModel", "--check", "double_backward").output
    assert "FAIL  catalogue.py:AdjointModel   double_backward" in out, out
    assert out.count("diagnosis: second derivative is zero") == 1, out
    assert "(the same for grad_output -> grad of a)" in out


@pytest.mark.parametrize("model", ["StarModel", "StarModelInside"])
def test_an_input_is_named_the_same_way_on_every_line(here, model):
    """torchdiffeq's forward(ctx, func, y0, *params): a parameter reaches the Function through
    *params, which names nothing: the Function's line used to call the model's f.a 'arg2'."""
    out = run("check", f"catalogue.py:{model}", "--check", "gradient").output
    assert f"FAIL  catalogue.py:{model}   gradient" in out, out
    assert "input 'f.a'" in out and "wrong w.r.t. f.a" in out, out
    assert "arg2" not in out
