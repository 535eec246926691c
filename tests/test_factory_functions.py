"""Function classes made by a factory at every call (qpth's QPFunction(eps=...) returns a new
class each time): the forward's re-run applies a class the first run never saw, yet the same
definition, so the contract re-runs it and the culprit search names it (both said "could not
re-run" before)."""

from __future__ import annotations

import pytest
import torch

import gradtool
from gradtool.run.applyhook import same_definition


def make_square(scale: float = 1.0) -> type:
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return 2 * x * g * scale  # scale 1.001: a wrong backward
    return Square


class SquareLayer(torch.nn.Module):
    scale = 1.0

    def forward(self, x, w):
        # x itself (a leaf of the forward): the Function is re-checked by replaying the forward
        return make_square(self.scale).apply(x).sin() * w + w


class SquareLayerWrong(SquareLayer):
    scale = 1.001


def test_same_definition():
    a, b = make_square(), make_square()
    assert a is not b and same_definition(a, b) and same_definition(a, a)

    class Square(torch.autograd.Function):  # same name, another definition
        forward = staticmethod(lambda ctx, x: x)
        backward = staticmethod(lambda ctx, g: g)
    assert not same_definition(a, Square)


def test_a_factory_function_inside_a_module_is_re_run_for_its_contract():
    report = gradtool.check(SquareLayer(), ["3x4", "3x4"])
    assert report.ok(), report.text()
    assert "could not re-run" not in report.text(verbose=True)


@pytest.mark.parametrize("inputs", [["3x4", "3x4"], ["40x40", "40x40"]])
def test_a_wrong_factory_function_is_named(inputs):
    text = gradtool.check(SquareLayerWrong(), inputs, checks=["gradient"]).text()
    assert "FAIL" in text and "could not re-run" not in text, text
    assert "make_square.<locals>.Square" in text
    assert "found wrong" in text or " is wrong w.r.t." in text, text
