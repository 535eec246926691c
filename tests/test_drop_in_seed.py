"""benchmarks/drop_in_seed.py, the bug drop_in.py --seed-bug plants in a real project's backward,
and drop_in.py's split of the paired calls into failing and passing ones (issue 56's "failing
calls <= 1.0x" measured on real suites). No project is installed here: local Functions stand in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import drop_in  # noqa: E402
import drop_in_seed  # noqa: E402


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, power):
        ctx.save_for_backward(x)
        ctx.power = power
        return x ** power

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * ctx.power * x ** (ctx.power - 1), None


class Square(torch.autograd.Function):  # classmethods, as entmax writes its Functions
    @classmethod
    def forward(cls, ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @classmethod
    def backward(cls, ctx, grad):
        x, = ctx.saved_tensors
        return 2 * x * grad


class SquareTwice(Square):  # inherits backward: the bug in Square reaches it
    pass


def inputs():
    return torch.rand(4, dtype=torch.float64, requires_grad=True) + 0.5


@pytest.mark.parametrize("cls, call", [(Cube, lambda x: Cube.apply(x, 3)),
                                       (Square, Square.apply)])
def test_the_planted_bug_scales_the_gradient_and_gradcheck_fails_it(cls, call):
    x = inputs()
    right, = torch.autograd.grad(call(x).sum(), x)
    assert torch.autograd.gradcheck(call, (x,))
    undo = drop_in_seed.plant(cls, 1.01, "here")
    try:
        wrong, = torch.autograd.grad(call(x).sum(), x)
        assert torch.allclose(wrong, right * 1.01, rtol=1e-12, atol=0)
        assert not torch.autograd.gradcheck(call, (x,), raise_exception=False)
    finally:
        undo()
    again, = torch.autograd.grad(call(x).sum(), x)
    assert torch.equal(again, right)
    assert "apply" not in vars(cls)  # the inherited apply is inherited again
    assert isinstance(vars(cls)["backward"], (staticmethod, classmethod))


def test_the_counters_count_applies_and_backwards():
    x = inputs()
    undo = drop_in_seed.plant(Square, 1.01, "counted")
    try:
        before = drop_in_seed.counts()["counted"]
        for _ in range(3):
            torch.autograd.grad(SquareTwice.apply(x).sum(), x)
        with torch.no_grad():
            SquareTwice.apply(x)
        after = drop_in_seed.counts()["counted"]
    finally:
        undo()
    assert [a - b for a, b in zip(after, before)] == [4, 3]


def test_a_target_must_be_a_function_with_backward():
    with pytest.raises(ValueError, match="module:Class"):
        drop_in_seed.resolve("entmax.losses._GenericLossFunction")
    assert drop_in_seed.resolve("torch.autograd:Function") is torch.autograd.Function

    class Plain:
        def backward(self):
            return None
    with pytest.raises(TypeError, match="torch.autograd.Function"):
        drop_in_seed.plant(Plain, 1.01)


def test_scaled_keeps_what_is_not_a_tensor():
    one = torch.ones(2)
    out = drop_in_seed.scaled((one, None, 3), 2.0)
    assert torch.equal(out[0], 2 * one) and out[1:] == (None, 3)
    assert torch.equal(drop_in_seed.scaled(one, 2.0), 2 * one)


def pair(torch_side, ours, elements=10, evals=None):
    row = {"name": "gradcheck", "where": "t.py::test", "elements": elements,
           "torch": [torch_side[0], torch_side[1], torch_side[2] if len(torch_side) > 2 else ""],
           "gradtool": [ours[0], ours[1], ours[2] if len(ours) > 2 else ""]}
    return {**row, **({"evals": evals} if evals else {})}


def test_the_split_puts_a_call_either_tool_failed_among_the_failing():
    pairs = [pair(("failed", 2.0), ("failed", 1.0), evals={"torch": [10, 4], "gradtool": [6, 2]}),
             pair(("failed", 1.0), ("failed", 3.0), evals={"torch": [8, 4], "gradtool": [9, 3]}),
             pair(("passed", 1.0), ("failed", 0.5)),
             pair(("passed", 0.2), ("passed", 0.1))]
    split = drop_in.seeded_split(pairs)
    failing, passing = split["failing"], split["passing"]
    assert failing["calls"] == 3 and passing["calls"] == 1
    assert failing["failed"] == {"torch": 2, "gradtool": 3}
    assert failing["total_s"] == {"torch": 4.0, "gradtool": 4.5}
    assert failing["total_ratio"] == 1.12
    assert failing["evals"] == {"torch": [18, 8], "gradtool": [15, 5]}
    assert len(split["gradtool_failed_torch_passed"]) == 1
    assert split["torch_failed_gradtool_passed"] == []
    assert [s["seconds"][1] for s in split["slowest_failing"]] == [3.0, 1.0, 0.5]
    assert passing["per_call_ms"]["median_ratio"] == 0.5


def test_the_double_kind_keeps_the_gradient_and_fails_gradgradcheck_only():
    x = inputs()
    call = Square.apply
    undo = drop_in_seed.plant(Square, 1.01, "double", kind="double")
    try:
        first, = torch.autograd.grad(call(x).sum(), x)
        assert torch.equal(first, 2 * x.detach())
        assert torch.autograd.gradcheck(call, (x,))
        assert not torch.autograd.gradgradcheck(call, (x,), raise_exception=False)
    finally:
        undo()
    assert torch.autograd.gradgradcheck(call, (x,))
    with pytest.raises(ValueError, match="first, double"):
        drop_in_seed.plant(Square, 1.01, kind="triple")
