"""Outputs one caller evaluated, handed to the pipeline it runs next on the same call.

The drop-in's lean path (dropin/lean.py) evaluates a call's forward without a graph at f(x), at
the probe's points and at the colours' points, and runs backward through the call's own graph,
then hands a call it does not pass to gradtool.check for the report, whose engine evaluates the
same function at many of the same points (the same seeded probe vectors, the same colours, the
same arithmetic). Torch's failing gradcheck pays each evaluation once; so does the drop-in:
within the hand-over (`serving`), a Problem of that function (compared with ==: a Function's
apply is a new bound method at each access) reads an output recorded at the same
differentiable values (their exact bits, ledger.graph_key) instead of evaluating again, its
probe phase takes the call's own graph (torch's gradcheck runs backward there too), and
backward through that graph at a grad_output recorded reads its gradients. Recorded only from a
forward shown to write no input, draw from no RNG and give the same outputs twice (lean.py's
_pure): a plain deterministic call, whose outputs at a point are its outputs there. A
module's report calls a private deep copy of it; where that copy computes what the instance
does (not cast, no parameter swapped in: targets/cases.py's `stands_for`), it reads them too.

A passing call (most of them) pays only a reference per evaluation: what was recorded is keyed
and copied when the pipeline first asks, and a tensor written since (its version moved) is not
served.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any
from weakref import WeakKeyDictionary

import torch

from .ledger import graph_key

KEEP = 512  # evaluations recorded at most (a tiny call's lean path makes 5 to 40)

# (key tensors, value tensors, their versions when recorded): references to the lists the
# lean path built for that one evaluation, so a passing call (most of them) pays no copy
Entry = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], list[int], list[int]]


# fn -> the callable whose evaluations fn's are: a private deep copy of the user's nn.Module
# instance, uncast and with no parameter swapped in (targets/cases.py:bind_module), computes
# what the instance computes; the drop-in recorded the instance's. Keyed by the function
# object itself (a wrapper around it, even one made with functools.wraps, is not in it).
_STANDS_FOR: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()


def stands_for(fn: Callable[..., Any], original: Any) -> None:
    """Declare that fn(*args) evaluates original(*args) (on a copy of its state)."""
    _STANDS_FOR[fn] = original


def same_function(fn: Callable[..., Any], recorded: Callable[..., Any]) -> bool:
    """Whether fn evaluates what `recorded` (the hand-over's function) evaluated."""
    if fn is recorded or fn == recorded:
        return True
    try:
        return _STANDS_FOR.get(fn) is recorded
    except TypeError:  # not weakly referenceable: never declared
        return False


def _index(entries: list[Entry]) -> dict[Any, list[torch.Tensor]]:
    """The entries whose tensors nobody wrote since, by their key tensors' exact bits."""
    found: dict[Any, list[torch.Tensor]] = {}
    for keys, values, key_versions, versions in entries:
        if key_versions == [t._version for t in keys] and \
                versions == [t._version for t in values]:
            found.setdefault(graph_key(keys), [v.detach().clone() for v in values])
    return found


class Handed:
    """One call's record: fn(*args) with args[diff] at recorded values, and backward through
    the call's own graph (`bind`) at recorded grad_outputs. (A plain class with slots: every
    drop-in call makes one, and a dataclass's default factories cost a passing call ~2 us.)"""

    __slots__ = ("fn", "diff", "positions", "recorded", "backwards", "graph", "leaf_ids",
                 "out_ids", "_outputs", "_vjps", "_seen", "seconds")

    def __init__(self, fn: Callable[..., Any], diff: tuple[int, ...]) -> None:
        self.fn, self.diff, self.positions = fn, diff, list(diff)
        self._seen: tuple[Any, Any] = (None, None)  # the last (leaves, outs) lists on_graph
        self.recorded: list[Entry] = []   # (values, outputs)
        self.backwards: list[Entry] = []  # (grad_outputs, gradients)
        # the drop-in's own forward with its graph: (the tensors given requiring grad, its
        # result, its tensors), what torch's gradcheck runs backward through
        self.graph: tuple[list[torch.Tensor], Any, list[torch.Tensor]] | None = None
        # that graph's leaves and outputs (their ids: the record holds them, none is reused)
        self.leaf_ids: list[int] = []
        self.out_ids: list[int] = []
        self._outputs: dict[Any, list[torch.Tensor]] | None = None  # keyed on first use
        self._vjps: dict[Any, list[torch.Tensor]] | None = None
        self.seconds = 0.0  # the drop-in's own forward (with its graph): what one costs

    @classmethod
    def of_call(cls, fn: Callable[..., Any], args: Sequence[Any]) -> Handed:
        """An empty record of fn(*args), its differentiable arguments those requiring grad."""
        return cls(fn, tuple([k for k, a in enumerate(args)
                              if isinstance(a, torch.Tensor) and a.requires_grad]))

    def bind(self, leaves: list[torch.Tensor], result: Any, outs: Sequence[torch.Tensor]
             ) -> None:
        """The call's own graph: `leaves` (the tensors given requiring grad), its result and
        that result's tensors."""
        self.graph = (leaves, result, list(outs))
        self.leaf_ids, self.out_ids = [id(t) for t in leaves], [id(t) for t in outs]

    def on_graph(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> bool:
        """Whether leaves and outs are the bound graph's own tensors (the very objects)."""
        if self._seen[0] is leaves and self._seen[1] is outs:  # a sweep's rows: the same lists
            return True
        found = bool(self.leaf_ids) and [id(t) for t in leaves] == self.leaf_ids and \
            [id(t) for t in outs] == self.out_ids
        if found:
            self._seen = (leaves, outs)
        return found

    def at(self, fn: Callable[..., Any], diff: Sequence[int],
           values: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """Fresh copies of the outputs recorded at `values` for this function, else None."""
        if not self.recorded or tuple(diff) != self.diff or not same_function(fn, self.fn):
            return None
        if self._outputs is None:
            self._outputs = _index(self.recorded)
        kept = self._outputs.get(graph_key(values))
        return None if kept is None else [o.clone() for o in kept]

    def gradients(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """Fresh copies of backward's gradients recorded at grad_outputs `grads`, else None."""
        if self._vjps is None:
            self._vjps = _index(self.backwards)
        kept = self._vjps.get(graph_key(grads))
        return None if kept is None else [g.clone() for g in kept]

    def graph_at(self, fn: Callable[..., Any], diff: Sequence[int],
                 values: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any] | None:
        """The call's own graph where its leaves hold `values`, once the lean path recorded f(x)
        (its forward shown to write no input and draw nothing), else None."""
        if self.graph is None or self.at(fn, diff, values) is None:
            return None
        leaves, result, _ = self.graph
        return (leaves, result) if graph_key(leaves) == graph_key(values) else None


_RECORDING: ContextVar[Handed | None] = ContextVar("gradtool_handing", default=None)
_SERVING: ContextVar[Handed | None] = ContextVar("gradtool_handed", default=None)


class _Within:
    """var set to handed within (a class: a generator context costs a passing call ~2 us)."""

    __slots__ = ("var", "handed", "token")

    def __init__(self, var: ContextVar[Handed | None], handed: Handed | None) -> None:
        self.var, self.handed = var, handed

    def __enter__(self) -> None:
        self.token = self.var.set(self.handed)

    def __exit__(self, *exc: object) -> None:
        self.var.reset(self.token)


def recording(handed: Handed | None) -> _Within:
    """Within: the lean path records its evaluations of handed.fn (`record`, `record_vjp`)."""
    return _Within(_RECORDING, handed)


def serving(handed: Handed | None) -> _Within:
    """Within: Problems of handed.fn read what was recorded (`served`, `served_vjps`,
    `served_graph`)."""
    return _Within(_SERVING, handed)


def record(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor]) -> None:
    """Keep fn's outputs at `values` for the pipeline, where a hand-over is being recorded."""
    handed = _RECORDING.get()
    if handed is not None and len(handed.recorded) < KEEP and (fn is handed.fn or fn == handed.fn) \
            and list(diff) == handed.positions:
        handed.recorded.append((values, outs, [t._version for t in values],
                                [t._version for t in outs]))


def record_vjp(leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
               grads: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor]) -> None:
    """Keep a backward through the call's own graph, where a hand-over is being recorded."""
    handed = _RECORDING.get()
    if handed is not None and len(handed.backwards) < KEEP and handed.on_graph(leaves, outs):
        handed.backwards.append((grads, gradients, [t._version for t in grads],
                                 [t._version for t in gradients]))


def served_vjps(leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]] | None:
    """Backward's gradients for each row of grad_outputs (grads: per output, a leading row
    dimension) through the handed-over graph, when the lean path ran every one; else None."""
    handed = _SERVING.get()
    if handed is None or not handed.backwards or not handed.on_graph(leaves, outs):
        return None
    kept = []
    for k in range(len(grads[0])):  # the first row not recorded ends it: backward runs them
        found = handed.gradients([g[k] for g in grads])
        if found is None:
            return None
        kept.append(found)
    return kept


def served_seconds() -> float | None:
    """The handed-over call's own forward time, within a hand-over that recorded any."""
    handed = _SERVING.get()
    return None if handed is None or handed.graph is None else handed.seconds


def served_graph(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor]
                 ) -> tuple[list[torch.Tensor], Any] | None:
    """The handed-over call's own graph at `values`, or None."""
    handed = _SERVING.get()
    return None if handed is None else handed.graph_at(fn, diff, values)


def served(fn: Callable[..., Any], diff: Sequence[int], values: Sequence[torch.Tensor],
           mask: Sequence[bool] | None = None) -> list[torch.Tensor] | None:
    """The outputs handed over for fn at `values` (the differentiable arguments), those `mask`
    keeps, or None."""
    handed = _SERVING.get()
    kept = None if handed is None else handed.at(fn, diff, values)
    if kept is None or mask is None:
        return kept
    return [o for o, keep in zip(kept, mask) if keep]
