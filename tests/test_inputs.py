"""The --input mini-language and seeded sampling in each domain."""

from __future__ import annotations

import pytest
import torch

from gradtool.errors import InputError
from gradtool.targets.inputs import Domain, LiteralSpec, TensorSpec, parse_input, sample


@pytest.mark.parametrize("text, expected", [
    ("3x4", TensorSpec((3, 4))),
    ("()", TensorSpec(())),
    ("(5,)", TensorSpec((5,))),
    ("(2,3,4)", TensorSpec((2, 3, 4))),
    ("5:positive", TensorSpec((5,), domain=Domain("positive"))),
    ("3x3:spd", TensorSpec((3, 3), domain=Domain("spd"))),
    ("(4,):[-1,1]:nograd", TensorSpec((4,), domain=Domain("range", -1.0, 1.0), requires_grad=False)),
    ("4:integer[0,3]", TensorSpec((4,), domain=Domain("integer", 0.0, 3.0))),
    ("3x4:float32", TensorSpec((3, 4), dtype="float32")),
    ("5", LiteralSpec(5)),
    ("2.5", LiteralSpec(2.5)),
    ("None", LiteralSpec(None)),
    ("True", LiteralSpec(True)),
    ("'mean'", LiteralSpec("mean")),
    ("=(1,2)", LiteralSpec((1, 2))),
])
def test_parse(text, expected):
    assert parse_input(text) == expected


@pytest.mark.parametrize("text, phrase", [
    ("3x4:postive", "did you mean 'positive'?"),
    ("3y", "neither a tensor shape nor a Python literal"),
    ("3x4:[2,1]", "is empty"),
    ("3x4:[a,1]", "needs two numbers"),
    ("3x", "write a 1-d shape as (3,)"),       # a trailing x is a size left out, not (3,)
    ("3x4x:float32", "ends in 'x'"),
])
def test_bad_input_names_the_value_and_the_fix(text, phrase):
    with pytest.raises(InputError) as info:
        parse_input(text)
    assert phrase in str(info.value) and repr(text) in str(info.value)


def draw(text: str, seed: int = 0) -> torch.Tensor:
    return sample(parse_input(text), torch.Generator().manual_seed(seed), "float64", "cpu")


def test_domains():
    assert (draw("100:positive") > 0).all()
    assert (draw("100:negative") < 0).all()
    assert (draw("100:nonzero").abs() >= 0.5).all()
    r = draw("100:[-2,3]")
    assert (r > -2).all() and (r < 3).all()
    spd = draw("4x4:spd")
    assert torch.allclose(spd, spd.mT) and (torch.linalg.eigvalsh(spd) > 0).all()
    assert torch.allclose(draw("3x5:simplex").sum(-1), torch.ones(3, dtype=torch.float64))
    ints = draw("50:integer[0,3]")
    assert torch.equal(ints, ints.round()) and ints.min() >= 0 and ints.max() <= 3
    assert not parse_input("5:integer").differentiable()


def test_sampling_is_seeded():
    assert torch.equal(draw("3x4", 7), draw("3x4", 7))
    assert not torch.equal(draw("3x4", 7), draw("3x4", 8))


def test_spd_needs_square_shape():
    with pytest.raises(InputError, match="square"):
        draw("3x4:spd")


def test_dtype_option():
    assert draw("3:float32").dtype == torch.float32
    assert draw("3:int64").dtype == torch.int64
