"""A given input that is a wrapper tensor subclass (no storage: no .numpy(), .tolist() or
deep copy the usual way) is checked on its values, said in a note, and left untouched; a
seeded bug behind it still fails."""

from __future__ import annotations

import copy

import pytest
import torch

import gradtool
from conftest import load_fixture, outcomes, result

S = load_fixture("subclass_inputs")
KINDS = [S.Rewrapping, S.Unwrapping]


def test_the_fixture_cannot_be_copied_the_usual_way():
    x, _ = S.inputs(S.Unwrapping)
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(x)
    y, _ = S.inputs(S.Rewrapping)
    with pytest.raises(RuntimeError, match="subclass"):
        y.detach().numpy()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_right_function_passes_on_subclass_inputs(kind):
    x, w = S.inputs(kind)
    report = gradtool.check(S.ScaledSquare, (x, w))
    assert set(outcomes(report).values()) == {"passed"}, str(report)
    notes = [n for _, case, _ in report.checks() for n in case.notes]
    assert any(f"a tensor subclass ({kind.__name__})" in n for n in notes), notes


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_seeded_bug_behind_subclass_inputs_fails(kind):
    x, w = S.inputs(kind)
    check = result(gradtool.check(S.ScaledSquareWrong, (x, w), checks=["gradient"]),
                   "gradient")
    assert check.outcome.value == "failed"
    factor = next(f for f in check.findings if f.rule == "gradient.factor")
    assert abs(factor.data["factor"] - 1.5) < 1e-6


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_the_users_subclass_inputs_are_left_as_they_were(kind):
    x, w = S.inputs(kind)
    before = (x.elem.clone(), w.elem.clone())
    gradtool.check(S.ScaledSquareWrong, (x, w))
    assert type(x) is kind and type(w) is kind
    assert torch.equal(x.elem, before[0]) and torch.equal(w.elem, before[1])
    assert x.grad is None and x.requires_grad and not w.requires_grad


def test_the_drop_in_gradcheck_takes_subclass_inputs():
    x, w = S.inputs(S.Rewrapping)
    assert gradtool.gradcheck(S.ScaledSquare.apply, (x, w))
    assert not gradtool.gradcheck(S.ScaledSquareWrong.apply, (x, w), raise_exception=False)
