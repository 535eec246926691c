"""Whose error it is, in the drop-in: its call sites of the checked code, and gradtool's own.

An exception coming out of the function checked (or out of autograd's engine running its
backward, or torch's public gradcheck running it) is the user's and propagates unchanged, as from
torch's gradcheck; these call sites are marked (tracebacks.py:calls_user_code) so that the frames
tell it. Anything else raised inside the drop-in's own code is a bug in gradtool: `owned` turns
it into gradtool's InternalError, which says so and how to report it, never re-raised as if the
checked code raised it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.autograd import Variable
from torch.overrides import has_torch_function

from ..errors import GradtoolError, InternalError
from ..tracebacks import calls_user_code, gradtool_frame, raised_in_gradtool

REPORT = ("please report it to gradtool's maintainers with this traceback; meanwhile torch's "
          "own torch.autograd.gradcheck judges this call (under pytest: run without "
          "--gradtool-gradcheck)")


@calls_user_code
def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs): the checked function, or torch's public gradcheck running it."""
    return fn(*args, **kwargs)


@calls_user_code
def grad(outputs: Any, inputs: Sequence[torch.Tensor] | torch.Tensor, grad_outputs: Any, *,
         retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool = False, is_grads_batched: bool = False,
         **kwargs: Any) -> tuple[Any, ...]:
    """torch.autograd.grad: autograd's engine running the checked function's backward. Plain
    tensors with cotangents of their outputs' own shape (after the batch dimension where
    batched), dtype and layout go to the engine as autograd.grad hands them over, without its
    grad_outputs validation: its first use imports sympy (~0.2 s of a process's first call;
    numerics/problem.py's vjp does the same)."""
    outs, seeds, leaves = (((t,) if isinstance(t, torch.Tensor) else tuple(t))
                           for t in (outputs, grad_outputs, inputs))
    if kwargs or not allow_unused or not _plain(outs, seeds, leaves, is_grads_batched):
        return torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph,
                                   create_graph=create_graph, allow_unused=allow_unused,
                                   is_grads_batched=is_grads_batched, **kwargs)
    keep = create_graph if retain_graph is None else retain_graph  # autograd.grad's default

    def run(*cotangents: torch.Tensor) -> tuple[Any, ...]:
        return Variable._execution_engine.run_backward(
            outs, cotangents, bool(keep), create_graph, leaves, True, False)

    if not is_grads_batched:
        return run(*seeds)
    from torch._vmap_internals import _vmap  # autograd.grad's own batching, as it calls it

    return _vmap(run, 0, 0, allow_none_pass_through=True)(*seeds)


def _plain(outs: tuple[Any, ...], seeds: tuple[Any, ...], leaves: tuple[Any, ...],
           batched: bool) -> bool:
    """What autograd.grad's validation would pass unchanged: plain strided tensors, no
    __torch_function__ (a subclass's or a mode's), each output requiring grad with a cotangent
    of its shape (a batch of them), dtype and device."""
    tensors = (*outs, *seeds, *leaves)
    return (len(outs) == len(seeds) and bool(leaves)
            and all(type(t) is torch.Tensor and t.layout == torch.strided for t in tensors)
            and not has_torch_function(tensors)
            and all(o.requires_grad and s.shape[int(batched):] == o.shape and s.dim() ==
                    o.dim() + int(batched) and s.dtype == o.dtype and s.device == o.device
                    for o, s in zip(outs, seeds)))


@contextlib.contextmanager
def owned(expected: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Within: an exception raised by gradtool's own code (not one of `expected`, the verdicts
    and refusals it raises on purpose) becomes gradtool's InternalError."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, (*expected, GradtoolError, InternalError)) or \
                not raised_in_gradtool(exc):
            raise
        error = InternalError(exc, gradtool_frame(exc))
        error.args = (f"{error.args[0]}\n{REPORT}",)
        raise error from exc
