"""A forward drawing from numpy's global RNG or Python's `random` is stochastic as one drawing
from torch's: frozen around every evaluation (it read as a forward drifting under a frozen RNG,
a false failure), its wrong backward still fails, and the generators are given back after."""

import random

import numpy as np
import pytest
import torch

import gradtool


def _mask(shape, source):
    if source == "numpy":
        return torch.from_numpy((np.random.rand(*shape) > 0.5) * 2.0)
    return torch.tensor([[2.0 if random.random() > 0.5 else 0.0 for _ in range(shape[1])]
                         for _ in range(shape[0])], dtype=torch.float64)


def dropout(source, wrong=False):
    class Dropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = _mask(x.shape, source).to(x.dtype)
            ctx.save_for_backward(m)
            return x * m

        @staticmethod
        def backward(ctx, g):
            (m,) = ctx.saved_tensors
            return g * m * (1.5 if wrong else 1.0)

    return Dropout


@pytest.mark.parametrize("source", ["numpy", "random"])
def test_a_dropout_drawing_from_another_rng_passes_and_its_wrong_twin_fails(source):
    x = torch.randn(3, 4, dtype=torch.float64)
    right = gradtool.check(dropout(source).apply, [x])
    assert right.ok(), str(right)
    assert "forward is stochastic" in str(right)
    wrong = gradtool.check(dropout(source, wrong=True).apply, [x], checks=["gradient"])
    assert not wrong.ok()
    assert "gradient.mismatch" in str(wrong)


def test_the_frozen_rngs_are_given_back_as_they_were():
    """A frozen evaluation draws from seeded generators and leaves the user's where they were
    (a forward run unfrozen, as gradcheck runs it, draws from them as usual)."""
    from gradtool.numerics.problem import frozen_rng

    np.random.seed(7)
    random.seed(7)
    numpy_next, python_next = np.random.rand(), random.random()
    np.random.seed(7)
    random.seed(7)
    draws = []
    for _ in range(2):
        with frozen_rng(3):
            draws.append((np.random.rand(), random.random()))
    assert draws[0] == draws[1]  # seeded alike each time
    assert (np.random.rand(), random.random()) == (numpy_next, python_next)
