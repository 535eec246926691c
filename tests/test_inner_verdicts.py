"""Verdicts follow the user's gradient: inside a model or callable whose gradient check passed,
an inner Function's algebra (linearity, zero in -> zero out) is a warning; data rules fail."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import gradtool
from conftest import FIXTURES, load_fixture, outcomes, result
from gradtool.cli.main import main
from gradtool.results import Severity


@pytest.fixture(scope="module")
def fx():
    return load_fixture("reversible")


def contract_findings(report):
    return [(f.rule, f.severity, f.data.get("function")) for f in result(report, "contract").findings]


@pytest.mark.parametrize("target, inputs", [("reversible", ["3x2", "3x2"]),
                                            ("ReversibleNet", ["3x4"])])
def test_a_correct_reversible_network_passes_with_warnings_naming_rule_and_function(
        fx, target, inputs):
    obj = getattr(fx, target)
    report = gradtool.check(obj() if isinstance(obj, type) else obj, inputs)
    assert outcomes(report)["gradient"] == "passed"
    assert outcomes(report)["contract"] == "passed"
    found = contract_findings(report)
    assert ("contract.nonlinear", Severity.WARNING, "RevBlock") in found
    assert ("contract.constant_term", Severity.WARNING, "Seed") in found
    assert all(severity is Severity.WARNING for _, severity, _ in found)
    assert report.ok() and not report.ok(strict=True)


def test_strict_fails_it_on_the_command_line(fx):
    target = f"{FIXTURES}/reversible.py:reversible"
    args = ["check", target, "-i", "3x2", "-i", "3x2", "--no-isolate"]
    assert CliRunner().invoke(main, args).exit_code == 0
    strict = CliRunner().invoke(main, [*args, "--strict"])
    assert strict.exit_code == 1, strict.output
    assert "RevBlock" in strict.output and "contract.nonlinear" in strict.output


def test_without_the_gradient_check_in_the_run_the_rule_still_fails(fx):
    report = gradtool.check(fx.reversible, ["3x2", "3x2"], checks=["contract"])
    assert outcomes(report) == {"contract": "failed"}


def test_the_inner_function_checked_directly_still_fails(fx):
    report = gradtool.check(fx.RevBlock, ["3x2", "3x2", "2x3x2"])
    assert outcomes(report)["contract"] == "failed"
    assert "contract.nonlinear" in {f.rule for f in result(report, "contract").findings}


def test_an_inner_function_writing_the_callers_input_still_fails(fx):
    report = gradtool.check(fx.sparsemax_head, ["3x5"])
    assert outcomes(report)["gradient"] == "passed"  # shift invariance: the gradient is right
    assert outcomes(report)["contract"] == "failed"
    inner = [f for f in result(report, "contract").findings if f.data.get("function")]
    assert [(f.rule, f.severity, f.data["function"]) for f in inner] == [
        ("contract.unmarked_inplace", Severity.FAILURE, "InplaceSparsemax")]


def test_a_wrong_composite_gradient_keeps_the_inner_algebra_failing(fx):
    # the waiver reads the gradient check's verdict: with the network's gradient wrong, the
    # inner rules are failures again
    report = gradtool.check(fx.reversible_wrong, ["3x2", "3x2"])
    assert outcomes(report)["gradient"] == "failed"
    assert outcomes(report)["contract"] == "failed"
    assert ("contract.nonlinear", Severity.FAILURE, "RevBlock") in contract_findings(report)
