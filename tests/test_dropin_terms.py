"""The drop-in calls the function on torch's terms where that changes what it computes, pays a
failure's localisation as torch's fast mode pays its failure, and its first call no sympy
import (issue 56: a scientific library's suite, xitorch 0.5.1, through benchmarks/drop_in.py).
Each beside torch's own gradcheck on the same call, and a wrong twin failing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.autograd import Function

import gradtool
from gradtool.dropin.functions import GradcheckFailure
from torch.autograd.gradcheck import GradcheckError

D = torch.float64


def _registered(a):
    """What a library that differentiates a module's parameters() sees: `a` registered only
    where it is an nn.Parameter (a module's attribute set to a plain tensor is not one)."""
    holder = torch.nn.Module()
    holder.a = a
    return next(holder.parameters()) * 2


def _wrong_registered(a):
    holder = torch.nn.Module()
    holder.a = a
    return next(holder.parameters()).detach() * 2 + a.detach() * 0 + a * 1e-3


def _reads_requires_grad(x):
    """Another value where x does not require grad: gradtool's finite differences must see
    what torch's do (x requiring grad, grad mode on)."""
    return x * 2 if x.requires_grad and torch.is_grad_enabled() else x * 3


def _hessian_inside(x):
    """A Hessian-vector product built inside, of the arguments that require grad (xitorch's
    hess()): nothing to differentiate without a graph."""
    inner = [t for t in (x,) if t.requires_grad]
    with torch.enable_grad():
        (g,) = torch.autograd.grad((inner[0] ** 3).sum(), inner, create_graph=True)
    return g * 1.0


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("fn", [_registered, _reads_requires_grad, _hessian_inside])
def test_called_as_torch_calls_it(fn, fast):
    x = torch.nn.Parameter(torch.rand(3, dtype=D) + 0.5) if fn is _registered else \
        (torch.rand(3, dtype=D) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(fn, (x,), fast_mode=fast)
    assert gradtool.gradcheck(fn, (x,), fast_mode=fast)
    assert type(x) is (torch.nn.Parameter if fn is _registered else torch.Tensor)


def test_parameter_twin_still_fails():
    x = torch.nn.Parameter(torch.rand(3, dtype=D) + 0.5)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(_wrong_registered, (x,))
    with pytest.raises(GradcheckFailure):
        gradtool.gradcheck(_wrong_registered, (x,))


class TwoWrong(Function):
    """(x * y, x + y) whose backward is wrong for every (input, output) pair."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x + y

    @staticmethod
    def backward(ctx, ga, gb):
        x, y = ctx.saved_tensors
        return 2 * ga * y + gb * 3, ga * x * 0.5 - gb


def test_fast_failure_sweeps_the_first_failing_block_where_cheaper():
    """fast_mode on small inputs: the failing pair's columns cost fewer evaluations than
    bisecting (what torch's failing fast mode pays too): full mode stops at the first failing
    block, with its diagnosis, and says how to sweep every column."""
    args = (torch.randn(6, dtype=D, requires_grad=True),
            torch.randn(6, dtype=D, requires_grad=True))
    with pytest.raises(GradcheckFailure) as failed:
        gradtool.gradcheck(TwoWrong.apply, args, fast_mode=True)
    text = str(failed.value)
    assert "mismatched elements 6 / 36" in text and "extra factor 2" in text
    assert "stopped at its first block" in text and "exhaustive=True" in text
    assert "mode: full" in text and "is expensive" not in text


def test_fast_failure_localises_the_first_failing_pair():
    """fast_mode: one pair localised to an element, the others named; --exhaustive: all."""
    args = (torch.randn(64, dtype=D, requires_grad=True),
            torch.randn(64, dtype=D, requires_grad=True))
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(TwoWrong.apply, args, fast_mode=True)
    with pytest.raises(GradcheckFailure) as failed:
        gradtool.gradcheck(TwoWrong.apply, args, fast_mode=True)
    text = str(failed.value)
    assert "too, not localised" in text and "--exhaustive" in text
    whole = gradtool.check(TwoWrong.apply, args, mode="probe", exhaustive=True,
                           checks=["gradient"])
    assert not whole.ok()
    localised = [b for _, _, c in whole.checks() for b in c.blocks if b.worst]
    assert len(localised) > 1


def test_first_call_imports_no_sympy():
    """autograd.grad's grad_outputs validation imports sympy on first use (~0.2 s, torch's
    gradcheck's first call pays it): the drop-in hands plain cotangents to the engine itself."""
    code = ("import sys, torch, gradtool\n"
            "x = torch.randn(3, dtype=torch.float64, requires_grad=True)\n"
            "assert gradtool.gradcheck(torch.cosh, (x,), check_batched_grad=True,"
            " check_grad_dtypes=True)\n"
            "assert gradtool.gradcheck(torch.cosh, (x,), fast_mode=True)\n"
            "print('sympy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
