"""torch.func's VJP and autograd's batched grad_outputs without importing torch._dynamo or sympy."""

# torch.func.vjp's pullback runs autograd inside `torch._dynamo.compiled_autograd._disable()`,
# and the attribute access imports torch._dynamo: ~800 modules (sympy, torch.distributed,
# torch.onnx), 0.7 s in a fresh process, for a context that only switches compiled autograd
# off. autograd.grad's grad_outputs validation imports sympy for symbolic shapes. Here the
# same pullback runs with the switch made at the C level (torch._C._dynamo, which is loaded
# with torch), and grad_outputs go straight to the engine, as numerics/problem.py's vjp does.
# torch.func.vmap itself imports torch._dynamo on torch 2.6 and older, only to ask whether it is
# being compiled: vmap() below calls what it wraps.

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .problem import vjp


@contextlib.contextmanager
def _compiled_autograd_off() -> Iterator[None]:
    """What compiled_autograd._disable() does, at the C level: no Python module imported."""
    switch = torch._C._dynamo.compiled_autograd.set_autograd_compiler
    prior = switch(None, False)
    try:
        yield
    finally:
        switch(*prior)


def _autograd_grad(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                   grad_outputs: Sequence[torch.Tensor] | None = None,
                   retain_graph: bool = False, create_graph: bool = True
                   ) -> tuple[torch.Tensor, ...]:
    """torch._functorch.eager_transforms._autograd_grad (unused inputs get zeros)."""
    if grad_outputs is None:
        grad_outputs = [torch.ones_like(o) for o in outputs]
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(x) for x in inputs)
    with _compiled_autograd_off():
        return tuple(vjp([o for o, _ in pairs], list(inputs), [g for _, g in pairs],
                         create_graph=create_graph))


@contextlib.contextmanager
def _light_pullbacks() -> Iterator[None]:
    """torch.func's transforms use _autograd_grad above while torch._dynamo is not loaded (when
    it is, compiled autograd may be on and torch's own helper is used)."""
    try:
        from torch._functorch import eager_transforms
    except ImportError:  # a torch without it: its own path, only slower to start
        yield
        return
    original = getattr(eager_transforms, "_autograd_grad", None)
    if original is None or "torch._dynamo" in sys.modules:
        yield
        return
    eager_transforms._autograd_grad = _autograd_grad
    try:
        yield
    finally:
        eager_transforms._autograd_grad = original


def vmap(fn: Callable[..., Any], in_dims: Any = 0) -> Callable[..., Any]:
    """torch.func.vmap(fn, in_dims): its implementation called directly while torch._dynamo is
    not loaded (nothing is being compiled), so older torch does not import it."""
    if "torch._dynamo" not in sys.modules:
        try:
            from torch._functorch.vmap import vmap_impl
        except ImportError:  # a torch that moved it: the public vmap
            pass
        else:
            return functools.partial(vmap_impl, fn, in_dims, 0, "error", None)
    return torch.func.vmap(fn, in_dims=in_dims)


def func_vjp(fn: Callable[..., tuple[torch.Tensor, ...]], primals: Sequence[torch.Tensor],
             cotangents: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """vᵀJ(x) by torch.func.vjp: autograd at functorch's own level, which torch.func.vmap can
    batch (autograd.grad cannot run inside vmap)."""
    with _light_pullbacks():
        _, pullback = torch.func.vjp(fn, *primals)
        return tuple(pullback(tuple(cotangents)))


def vmap_of_vjp(fn: Callable[..., tuple[torch.Tensor, ...]], primals: Sequence[torch.Tensor],
                cotangents: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """torch.func.vmap of (x, v) -> vᵀJ(x) by torch.func.vjp, batched over dim 0 of both."""

    def one(xs: Sequence[torch.Tensor], gs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        _, pullback = torch.func.vjp(fn, *xs)
        return tuple(pullback(tuple(gs)))

    with _light_pullbacks():
        return vmap(one)(list(primals), list(cotangents))


def grads_batched(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor],
                  grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """autograd.grad(outs, leaves, grads, is_grads_batched=True, materialize_grads=True): the
    legacy vmap over the engine, as autograd.grad does it, without its sympy-importing
    grad_outputs validation (the grads are built with the outputs' shapes)."""
    from torch._vmap_internals import _vmap

    return list(_vmap(lambda *g: tuple(vjp(outs, leaves, g)), 0, 0)(*grads))
