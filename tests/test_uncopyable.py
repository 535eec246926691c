"""A module that cannot be deep-copied (a wrapper-subclass quantised weight, a lock) is checked
through its own instance with every parameter and buffer swapped for a clone around each call:
its verdicts are those of a copyable module, and nothing of the user's changes."""

from __future__ import annotations

import copy

import pytest
import torch

import gradtool
from conftest import load_fixture, outcomes, result

F = load_fixture("subclass_weight")


def _state(module):
    return {k: (type(v), v.dtype, v.requires_grad, v.grad, v.detach().clone()
                if type(v) in (torch.Tensor, torch.nn.Parameter) else None)
            for k, v in [*module.named_parameters(), *module.named_buffers()]}


def _unchanged(module, before):
    after = _state(module)
    for name, (kind, dtype, needs, grad, value) in before.items():
        now = after[name]
        assert (now[0], now[1], now[2], now[3]) == (kind, dtype, needs, grad), name
        assert value is None or torch.equal(value, now[4]), name


@pytest.mark.parametrize("module", [F.correct, F.locked], ids=["subclass", "lock"])
def test_an_uncopyable_module_is_checked_and_left_untouched(module):
    with pytest.raises(Exception):
        copy.deepcopy(module)
    before, training = _state(module), module.training
    report = gradtool.check(module, ["4x3"] if module is F.locked else ["2x4"])
    assert set(outcomes(report).values()) == {"passed"}, str(report)
    _unchanged(module, before)
    assert module.training == training


def test_its_seeded_twin_fails_with_the_diagnosis():
    before = _state(F.wrong)
    report = gradtool.check(F.wrong, ["2x4"], checks=["gradient"])
    check = result(report, "gradient")
    assert check.outcome.value == "failed"
    factor = next(f for f in check.findings if f.rule == "gradient.factor")
    assert abs(factor.data["factor"] - 1.1) < 1e-6
    _unchanged(F.wrong, before)
