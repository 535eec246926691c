"""gradtool's own exceptions are internal errors (exit 3), never blamed on the user's code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.autograd import Function

import gradtool
from conftest import FIXTURES, outcomes, result
from gradtool.cli.main import main
from gradtool.errors import InternalError
from gradtool.tracebacks import raised_in_gradtool

JACOBIAN = Path(gradtool.__file__).parent / "numerics" / "jacobian.py"


def planted_bug() -> object:
    """A function whose code lives in gradtool/numerics/jacobian.py and raises: a gradtool bug."""
    space: dict[str, object] = {}
    exec(compile("def choose_mode(*args, **kwargs):\n    return {}['mode']\n",  # noqa: S102
                 str(JACOBIAN), "exec"), space)
    return space["choose_mode"]


@pytest.fixture
def buggy_gradtool(monkeypatch):
    monkeypatch.setattr("gradtool.checks.gradient.choose_mode", planted_bug())


def test_a_bug_in_gradtool_raises_internal_error_not_an_error_outcome(buggy_gradtool):
    with pytest.raises(InternalError, match="this is a bug in gradtool: KeyError") as info:
        gradtool.check(torch.sin, ["3x4"], checks=["gradient"])
    assert "jacobian.py" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)  # the original traceback stays attached


def test_cli_exits_3_with_traceback_on_a_bug_in_gradtool(buggy_gradtool):
    # In-process (the planted bug lives in this process); isolated runs are tests/test_isolation.py
    out = CliRunner().invoke(main, ["check", f"{FIXTURES}/three_functions.py:LinearFunction",
                                    "--no-isolate"])
    assert out.exit_code == 3, out.output
    text = out.output + (out.stderr if out.stderr_bytes is not None else "")
    assert "a bug in gradtool" in text and "Traceback" in text and "KeyError" in text


def test_the_same_target_without_the_bug_passes():
    out = CliRunner().invoke(main, ["check", f"{FIXTURES}/three_functions.py:LinearFunction"])
    assert out.exit_code == 0, out.output


class RaisesInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("user backward is broken")


def shape_mismatch(x):
    return x @ torch.ones(7, 2, dtype=x.dtype)  # a torch op raising in C++ from user code


def test_user_exceptions_stay_error_outcomes():
    report = gradtool.check(RaisesInBackward, ["3x4"])
    assert outcomes(report)["gradient"] == "error"
    assert "ValueError raised: user backward is broken" in result(report, "gradient").summary
    # A forward that fails is the user's error, reported once: under the first check.
    mismatch = gradtool.check(shape_mismatch, ["3x4"])
    assert outcomes(mismatch)["contract"] == "error"
    assert "the same error as under contract" in result(mismatch, "gradient").summary


def test_builtin_forward_raising_in_cpp_is_the_users():
    # cholesky of a matrix that is not positive definite: no Python frame but gradtool's own
    # call site, which is marked as calling the user's code.
    report = gradtool.check(torch.linalg.cholesky, ["3x3:negative"], checks=["gradient"])
    assert outcomes(report)["gradient"] == "error"


def test_frames_decide_who_raised():
    def in_user_code():
        raise RuntimeError("user")

    with pytest.raises(RuntimeError) as user:
        in_user_code()
    assert not raised_in_gradtool(user.value)
    with pytest.raises(KeyError) as ours:
        planted_bug()()
    assert raised_in_gradtool(ours.value)


def test_an_internal_error_is_raised_with_its_origin_frame_last(buggy_gradtool):
    import traceback

    with pytest.raises(InternalError) as info:
        gradtool.check(torch.sin, ["3x4"], checks=["gradient"])
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert last.filename == str(JACOBIAN) and last.name == "choose_mode"
