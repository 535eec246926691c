"""The tests torch's gradcheck runs beside the Jacobian, run as it runs them, for the drop-in.

gradtool judges the Jacobian itself (functions.py); these are gradcheck's other tests, each kept
with the meaning and the failure torch gives it, so that the drop-in never passes what torch
fails: the inputs' and outputs' validation, reentrancy within nondet_tol and gradient dtypes
(ours, on one random grad_output per output: the Jacobian's rows are gradtool's), undefined
grad_outputs, vmap over backward and forward, backward's multiplication by grad_output (torch's
own helpers, which exist under these names from torch 2.4 to 2.15).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from ..errors import InternalError


def _torch(name: str) -> Any:
    """One of torch's gradcheck helpers (a missing one is gradtool's error, named)."""
    module = sys.modules["torch.autograd.gradcheck"]
    helper = getattr(module, name, None)
    if helper is None:
        raise InternalError(AttributeError(f"torch {torch.__version__} has no "
                                           f"torch.autograd.gradcheck.{name}, which the "
                                           "gradcheck drop-in runs"), __name__)
    return helper


def check_inputs(args: Sequence[Any]) -> None:
    """gradcheck's refusals: no input requiring grad (ValueError), an input with a stride-0
    dimension (RuntimeError), with torch's words and its warning below double precision."""
    _torch("_check_inputs")(tuple(args))


def differentiable_outputs(out: Any) -> tuple[torch.Tensor, ...]:
    """The outputs that require grad (a tensor alone is a tuple of one)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return tuple(o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)


def check_outputs(outputs: Sequence[torch.Tensor]) -> None:
    """gradcheck's refusal of sparse and mkldnn outputs (ValueError, torch's words)."""
    _torch("_check_outputs")(tuple(outputs))


def no_differentiable_outputs(func: Any, args: tuple[Any, ...], out: Any, eps: float) -> None:
    """No output requires grad: torch's test that finite differences find them all constant."""
    if not _torch("_check_no_differentiable_outputs")(func, args, out, eps,
                                                      is_forward_ad=False):
        raise GradcheckError("no output requires grad, but finite differences find one varies")


def forward_mode(func: Any, args: tuple[Any, ...], **keywords: Any) -> None:
    """Forward mode of complex values, which gradtool does not check itself: torch's gradcheck
    of forward mode alone (its undefined-tangent test included)."""
    from torch.autograd import gradcheck

    gradcheck(func, args, check_forward_ad=True, check_backward_ad=False, **keywords)


def run(func: Any, args: tuple[Any, ...], outputs: tuple[torch.Tensor, ...], *,
        check_undefined_grad: bool, check_batched_grad: bool, check_batched_forward_grad: bool,
        check_forward_ad: bool, check_backward_ad: bool, masked: bool,
        undefined_forward: bool = True) -> None:
    """The tests gradcheck runs once the Jacobians passed, in torch's order; GradcheckError on a
    failure."""
    if check_forward_ad and check_undefined_grad and undefined_forward and outputs:
        _torch("_test_undefined_forward_mode")(func, outputs, args)
    if check_batched_forward_grad:
        _torch("_test_batched_grad_forward_ad")(func, args)
    if not check_backward_ad:
        return
    for k, output in enumerate(outputs):
        if check_batched_grad:
            _torch("_test_batched_grad")(args, output, k)
    _torch("_test_backward_mul_by_grad_output")(outputs, args, masked)
    if check_undefined_grad:
        _torch("_test_undefined_backward_mode")(func, outputs, args)


def reentrant(args: tuple[Any, ...], outputs: tuple[torch.Tensor, ...], nondet_tol: float,
              check_grad_dtypes: bool, first: Any = None) -> None:
    """Backward twice at one random grad_output per output gives the same gradients (within
    nondet_tol), each of its input's dtype and device when check_grad_dtypes asks. `first`: a
    backward already made on this graph (lean.py:Passed, the probe's at its random cotangent
    of the only output): backward runs once more there."""
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if first is not None and first.cotangent is not None:
        _again(outputs[0], diff, first.cotangent, first.gradients, nondet_tol,
               check_grad_dtypes)
        return
    for k, output in enumerate(outputs):
        v = torch.randn_like(output) if output.is_floating_point() or output.is_complex() \
            else torch.ones_like(output)
        once = torch.autograd.grad(output, diff, v, retain_graph=True, allow_unused=True)
        _same_twice(output, diff, v, once, k, nondet_tol, check_grad_dtypes)


def _again(output: torch.Tensor, diff: list[torch.Tensor], v: torch.Tensor,
           gradients: torch.Tensor, nondet_tol: float, check_grad_dtypes: bool) -> None:
    """The second backward at the flat cotangent v, through the engine as the first went
    (numerics/problem.py:vjp): the same flat gradients in one comparison, else each input's
    test."""
    from ..numerics.problem import flat_cat, split_flat, vjp

    second = vjp([output], diff, [v.reshape(output.shape).clone()])
    if not check_grad_dtypes and torch.equal(flat_cat(second), gradients):
        return
    first = split_flat(gradients, [x.shape for x in diff])
    _same_twice(output, diff, v, first, 0, nondet_tol, check_grad_dtypes, second)


def _same_twice(output: torch.Tensor, diff: list[torch.Tensor], v: torch.Tensor,
                first: Sequence[torch.Tensor | None], k: int, nondet_tol: float,
                check_grad_dtypes: bool, second: Sequence[Any] | None = None) -> None:
    """Backward at v again (or `second`, already made) gives `first` (within nondet_tol), in
    each input's dtype and device when check_grad_dtypes asks: GradcheckError otherwise."""
    if second is None:
        second = torch.autograd.grad(output, diff, v, retain_graph=True, allow_unused=True)
    for j, (a, b, x) in enumerate(zip(first, second, diff)):
        if a is None or b is None:
            continue
        if check_grad_dtypes and (b.dtype != x.dtype or b.device != x.device):
            raise GradcheckError(
                f"Gradient has dtype mismatch: the gradient of input {j} from output {k} is "
                f"{b.dtype} on {b.device}, the input {x.dtype} on {x.device}")
        differs = _difference(a, b)
        if differs > nondet_tol:
            raise GradcheckError(
                f"Backward is not reentrant: running backward twice with the same input and "
                f"grad_output gives different gradients of input {j} from output {k} (by "
                f"{differs:.3g}, more than nondet_tol {nondet_tol}); a nondeterministic "
                "backward needs gradcheck's nondet_tol")


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest elementwise difference of two gradients (sparse ones densified)."""
    a = a.to_dense() if a.layout != torch.strided else a
    b = b.to_dense() if b.layout != torch.strided else b
    if a.shape == b.shape and torch.equal(a, b):  # the usual answer, in one operation
        return 0.0
    if a.shape != b.shape:
        return float("inf")
    return (a - b).abs().max().item() if a.numel() else 0.0
