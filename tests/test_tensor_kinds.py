"""Every tensor a Function can take, through every check: a verdict or a skip, never an internal
error (exit 3)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import Function

import gradtool
from conftest import outcomes, result
from gradtool.config.registry import BY_NAME

F64 = torch.float64


class Doubled(Function):
    """y = 2x for any tensor torch multiplies (sparse, complex, integer, a subclass)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Subclass(torch.Tensor):
    pass


def as_dense(x):
    """2x, dense whatever x's layout (a sparse input's gradient through to_dense)."""
    return (x.to_dense(masked_grad=False) if x.layout != torch.strided else x) * 2


def grad_on_inside(x):
    """A forward that turns grad on itself and detaches its input (a kernel wrapper
    recomputing with a graph): its outputs carry a graph even in a value-only forward."""
    with torch.enable_grad():
        return x.detach().requires_grad_(True) * 2


def sparse_times_dense(a, b):
    return torch.sparse.mm(a, b)


def embedding(w):
    return torch.nn.functional.embedding(torch.tensor([1, 2, 1]), w, sparse=True)


def _dense() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=F64)


# kind -> (its values, the targets to try on them)
CATALOGUE = {
    "sparse_coo": (lambda: [_dense().to_sparse().requires_grad_(True)], (Doubled, as_dense)),
    "sparse_csr": (lambda: [_dense().to_sparse_csr().requires_grad_(True)], (Doubled, as_dense)),
    "sparse_constant": (lambda: [_dense().to_sparse(), torch.ones(4, 2, dtype=F64,
                                                                  requires_grad=True)],
                        (sparse_times_dense,)),
    "sparse_gradient": (lambda: [_dense().requires_grad_(True)], (embedding,)),
    "sparse_output": (lambda: [_dense().requires_grad_(True)], (lambda x: (x * 3).to_sparse(),)),
    "non_contiguous": (lambda: [_dense().t().requires_grad_(True)], (Doubled, as_dense)),
    "zero_size": (lambda: [torch.zeros(0, 3, dtype=F64, requires_grad=True)], (Doubled,)),
    "zero_dim": (lambda: [torch.tensor(1.5, dtype=F64, requires_grad=True)], (Doubled,)),
    "complex": (lambda: [torch.randn(3, dtype=torch.complex128, requires_grad=True)],
                (Doubled,)),
    "integer": (lambda: [torch.arange(4)], (Doubled, lambda x: x.double() * 2)),
    "bool": (lambda: [torch.tensor([True, False])], (lambda x: x.double() * 2,)),
    "subclass": (lambda: [_dense().as_subclass(Subclass).requires_grad_(True)], (Doubled,)),
    "integer_valued_float": (lambda: [torch.arange(6, dtype=F64).reshape(2, 3)
                                      .requires_grad_(True)], (Doubled,)),
    "grad_on_inside": (lambda: [_dense().requires_grad_(True)], (grad_on_inside,)),
}
CHEAP = tuple(name for name in BY_NAME if name != "compiled")  # compiled: the slow test below


def cases():
    for kind, (values, targets) in CATALOGUE.items():
        for target in targets:
            yield pytest.param(kind, values, target, id=f"{kind}-{getattr(target, '__name__')}")


# Kinds with nothing differentiable (the contract says no output requires grad) and the one
# wrong target: every other target here is correct, so no check of it may fail.
UNJUDGED = {"integer", "bool", "grad_on_inside"}


@pytest.mark.parametrize("kind, values, target", cases())
def test_every_check_gives_a_verdict_or_a_reason_never_an_internal_error(kind, values, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's beta notes on sparse layouts
        report = gradtool.check(target, values(), checks=CHEAP)
    for _, _, check in report.checks():
        if check.outcome.value == "skipped":
            assert check.summary, (kind, check.name)  # a skip says why
        if kind not in UNJUDGED:
            assert check.outcome.value in ("passed", "skipped"), (kind, check.name,
                                                                  check.summary)


def test_the_forward_that_turns_grad_on_is_judged_not_crashed():
    # the diagnosis's .numpy() met outputs with a graph; the verdict is true: x is detached
    report = gradtool.check(grad_on_inside, [_dense().requires_grad_(True)])
    assert outcomes(report)["gradient"] == "failed"
    assert result(report, "gradient").blocks[0].diagnosis


def test_compiled_too():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in ("sparse_coo", "sparse_gradient", "sparse_output"):
            values, targets = CATALOGUE[kind]
            report = gradtool.check(targets[-1], values(), checks=["compiled"])
            assert outcomes(report)["compiled"] in ("passed", "skipped"), kind
