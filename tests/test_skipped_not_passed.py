"""What could not be checked is said, never passed: a layout check after a forward that returns
no tensor, and the recorded (or loaded) inputs that did not require grad."""

from __future__ import annotations

import torch
from click.testing import CliRunner

import gradtool
from conftest import FIXTURES, outcomes
from gradtool.cli.main import main


def _number(x):
    return float((x * x).sum())


def test_layout_is_skipped_after_the_contract_failed_a_forward_returning_a_number():
    got = outcomes(gradtool.check(_number, ["3x4"]))
    assert got["contract"] == "failed" and got["layout"] == "skipped"


def test_loaded_inputs_that_do_not_require_grad_are_named_as_not_checked(tmp_path):
    saved = tmp_path / "call.pt"
    torch.save(((torch.randn(3, 4, dtype=torch.float64).requires_grad_(),
                 torch.randn(5, 4, dtype=torch.float64)), {}), saved)
    out = CliRunner().invoke(main, ["check", f"{FIXTURES}/three_functions.py:LinearFunction",
                                    "--inputs-from", str(saved), "--no-isolate", "-v"])
    assert "not checked: it does not require grad" in out.output, out.output
