"""Outputs one caller evaluated, handed to the pipeline it runs next on the same call.

The drop-in's lean path (dropin/lean.py) evaluates a call's forward without a graph at f(x), at
the probe's points and at the colours' points, and hands a call it does not pass to
gradtool.check for the report, whose engine evaluates the same function at many of the same
points (the same seeded probe vectors, the same colours, the same arithmetic). Torch's failing
gradcheck pays each point once; so does the drop-in: within the hand-over (`serving`), a
Problem of that function (compared with ==: a Function's apply is a new bound method at each
access) reads an output recorded at the same differentiable values (their exact bits,
ledger.graph_key) instead of evaluating again. Recorded only from a forward shown to write no
input, draw from no RNG and give the same outputs twice (lean.py's _pure): a plain
deterministic call, whose outputs at a point are its outputs there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from .ledger import graph_key

KEEP_BYTES = 16 * 2**20  # outputs' bytes recorded at most (a tiny call's are a few KiB)


@dataclass
class Handed:
    """One call's recorded outputs: fn(*args) with args[diff] at each key's values."""

    fn: Callable[..., Any]
    diff: tuple[int, ...]
    outputs: dict[Any, list[torch.Tensor]] = field(default_factory=dict)
    kept: int = 0  # bytes
    # the drop-in's own forward with its graph: (the tensors given requiring grad, its result),
    # what torch's gradcheck runs backward through; the probe phase's graph forward there
    graph: tuple[list[torch.Tensor], Any] | None = None
    ids: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # that graph's leaves and outputs
    # backward through that graph: grad_outputs' exact bits -> the gradients, per leaf
    vjps: dict[Any, list[torch.Tensor]] = field(default_factory=dict)

    def bind(self, leaves: list[torch.Tensor], result: Any, outs: Sequence[torch.Tensor]
             ) -> None:
        """The call's own graph: `leaves` (the tensors given requiring grad), its result and
        that result's tensors."""
        self.graph = (leaves, result)
        self.ids = (tuple(map(id, leaves)), tuple(map(id, outs)))

    def on_graph(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> bool:
        return bool(self.ids[0]) and self.ids == (tuple(map(id, leaves)), tuple(map(id, outs)))

    def record(self, values: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        size = sum(o.numel() * o.element_size() for o in outs)
        if self.kept + size <= KEEP_BYTES:
            self.outputs.setdefault(graph_key(values), [o.detach().clone() for o in outs])
            self.kept += size

    def at(self, fn: Callable[..., Any], diff: Sequence[int],
           values: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """Fresh copies of the outputs recorded at `values` for this function, else None."""
        if not self.outputs or tuple(diff) != self.diff or not fn == self.fn:
            return None
        kept = self.outputs.get(graph_key(values))
        return None if kept is None else [o.clone() for o in kept]


    def graph_at(self, fn: Callable[..., Any], diff: Sequence[int],
                 values: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any] | None:
        """The call's own graph where its leaves hold `values`, once the lean path recorded f(x)
        (its forward shown to write no input and draw nothing), else None."""
        if self.graph is None or self.at(fn, diff, values) is None:
            return None
        leaves, result = self.graph
        return (leaves, result) if graph_key(leaves) == graph_key(values) else None

    @classmethod
    def of_call(cls, fn: Callable[..., Any], args: Sequence[Any]) -> Handed:
        """An empty record of fn(*args), its differentiable arguments those requiring grad."""
        return cls(fn, tuple(k for k, a in enumerate(args)
                             if isinstance(a, torch.Tensor) and a.requires_grad))


_RECORDING: ContextVar[Handed | None] = ContextVar("gradtool_handing", default=None)
_SERVING: ContextVar[Handed | None] = ContextVar("gradtool_handed", default=None)


@contextmanager
def _within(var: ContextVar[Handed | None], handed: Handed | None) -> Iterator[None]:
    token = var.set(handed)
    try:
        yield
    finally:
        var.reset(token)


def recording(handed: Handed | None) -> Any:
    """Within: the lean path records its evaluations of handed.fn (`record`)."""
    return _within(_RECORDING, handed)


def serving(handed: Handed | None) -> Any:
    """Within: Problems of handed.fn read its recorded outputs (`served`)."""
    return _within(_SERVING, handed)


def record(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor]) -> None:
    """Keep fn's outputs at `values` for the pipeline, where a hand-over is being recorded."""
    handed = _RECORDING.get()
    if handed is not None and tuple(diff) == handed.diff and fn == handed.fn:
        handed.record(values, outs)


def served_graph(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor]
                 ) -> tuple[list[torch.Tensor], Any] | None:
    """The handed-over call's own graph at `values`, or None."""
    handed = _SERVING.get()
    return None if handed is None else handed.graph_at(fn, diff, values)


def record_vjp(leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
               grads: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> None:
    """Keep a backward through the call's own graph, where a hand-over is being recorded."""
    handed = _RECORDING.get()
    if handed is not None and handed.on_graph(leaves, outs) and handed.kept <= KEEP_BYTES:
        handed.vjps.setdefault(graph_key(grads), [g.detach().clone() for g in gradients])
        handed.kept += sum(g.numel() * g.element_size() for g in gradients)


def served_vjps(leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]] | None:
    """Backward's gradients for each row of grad_outputs (grads: per output, a leading row
    dimension) through the handed-over graph, when the lean path ran every one; else None."""
    handed = _SERVING.get()
    if handed is None or not handed.vjps or not handed.on_graph(leaves, outs):
        return None
    kept = [handed.vjps.get(graph_key([g[k] for g in grads])) for k in range(len(grads[0]))]
    return None if any(k is None for k in kept) else [[g.clone() for g in k] for k in kept]


def served(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor],
           mask: Sequence[bool] | None = None) -> list[torch.Tensor] | None:
    """The outputs handed over for fn at `values` (the differentiable arguments), those `mask`
    keeps, or None."""
    handed = _SERVING.get()
    kept = None if handed is None else handed.at(fn, diff, values)
    if kept is None or mask is None:
        return kept
    return [o for o, keep in zip(kept, mask) if keep]
