"""Never crying wolf: patterns from third-party code, each correct one passing beside a broken
twin that still fails (tests/fixtures/wolf.py)."""

from __future__ import annotations

import pytest
from conftest import load_fixture, outcomes, result

import gradtool


def wolf():
    return load_fixture("wolf")


# ---------------------------------------------------------------- user code owns what it receives

@pytest.mark.parametrize("name", ["marks_input", "keeps_input"])
def test_forward_owning_its_input_passes(name):
    report = gradtool.check(getattr(wolf(), name), ["3x4"])
    assert set(outcomes(report).values()) == {"passed"}, outcomes(report)


@pytest.mark.parametrize("name", ["marks_input_wrong", "keeps_input_wrong",
                                  "resizes_input_wrong"])
def test_forward_owning_its_input_still_fails_when_backward_is_wrong(name):
    # the failing path re-estimates elements by writing into gradtool's buffers: it used to
    # hand those very buffers to forward (an internal error exactly when the gradient is wrong)
    report = gradtool.check(getattr(wolf(), name), ["3x4"], checks=("gradient",))
    gradient = result(report, "gradient")
    assert gradient.outcome.value == "failed", gradient.summary
    assert any(b.mismatched for b in gradient.blocks)


def test_forward_resizing_its_input():
    report = gradtool.check(wolf().resizes_input, ["3x4"])
    found = outcomes(report)
    assert found["gradient"] == "passed" and found["double_backward"] == "passed"
    # resize_(0) does change the caller's tensor: the contract says so, and nothing else breaks
    assert "modifies input 'x' in place" in result(report, "contract").summary


def test_values_reaching_user_code_are_fresh_every_call():
    import torch

    seen = []

    def forward(x, w):
        seen.append((x, w))
        return x * w

    x = torch.randn(3, dtype=torch.float64)
    w = torch.randn(3, dtype=torch.float64)
    report = gradtool.check(forward, [x, w], checks=("gradient",))
    assert result(report, "gradient").outcome.value == "passed"
    ids = [id(t) for pair in seen for t in pair]
    assert len(ids) == len(set(ids)), "a tensor object was handed to user code twice"
    assert all(t is not x and t is not w for pair in seen for t in pair)
