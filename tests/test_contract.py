"""contract: every rule fails on a deliberately broken Function and passes on its correct twin."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import load_fixture, outcomes, result


def contract(target, inputs, **kw):
    return result(gradtool.check(target, inputs, checks=("contract",), **kw), "contract")


@pytest.mark.parametrize("broken, twin, inputs, phrase", [
    ("ScaleTooFewGrads", "Scale", ["3x4", "2.5"],
     "backward returned 1 gradient(s); forward takes 2 input(s) (x, c)"),
    ("ScaleGradForConstant", "Scale", ["3x4", "2.5"],
     "backward returned a gradient for 'c', which is not a tensor"),
    ("SquareWrongDtype", "Square", ["3x4"], "has dtype torch.float32"),
    ("SquareIgnoresGradOutput", "Square", ["3x4"], "not linear in grad_output"),
    ("SquareInplaceGradOutput", "Square", ["3x4"], "modifies grad_output in place"),
    ("SquareNoisyBackward", "Square", ["3x4"], "backward is nondeterministic"),
    ("SquareNaNBackward", "Square", ["3x4"], "gradient has 12 NaN/Inf value(s)"),
    ("ExpInplaceUndeclared", "ExpInplace", ["3x4"], "without ctx.mark_dirty(x)"),
    ("ExpInplaceReturnedUnmarked", "ExpInplace", ["3x4"],
     "forward modifies input 'x' in place and returns it without ctx.mark_dirty(x)"),
    ("SquareWithStatUnmarked", "SquareWithStat", ["3x4"],
     "backward ignores the gradient of output 1: mark it with ctx.mark_non_differentiable, "
     "or differentiate it"),
    ("SquareCubeNoneCrash", "SquareCube", ["3x4"],
     "backward fails when output 0 is unused: forward turned materialization off "
     "(ctx.set_materialize_grads(False)), so that output's grad_output arrives as None, and "
     "backward uses it as a tensor (TypeError"),
    ("SquareCubeNoneWrong", "SquareCube", ["3x4"], "when output 0 is unused (None gradient)"),
    ("SquareAddsConstant", "Square", ["5x5"],
     "backward adds 0.001 to 4 of 25 elements of the gradient of 'x' even when grad_output "
     "is zero"),
])
def test_rule_fails_on_broken_and_passes_on_twin(contract_cases, broken, twin, inputs, phrase):
    bad = contract(getattr(contract_cases, broken), inputs)
    assert bad.outcome.value == "failed", bad
    assert phrase in " ".join(f.message for f in bad.findings)  # each fact once: in findings
    assert bad.source and bad.source.endswith(f":{_backward_def_line(contract_cases, broken)}")
    good = contract(getattr(contract_cases, twin), inputs)
    assert good.outcome.value == "passed", good


@pytest.mark.parametrize("broken, inputs, rule", [
    ("ScaleTooFewGrads", ["3x4", "2.5"], "gradient_count"),
    ("ScaleGradForConstant", ["3x4", "2.5"], "gradient_for_non_tensor"),
    ("SquareWrongDtype", ["3x4"], "gradient_dtype"),
    ("SquareIgnoresGradOutput", ["3x4"], "nonlinear"),
    ("SquareInplaceGradOutput", ["3x4"], "grad_output_modified"),
    ("SquareNoisyBackward", ["3x4"], "nondeterministic"),
    ("SquareNaNBackward", ["3x4"], "gradient_nonfinite"),
    ("ExpInplaceUndeclared", ["3x4"], "unmarked_inplace"),
    ("SquareWithStatUnmarked", ["3x4"], "ignored_output"),
    ("SquareCubeNoneCrash", ["3x4"], "unused_output_raises"),
    ("SquareCubeNoneWrong", ["3x4"], "unused_output_differs"),
    ("SquareAddsConstant", ["5x5"], "constant_term"),
])
def test_each_broken_rule_is_a_finding_with_its_stable_id(contract_cases, broken, inputs, rule):
    from gradtool.config.registry import RULES

    bad = contract(getattr(contract_cases, broken), inputs)
    rules = [f.rule for f in bad.findings]
    assert f"contract.{rule}" in rules and all(r in RULES for r in rules), rules
    assert bad.summary == bad.findings[0].message  # the report reads as before


def _backward_def_line(module, name):
    import inspect

    lines, start = inspect.getsourcelines(inspect.unwrap(getattr(module, name).backward))
    return start + next(k for k, line in enumerate(lines) if line.lstrip().startswith("def "))


def test_nondet_tol_allows_noise(contract_cases):
    check = contract(contract_cases.SquareNoisyBackward, ["3x4"], nondet_tol=1e-2)
    assert check.outcome.value == "passed"


def test_forward_producing_inf_fails():
    import torch

    class Recip(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return 1 / (x - x)

        @staticmethod
        def backward(ctx, g):
            return g

    check = contract(Recip, ["3x4"])
    assert check.outcome.value == "failed"
    assert "forward output has 12 NaN/Inf" in check.summary


def test_exception_in_backward_is_an_error_outcome(contract_cases):
    report = gradtool.check(contract_cases.SquareRaises, ["3x4"])
    got = outcomes(report)
    assert got["contract"] == "error" and got["gradient"] == "error"
    first, check = result(report, "contract"), result(report, "gradient")
    assert "ValueError raised: deliberate failure inside backward" in first.summary
    assert "contract_cases.py" in first.traceback
    # The same exception (type and traceback) under later checks is told once (issue 33 item 8).
    assert check.summary.startswith("the same error as under contract (ValueError raised: "
                                    "deliberate failure inside backward")
    assert check.traceback is None and check.exception == first.exception
    assert any(d.startswith("the same error under ") and "gradient" in d for d in first.details)


def test_mark_dirty_function_passes_every_check(contract_cases):
    report = gradtool.check(contract_cases.ExpInplace, ["3x4"])
    assert set(outcomes(report).values()) == {"passed"}


def test_constant_in_backward_is_diagnosed_by_the_gradient_check(contract_cases):
    check = result(gradtool.check(contract_cases.SquareAddsConstant, ["5x5"],
                                  checks=("gradient",)), "gradient")
    assert check.outcome.value == "failed"
    assert check.blocks[0].diagnosis.startswith(
        "backward adds 0.001 to 4 of 25 elements of the gradient of 'x' whatever grad_output is")


def test_marked_output_is_left_out_and_named(contract_cases):
    check = result(gradtool.check(contract_cases.SquareWithStat, ["3x4"], checks=("gradient",)),
                   "gradient")
    assert check.outcome.value == "passed"
    assert "output 1 left out" in check.summary
    assert any("ctx.mark_non_differentiable" in d for d in check.details)
    assert [b.output for b in check.blocks] == ["output 0"]


def test_unreturned_write_says_so(contract_cases):
    check = contract(contract_cases.ExpInplaceUndeclared, ["3x4"])
    assert "(and without returning it)" in check.summary
    returned = contract(contract_cases.ExpInplaceReturnedUnmarked, ["3x4"])
    assert "without returning it" not in " ".join(f.message for f in returned.findings)


class _MatMulTransposedGrad(torch.autograd.Function):
    """The weight's gradient comes back transposed: the engine refuses it."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.t(), (a.t() @ g).t()


def test_a_gradient_the_engine_refuses_is_one_failure_not_an_error_per_check():
    report = gradtool.check(_MatMulTransposedGrad, ["3x4", "4x5"])
    found = outcomes(report)
    assert found["contract"] == "failed"
    assert {found[name] for name in found if name != "contract"} == {"skipped"}
    assert "contract.gradient_shape" in result(report, "gradient").summary
    alone = gradtool.check(_MatMulTransposedGrad, ["3x4", "4x5"], checks=("gradient",))
    assert outcomes(alone)["gradient"] == "error"  # without the contract, the engine's words
    few = gradtool.check(load_fixture("contract_cases").ScaleTooFewGrads, ["3x4", "2.5"])
    assert "error" not in outcomes(few).values()
