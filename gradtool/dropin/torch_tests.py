"""The tests torch's gradcheck runs beside the Jacobian, run as it runs them, for the drop-in.

gradtool judges the Jacobian itself (functions.py); these are gradcheck's other tests, each kept
with the meaning and the failure torch gives it, so that the drop-in never passes what torch
fails: the inputs' and outputs' validation, the "no differentiable outputs" test (every output
constant under finite differences: each element in slow mode, one random direction per input in
fast mode), reentrancy within nondet_tol and gradient dtypes (on one random grad_output per
output: the Jacobian's rows are gradtool's), undefined grad_outputs and tangents, vmap over
backward and forward, backward's multiplication by grad_output. Written here on torch's public
API (autograd.grad, forward_ad, a Function whose backward returns None for an undefined
grad_output) and the legacy vmap torch's own tests batch with, so that no private helper of
torch.autograd.gradcheck -- whose names and signatures change between releases -- is called.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from .batched import batched_backward, batched_forward
from .calls import call, grad

__all__ = ["check_inputs", "check_outputs", "differentiable_outputs", "forward_mode",
           "no_differentiable_outputs", "reentrant", "run"]

SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
          torch.sparse_bsc)
MKLDNN = getattr(torch, "_mkldnn", None)  # a layout, named privately in every torch


def check_inputs(args: Sequence[Any]) -> None:
    """gradcheck's refusals: no input requiring grad (ValueError), an input with a stride-0
    dimension (RuntimeError), with torch's words and its warning below double precision."""
    wanted = False
    for k, a in enumerate(args):
        if not (isinstance(a, torch.Tensor) and a.requires_grad):
            continue
        wanted = True
        if a.dtype not in (torch.float64, torch.complex128):
            warnings.warn(f"Input #{k} requires gradient and is not a double precision "
                          "floating point or complex. This check will likely fail if all the "
                          "inputs are not of double precision floating point or complex. ",
                          stacklevel=4)
        content = _values(a)
        if content.layout == torch.strided and not all(
                st > 0 or sz <= 1 for st, sz in zip(content.stride(), content.size())):
            raise RuntimeError(
                f"The {k}th input has a dimension with stride 0. gradcheck only supports "
                "inputs that are non-overlapping to be able to compute the numerical "
                "gradients correctly. You should call .contiguous on the input before "
                "passing it to gradcheck.")
    if not wanted:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, "
                         "but none of them have requires_grad=True.")


def _values(t: torch.Tensor) -> torch.Tensor:
    """A sparse tensor's specified values (whose strides gradcheck inspects), else t."""
    if t.layout == torch.sparse_coo:
        return t._values()
    return t.values() if t.layout in SPARSE else t


def differentiable_outputs(out: Any) -> tuple[torch.Tensor, ...]:
    """The outputs that require grad (a tensor alone is a tuple of one)."""
    return tuple(o for o in _as_tuple(out) if isinstance(o, torch.Tensor) and o.requires_grad)


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def check_outputs(outputs: Sequence[torch.Tensor]) -> None:
    """gradcheck's refusal of sparse and mkldnn outputs (ValueError, torch's words)."""
    for o in outputs:
        kind = "Sparse" if o.layout in SPARSE else "MKLDNN" if o.layout == MKLDNN \
            else None
        if kind:
            raise ValueError(f"{kind} output is not supported at gradcheck yet. Please call "
                             "to_dense(masked_grad=...) on the output of fn for gradcheck.")


def no_differentiable_outputs(func: Callable[..., Any], args: tuple[Any, ...], eps: float,
                              fast_mode: bool, nondet_tol: float) -> None:
    """No output requires grad: finite differences must find every output constant, as torch
    tests it -- along each element (real and imaginary part) of each input in slow mode, any
    change failing; along one random unit direction per input in fast mode, a change beyond
    nondet_tol failing. The function runs on the given tensors, perturbed in place (their
    `.data`: no version bump) and restored, as torch's gradcheck runs it."""
    for k, a in enumerate(args):
        if not (isinstance(a, torch.Tensor) and a.requires_grad) or a.layout != torch.strided:
            continue
        for d in _directions(a, fast_mode):
            change = _central(func, args, k, d * eps, eps)
            worst = max((float(c.abs().max()) for c in change if c.numel()), default=0.0)
            if (worst > nondet_tol) if fast_mode else worst != 0:
                raise GradcheckError("Numerical gradient for function expected to be zero")


def _directions(x: torch.Tensor, fast_mode: bool) -> list[torch.Tensor]:
    """The directions torch moves x along: a random unit vector (and an imaginary one for a
    complex x) in fast mode, each element's unit (and i) in slow mode; none for an empty x."""
    if not x.numel():
        return []
    if fast_mode:
        g = torch.Generator()  # torch's own: the user's RNG is left alone
        real = x.real if x.is_complex() else x
        units = []
        for _ in range(2 if x.is_complex() else 1):
            u = torch.rand(x.numel(), generator=g, dtype=real.dtype, device="cpu")
            units.append((u / u.norm()).reshape(x.shape).to(x.device))
        return [units[0]] + ([units[1] * 1j] if x.is_complex() else [])
    eye = torch.eye(x.numel(), dtype=x.dtype, device=x.device).reshape(-1, *x.shape)
    return [*eye] + ([*(eye * 1j)] if x.is_complex() else [])


def _central(func: Callable[..., Any], args: tuple[Any, ...], k: int, step: torch.Tensor,
             eps: float) -> list[torch.Tensor]:
    """(f(x + step) - f(x - step)) / 2 eps for each float or complex output, x = args[k]
    written in place on the given tensor's own storage and restored."""
    data = args[k].data
    orig = data.clone()
    try:
        with torch.no_grad():
            data.copy_(orig - step)
            minus = _floats(call(func, *args))
            data.copy_(orig + step)
            plus = _floats(call(func, *args))
    finally:
        data.copy_(orig)
    return [((p - m) / (2 * eps)).detach().reshape(-1) for p, m in zip(plus, minus)]


def _floats(out: Any) -> list[torch.Tensor]:
    """Clones of the float and complex outputs (the next call may write the same storage)."""
    return [o.detach().clone() for o in _as_tuple(out)
            if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]


def forward_mode(func: Any, args: tuple[Any, ...], **keywords: Any) -> None:
    """Forward mode of complex values, which gradtool does not check itself: torch's gradcheck
    (its public function) of forward mode alone, its undefined-tangent test included."""
    from torch.autograd import gradcheck

    call(gradcheck, func, args, check_forward_ad=True, check_backward_ad=False, **keywords)


def run(func: Any, args: tuple[Any, ...], outputs: tuple[torch.Tensor, ...], *,
        check_undefined_grad: bool, check_batched_grad: bool, check_batched_forward_grad: bool,
        check_forward_ad: bool, check_backward_ad: bool, masked: bool,
        undefined_forward: bool = True, shared: Any = None, shared_jvp: Any = None) -> None:
    """The tests gradcheck runs once the Jacobians passed, in torch's order; GradcheckError on a
    failure. `shared`: backwards already made on this graph (lean.py:Passed: the probe's at two
    random cotangents of the only output), which the batched-gradient test batches;
    `shared_jvp` a jvp already made (lean_forward.py:ForwardPassed), which the batched
    forward-gradient test batches."""
    if check_forward_ad and check_undefined_grad and undefined_forward and outputs:
        undefined_tangents(func, args)
    if check_batched_forward_grad:
        batched_forward(func, args, shared_jvp)
    if not check_backward_ad:
        return
    if check_batched_grad:
        for k, output in enumerate(outputs):
            batched_backward(args, output, k, shared if len(outputs) == 1 else None)
    mul_by_grad_output(outputs, args, masked)
    if check_undefined_grad:
        undefined_grad_outputs(func, args)


def _diff(args: Sequence[Any]) -> list[torch.Tensor]:
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not diff:
        raise GradcheckError("no Tensors requiring grad found in input")
    return diff


def mul_by_grad_output(outputs: Sequence[torch.Tensor], args: Sequence[Any],
                       masked: bool) -> None:
    """Backward at zero grad_outputs gives zeros, each of its input's layout, dtype, device and
    size (torch's test that backward multiplies by grad_output)."""
    diff = _diff(args)
    zeros = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format)
             for o in outputs]
    grads = grad(outputs, diff, zeros, allow_unused=True)
    for g, x in zip(grads, diff):
        if g is None:
            continue
        if g.layout != torch.strided:
            _same_sparse(g, x)
            g, x = g.to_dense(), x.to_dense()
        zero = torch.allclose(g, torch.zeros_like(g)) if masked else bool(g.eq(0).all())
        if not zero:
            raise GradcheckError("backward not multiplied by grad_output")
        for what, a, b in (("type", g.dtype, x.dtype), ("device", g.device, x.device),
                           ("size", g.size(), x.size())):
            if a != b:
                raise GradcheckError(f"grad is incorrect {what}")


def _same_sparse(g: torch.Tensor, x: torch.Tensor) -> None:
    """A sparse gradient's layout and dimensions are its input's."""
    if g.layout != x.layout:
        raise GradcheckError(f"grad is incorrect layout ({g.layout} is not {x.layout})")
    if g.layout in SPARSE:
        kind = str(g.layout).replace("torch.", "").replace("_coo", "")
        for what, a, b in (("sparse_dim", g.sparse_dim(), x.sparse_dim()),
                           ("dense_dim", g.dense_dim(), x.dense_dim())):
            if a != b:
                raise GradcheckError(f"grad is {kind} tensor, but has incorrect {what} {a}, "
                                     f"expected {b}")


class _Undefined(torch.autograd.Function):
    """The identity whose backward hands an undefined gradient (None) to what made its input:
    an output whose grad_output is undefined, as torch's gradcheck makes one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> None:
        return None


UNDEFINED_NOTE = 'Please look at "Notes about undefined output gradients" in ' \
    '"tools/autograd/derivatives.yaml"'


def undefined_grad_outputs(func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Backward with every grad_output undefined (then, with several outputs, each alone) runs
    and gives undefined or zero gradients: torch's test, on fresh forwards."""
    diff = _diff(args)
    outs = differentiable_outputs(call(func, *args))
    cases = [[_Undefined.apply(o) for o in outs]]
    if len(outs) > 1:
        for k in range(len(outs)):
            fresh = differentiable_outputs(call(func, *args))
            cases.append([_Undefined.apply(o) if j == k else o for j, o in enumerate(fresh)])
    for case in cases:
        zeros = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format)
                 for o in case]
        try:
            grads = grad(case, diff, zeros, allow_unused=True)
        except RuntimeError as exc:
            raise GradcheckError("Expected backward function to handle undefined output "
                                 f"grads. {UNDEFINED_NOTE}") from exc
        if any(g is not None and not bool(g.eq(0).all()) for g in grads):
            raise GradcheckError("Expected all input grads to be undefined or zero when all "
                                 f"output grads are undefined or zero. {UNDEFINED_NOTE}")


def undefined_tangents(func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Forward mode with one input's tangent undefined (a plain tensor) gives what a zero
    tangent gives, every other input carrying a random one: torch's test."""
    import torch.autograd.forward_ad as fwAD

    wanted = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    g = torch.Generator()
    with fwAD.dual_level():
        duals = list(args)
        for k in wanted:
            x = args[k]
            u = torch.rand(x.numel(), generator=g, device="cpu")  # the generator's
            u = u.to(x.real.dtype if x.is_complex() else x.dtype)
            duals[k] = fwAD.make_dual(x.detach(), (u / u.norm()).reshape(x.shape)
                                      .to(dtype=x.dtype, device=x.device))
        for k in wanted:
            kept = duals[k]
            duals[k] = fwAD.make_dual(args[k].detach(), torch.zeros_like(args[k]))
            zero = _tangents(call(func, *duals))
            duals[k] = args[k].detach()
            absent = _tangents(call(func, *duals))
            duals[k] = kept
            for a, b in zip(zero, absent):
                if a is not None and b is not None and not torch.allclose(a, b):
                    raise GradcheckError(
                        f"Mismatch in tangent values for an output when input {k} has an "
                        f"undefined tangent value. Got: {a} but expected: {b}")


def _tangents(out: Any) -> list[torch.Tensor | None]:
    import torch.autograd.forward_ad as fwAD

    return [fwAD.unpack_dual(o).tangent for o in _as_tuple(out)
            if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]


def reentrant(args: tuple[Any, ...], outputs: tuple[torch.Tensor, ...], nondet_tol: float,
              check_grad_dtypes: bool, first: Any = None) -> None:
    """Backward twice at one random grad_output per output gives the same gradients (within
    nondet_tol), each of its input's size, and of its dtype and device when check_grad_dtypes
    asks. `first`: a backward already made on this graph (lean.py:Passed, the probe's at its
    random cotangent of the only output): backward runs once more there."""
    diff = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if first is not None and first.cotangents is not None:
        _again(outputs[0], diff, first.cotangents[0], first.gradients[0], nondet_tol,
               check_grad_dtypes)
        return
    for k, output in enumerate(outputs):
        v = torch.randn_like(output) if output.is_floating_point() or output.is_complex() \
            else torch.ones_like(output)
        once = grad(output, diff, v, retain_graph=True, allow_unused=True)
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
    each input's size, dtype and device when check_grad_dtypes asks: GradcheckError otherwise."""
    if second is None:
        second = grad(output, diff, v, retain_graph=True, allow_unused=True)
    for j, (a, b, x) in enumerate(zip(first, second, diff)):
        if a is None or b is None:
            continue
        if b.shape != x.shape:
            raise GradcheckError(f"Analytical gradient has incorrect size: the gradient of "
                                 f"input {j} from output {k} is {tuple(b.shape)}, the input "
                                 f"{tuple(x.shape)}")
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
    """The largest elementwise difference of two gradients (sparse ones densified, complex32
    ones, which have no comparison kernels, read as complex64)."""
    if a.layout == b.layout == torch.strided and torch.complex32 not in (a.dtype, b.dtype) \
            and a.shape == b.shape and torch.equal(a, b):  # the usual answer, in one operation
        return 0.0
    from ..targets.probe import comparable  # targets/probe.py: imported for the rare case

    a, b = comparable(a), comparable(b)
    if a.shape == b.shape and torch.equal(a, b):
        return 0.0
    if a.shape != b.shape:
        return float("inf")
    return (a - b).abs().max().item() if a.numel() else 0.0
