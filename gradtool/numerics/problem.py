"""Problem: a target bound to sampled arguments, with counted forward evaluations and VJPs."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.variable import Variable

from ..heartbeat import Calls


@dataclass
class Problem:
    """fn(*args) with the differentiable argument positions named; every evaluation is counted.

    calls counts evaluations, not Python calls: a batched call over B perturbations adds B, so
    the counts compare directly with gradcheck's (2 n_in forwards, n_out backwards).
    """

    fn: Callable[..., Any]
    args: list[Any]
    names: list[str]                  # one per positional argument
    diff: list[int]                   # positions of the arguments whose gradients are checked
    output_names: list[str] = field(default_factory=list)
    output_labels: list[str] | None = None  # names to give the outputs instead of 'output k'
    batched_fn: Callable[..., Any] | None = None  # fn that vmap can batch (None: unknown)
    freeze_seed: int | None = None    # reset torch's RNG before each call (stochastic forwards)
    calls: Counter[str] = field(default_factory=Calls)
    vmap_ok: bool | None = None       # learnt on first use
    output_mask: list[bool] | None = None  # which tensor outputs are differentiable
    batched_vjp_ok: bool | None = None
    mutates: bool = False             # forward writes to an input (ctx.mark_dirty): copy first
    plan: Any = None                  # what choose_mode learnt, for check_full to reuse
    forward_seconds: float = 0.0      # the priming forward's time, for predictions

    @property
    def inputs(self) -> list[torch.Tensor]:
        return [self.args[i] for i in self.diff]

    @property
    def input_names(self) -> list[str]:
        return [self.names[i] for i in self.diff]

    def with_inputs(self, values: Sequence[torch.Tensor]) -> list[Any]:
        """The full argument list with the differentiable ones replaced."""
        args = list(self.args)
        for position, value in zip(self.diff, values):
            args[position] = value
        return args

    def outputs(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Differentiable outputs of a forward at `values`, without building a graph."""
        if self.mutates:
            values = [v.clone() for v in values]
        with torch.no_grad(), self.rng():
            self.calls["forward"] += 1
            return select_outputs(self.fn(*self.with_inputs(values)), self.output_mask)

    def graph(self, values: Sequence[torch.Tensor] | None = None
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(leaves, outputs) of a forward that records the autograd graph."""
        source = self.inputs if values is None else values
        # Fresh leaves: a forward that writes to its inputs cannot corrupt the case.
        leaves = [v.detach().clone().requires_grad_(True) for v in source]
        with torch.enable_grad(), self.rng():
            self.calls["forward"] += 1
            passed = [leaf.clone() for leaf in leaves] if self.mutates else leaves
            outs = select_outputs(self.fn(*self.with_inputs(passed)), self.output_mask)
        return leaves, outs

    def rng(self) -> contextlib.AbstractContextManager[None]:
        """Re-seed torch's RNG around a call of a stochastic forward (a no-op otherwise)."""
        if self.freeze_seed is None:
            return contextlib.nullcontext()  # the common case: no generator frame per call
        return _frozen(self.freeze_seed)

    def vjp(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            grads: Sequence[torch.Tensor], create_graph: bool = False) -> list[torch.Tensor]:
        """vᵀJ for every leaf (zeros where unused), straight through autograd's engine."""
        self.calls["backward"] += 1
        return vjp(outs, leaves, grads, create_graph=create_graph)

    def vjp_batched(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                    grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Many VJPs at once: each grads[k] has a leading batch dimension."""
        from torch._vmap_internals import _vmap

        # The legacy vmap batches the engine itself (autograd.grad's is_grads_batched path).
        result = list(_vmap(lambda *g: tuple(vjp(outs, leaves, g)), 0, 0)(*grads))
        self.calls["backward"] += int(grads[0].shape[0]) if grads else 0
        return result


@contextlib.contextmanager
def _frozen(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def vjp(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor], create_graph: bool = False) -> list[torch.Tensor]:
    """autograd.grad without its grad_outputs validation, which imports sympy (~0.3 s)."""
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(leaf) for leaf in leaves]
    result = Variable._execution_engine.run_backward(
        tuple(o for o, _ in pairs), tuple(g for _, g in pairs),
        True, create_graph, tuple(leaves), True, False)
    return [torch.zeros_like(leaf) if r is None else r for leaf, r in zip(leaves, result)]


def tensor_outputs(result: Any) -> list[Any]:
    """Flatten a forward's result into its tensors, in order (non-tensors dropped)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in tensor_outputs(item)]
    if isinstance(result, dict):
        return [t for item in result.values() for t in tensor_outputs(item)]
    return []


def select_outputs(result: Any, mask: list[bool] | None) -> list[torch.Tensor]:
    tensors = tensor_outputs(result)
    if mask is None:
        return tensors
    return [t for t, keep in zip(tensors, mask) if keep]


def output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output {k}" for k in range(count)]


def flat_cat(tensors: Sequence[torch.Tensor], batch: bool = False) -> torch.Tensor:
    """Concatenate flattened tensors (keeping a leading batch dimension when batch=True)."""
    if batch:
        flat = [t.reshape(t.shape[0], -1) for t in tensors]
    else:
        flat = [t.reshape(-1) for t in tensors]
    # One tensor: a view, not a copy (callers only read it).
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1 if batch else 0)


def split_flat(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Inverse of flat_cat for a leading batch dimension (or none)."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    batch = flat.shape[:-1]
    return [p.reshape(*batch, *s) for p, s in zip(flat.split(sizes, dim=-1), shapes)]
