"""Kernels whose algorithm is not the reference's: chunked, tiled and fused, below float64."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, load_fixture, result

import gradtool

K = load_fixture("lowprec_kernels")
REFERENCES = ("the same target", "a plain reference")


def gradient(name, cls, how, seed, dtype="float32"):
    _, inputs, reference = K.KERNELS[name]
    settings = {"reference": f"{FIXTURES / 'lowprec_kernels.py'}:{reference}"} \
        if how == "a plain reference" else {}
    # probe mode: the float64 run's own check, not under test here, stays cheap at any load
    return result(gradtool.check(cls, inputs, checks=["gradient"], dtype=dtype, seed=seed,
                                 mode="probe", **settings), "gradient")


@pytest.mark.parametrize("how", REFERENCES)
@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_a_correct_kernel_passes_and_its_seeded_twins_fail(name, how):
    cls = K.KERNELS[name][0]
    correct = gradient(name, cls, how, seed=0)
    assert correct.outcome.value == "passed", (correct.summary, correct.details)
    one = gradient(name, K.twin(cls, 1.01, True), how, seed=0)
    assert one.outcome.value == "failed" and "at 1 element(s)" in one.summary, one.summary
    assert "u|value| > rounding bound" in one.details[0] and "(from " in one.details[0]
    scaled = gradient(name, K.twin(cls, 1.001, False), how, seed=0)
    assert scaled.outcome.value == "failed", scaled.summary


@pytest.mark.parametrize("how", REFERENCES)
@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_a_correct_kernel_passes_at_float32_over_20_seeds(name, how):
    outcomes = [gradient(name, K.KERNELS[name][0], how, seed).outcome.value
                for seed in range(20)]
    assert outcomes == ["passed"] * 20, outcomes


def test_an_exact_zero_of_the_reference_may_carry_the_rounding_the_kernel_cancels():
    # The scan's first gate gradient is exactly 0 in the step-by-step reference, and a
    # cancellation of order-1 terms in the chunked kernel: within the reference's own error.
    check = gradient("chunked scan", K.ChunkedScan, "a plain reference", seed=0)
    assert check.outcome.value == "passed"
    assert any("largest error of the reference itself run in float32" in d
               for d in check.details)


def test_a_backward_writing_its_saved_inputs_is_a_contract_finding_and_no_layout_one():
    report = gradtool.check(K.SwiGLUInPlace, ["17x4", "17x4"], dtype="float32",
                            checks=["contract", "layout"])
    contract, layout = result(report, "contract"), result(report, "layout")
    rules = [f.rule for f in contract.findings]
    assert rules[0] == "contract.backward_writes_input", rules
    assert "contract.gradient_aliases_input" in rules
    assert contract.findings[0].data == {"inputs": ["a"]}
    # Every layout ran on a forward of fresh copies: the twin's gradients, right, are compared.
    assert layout.outcome.value == "passed" and not layout.findings, layout.summary
    twin = gradtool.check(K.SwiGLU, ["17x4", "17x4"], dtype="float32",
                          checks=["contract", "layout"])
    assert all(c.outcome.value == "passed" and not c.findings
               for c in twin.targets[0].cases[0].checks)
    assert layout.calls["forward"] > result(twin, "layout").calls["forward"]


def test_a_gradient_that_requires_grad_is_no_internal_error():
    # Its backward returns its saved inputs themselves: every default check completes.
    report = gradtool.check(K.SwiGLUReturnsInputs, ["17x17", "17x17"], dtype="float32")
    outcomes = {c.name: c.outcome.value for c in report.targets[0].cases[0].checks}
    assert "error" not in outcomes.values(), outcomes
    assert result(report, "contract").findings[0].rule == "contract.backward_writes_input"
    assert outcomes["layout"] == "passed"
