"""A parameter or input that is a tensor subclass storing its own values (pypose's LieTensor and
pp.Parameter) keeps its class, and its attributes, through every clone, cast and perturbation
gradtool makes: forward calls its methods as in training, gradtool's arithmetic never runs
through the subclass's own operators (a retraction there), the verdicts are right and the
user's objects untouched."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

import gradtool
from conftest import load_fixture, outcomes, result
from gradtool.targets.subclass import clone_keeping, keeps_class, plain, retyped

S = load_fixture("subclass_param")


def _instance(cls, copyable: bool):
    module = cls()
    if not copyable:  # no deep copy: called itself, its state swapped for clones
        module.lock = threading.Lock()
    return module


def test_the_fixture_breaks_gradtools_arithmetic_and_a_plain_forward():
    """Why the fixture tests something: its + is no sum, and forward needs its class."""
    _, r = S.inputs()
    moved = r.detach() + torch.ones(4, dtype=torch.float64)
    assert not torch.allclose(plain(moved), plain(r) + 1)
    with pytest.raises(AttributeError):
        S.turned(torch.ones(4, dtype=torch.float64), plain(r))


@pytest.mark.parametrize("make", ["class", "copy", "uncopyable"])
def test_a_module_with_a_subclass_parameter_gets_its_verdicts(make):
    def target(cls):
        return cls if make == "class" else _instance(cls, make == "copy")

    right = gradtool.check(target(S.Turner), ["(4,)"])
    assert set(outcomes(right).values()) == {"passed"}, str(right)
    wrong = gradtool.check(target(S.TurnerWrong), ["(4,)"])
    assert "error" not in outcomes(wrong).values(), str(wrong)
    check = result(wrong, "gradient")
    assert check.outcome.value == "failed"
    assert {b.input for b in check.blocks if b.mismatched} == {"w"}
    factor = next(f for f in check.findings if f.rule == "gradient.factor")
    assert abs(factor.data["factor"] - 1.5) < 1e-6
    assert any("TwistWrong" in line and "is wrong w.r.t. w" in line for line in check.details)


@pytest.mark.parametrize("copyable", [True, False])
def test_the_users_subclass_parameter_is_left_as_it_was(copyable):
    module = _instance(S.TurnerWrong, copyable)
    before = plain(module.w).clone()
    gradtool.check(module, ["(4,)"])
    assert type(module.w) is S.RotorParameter and module.w.scale == 0.5
    assert torch.equal(plain(module.w), before) and module.w.grad is None


def test_a_function_given_a_subclass_input_gets_its_verdicts():
    x, r = S.inputs()
    assert set(outcomes(gradtool.check(S.turned, (x, r))).values()) == {"passed"}
    wrong = result(gradtool.check(S.turned_wrong, (x, r), checks=["gradient"]), "gradient")
    assert wrong.outcome.value == "failed"
    assert type(r) is S.Rotor and r.scale == 2.0 and r.grad is None


def test_the_drop_in_keeps_a_subclass_input():
    x, r = S.inputs()
    assert gradtool.gradcheck(S.turned, (x, r))
    with pytest.raises(GradcheckError):
        gradtool.gradcheck(S.turned_wrong, (x, r))


def test_a_function_applied_to_a_subclass_is_rechecked_alone_as_its_class():
    x, r = S.inputs()
    right = result(gradtool.check(S.spun, (x, r), checks=["gradient"]), "gradient")
    assert right.outcome.value == "passed"
    wrong = result(gradtool.check(S.spun_wrong, (x, r), checks=["gradient"]), "gradient")
    assert wrong.outcome.value == "failed"
    text = "\n".join(wrong.details)
    assert "SpinWrong at " in text and "is wrong w.r.t. r" in text and "re-run" not in text, text


def test_the_helpers():
    _, r = S.inputs()
    assert keeps_class(r) and not keeps_class(plain(r))
    assert not keeps_class(torch.nn.Parameter(torch.ones(2)))
    assert type(plain(r)) is torch.Tensor and plain(r).data_ptr() == r.data_ptr()
    copy = clone_keeping(r)
    assert type(copy) is S.Rotor and copy.scale == 2.0 and copy.data_ptr() != r.data_ptr()
    leaf = plain(r).clone().requires_grad_()
    again = retyped(leaf * 2, r)  # on the graph: the gradient reaches the plain leaf
    assert type(again) is S.Rotor and again.scale == 2.0
    again.turn().sum().backward()
    assert torch.allclose(leaf.grad, torch.full((4,), 4.0, dtype=torch.float64))
    assert retyped(leaf, torch.ones(4)) is leaf
