"""The ledger: a case's evaluations, each paid once and read by every later check that needs it.

A forward with its graph, and a backward through it, are keyed by what determines them: the
point (the inputs' exact bits), the cotangent (the grad_outputs' exact bits, or ZERO for an
all-zero grad_output) and the layout (CONTIGUOUS: every tensor in its own contiguous memory, as
Problem.vjp passes them). A check asks the ledger before it evaluates: found, it reads the
value (counted in `read`, per kind, which the runner adds to the check's calls as
"forward read" / "backward read", what `-v` prints); else it pays, as before.

Only evaluations whose reuse is sound are recorded, by the check that paid them: a graph whose
backward wrote nothing forward gave it (the contract's `backward_writes_input` otherwise), a
backward that left its grad_output as given. A recorded graph is read only while its leaves
and outputs still hold the values they were recorded with (a later backward writing what it
saved would make it another graph). Tests whose point is to call again — the contract's
determinism test, the layout check's confirmation that a difference is not backward differing
from itself — never read: they pay their second call.

GRADTOOL_LEDGER=0 turns the ledger off (every check pays its own evaluations):
tests/test_ledger.py runs the project's fixtures both ways and asserts the same verdicts.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..results import CheckResult

SWITCH = "GRADTOOL_LEDGER"  # "0": off (the verdict test's second run, a suspected share)
CONTIGUOUS = "contiguous"
ZERO = "zero"  # the cotangent key of an all-zero grad_output, whichever outputs it covers


def enabled() -> bool:
    """Whether checks read the ledger (on unless GRADTOOL_LEDGER=0)."""
    return os.environ.get(SWITCH, "1") != "0"


def graph_key(values: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], ...]:
    """The exact values (bits, dtype and shape) of a point, as a dict key."""
    try:  # numpy's tobytes: row-major whatever the strides, one call, the common case
        return tuple((v.dtype, v.shape, v.detach().numpy().tobytes()) for v in values)
    except (TypeError, RuntimeError):  # bfloat16 (no numpy dtype), another device, a neg bit
        return tuple((v.dtype, v.shape, v.detach().cpu().contiguous().reshape(-1)
                      .view(torch.uint8).numpy().tobytes()) for v in values)


# Up to this many bytes a point is keyed, and a graph's values kept, by their exact bits; a
# larger one (a model's parameters are inputs) by identity and fingerprints, which copy nothing.
EXACT_BYTES = 4 * 2**20


def _bytes(values: Sequence[torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in values)


def point_key(values: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """A point or a cotangent as a dict key: its exact values, or, past EXACT_BYTES, the
    tensors themselves unchanged since (the case's own inputs, which every check passes)."""
    if _bytes(values) <= EXACT_BYTES:
        return graph_key([v.detach() for v in values])
    return tuple(("same", id(v), v._version, v.dtype, v.shape) for v in values)


def _fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    """What tells a large tensor written to since: its version and its sums (a write through
    a data pointer, which autograd's version counter never sees, moves them)."""
    t = t.detach()
    sums = (float(torch.nansum(t.abs(), dtype=torch.float64)),
            float(torch.nansum(t, dtype=torch.float64)) if not t.is_complex() else 0.0) \
        if t.is_floating_point() or t.is_complex() else ()
    return (t._version, t.dtype, t.shape, sums)


@dataclass
class Graph:
    """A forward recorded with its graph at a point: leaves (what backward differentiates at),
    outs (the compared outputs, Problem.output_mask's), a backward through it at `grads`
    (one per out, zeros where an out needs none) and its result, and who paid for them."""

    leaves: list[torch.Tensor]
    outs: list[torch.Tensor]
    grads: list[torch.Tensor]
    result: list[torch.Tensor]
    paid_by: str
    # the values at recording: a graph is read only while they stand
    values: tuple[list[Any], list[Any]] = ([], [])

    def intact(self) -> bool:
        """Leaves and outputs still hold their recorded values (bits, NaN equal to NaN; past
        EXACT_BYTES, their fingerprints)."""
        now = [t.detach() for t in self.leaves + self.outs]
        then = self.values[0] + self.values[1]
        if len(now) != len(then):
            return False
        return all(_fingerprint(a) == b if isinstance(b, tuple) else _same(a, b)
                   for a, b in zip(now, then))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits where it matters: shape, dtype and values, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    try:
        if torch.equal(a, b):
            return True
        nan_a, nan_b = a.isnan(), b.isnan()
    except (RuntimeError, NotImplementedError):  # a dtype without equal or isnan (complex32)
        return bool(torch.equal(_bits(a), _bits(b)))
    return bool(torch.equal(nan_a, nan_b)) and bool(torch.equal(a[~nan_a], b[~nan_b]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@dataclass
class Ledger:
    """One case's recorded evaluations (Problem.cache.ledger) and what was read of them."""

    graphs: dict[tuple[Any, ...], Graph] = field(default_factory=dict)
    backwards: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)
    read: Counter = field(default_factory=Counter)  # "forward" / "backward" -> evaluations read

    def record_graph(self, point: Sequence[torch.Tensor], graph: Graph) -> None:
        """A graph (with one backward through it) for the checks after the one that paid."""
        if not enabled():
            return
        keep = _fingerprint if _bytes(graph.leaves + graph.outs) > EXACT_BYTES else \
            (lambda t: t.detach().clone())
        graph.values = ([keep(t) for t in graph.leaves], [keep(t) for t in graph.outs])
        graph.result = [r.detach().clone() for r in graph.result]
        self.graphs[point_key(point)] = graph

    def graph(self, point: Sequence[torch.Tensor], last: bool = True) -> Graph | None:
        """The graph recorded at this point, still intact, read (its forward, and where `last`
        its backward too, the last reader's: it is then dropped, held no longer than needed),
        or None: the caller pays its own."""
        if not enabled():
            return None
        key = point_key(point)
        found = self.graphs.pop(key, None) if last else self.graphs.get(key)
        if found is None or not found.intact():
            return None
        self.read.update(forward=1, backward=1 if last else 0)
        return found

    def record_backward(self, point: Sequence[torch.Tensor], cotangent: Any,
                        result: Sequence[Any], layout: str = CONTIGUOUS) -> None:
        """backward's gradients (one per differentiable input) at this point and cotangent
        (tensors, or ZERO)."""
        if not enabled():
            return
        key = (point_key(point), _cotangent_key(cotangent), layout)
        self.backwards[key] = [r.detach().clone() if isinstance(r, torch.Tensor) else r
                               for r in result]

    def backward(self, point: Sequence[torch.Tensor], cotangent: Any,
                 layout: str = CONTIGUOUS, count: bool = True) -> list[Any] | None:
        """The recorded gradients, read (one backward, where `count`), or None: the caller
        pays."""
        if not enabled():
            return None
        found = self.backwards.get((point_key(point), _cotangent_key(cotangent), layout))
        if found is not None and count:
            self.read.update(backward=1)
        return found

    def snapshot(self) -> Counter:
        return Counter(self.read)

    def told(self, result: CheckResult, before: Counter) -> CheckResult:
        """A check's result with what it read since `before` beside what it paid, in its calls
        ("backward read": what `-v` says of each check)."""
        reads = {f"{kind} read": n - before.get(kind, 0) for kind, n in self.read.items()
                 if n - before.get(kind, 0)}
        return replace(result, calls={**result.calls, **reads}) if reads else result


def _cotangent_key(cotangent: Any) -> Any:
    return ZERO if cotangent is ZERO else point_key(cotangent)


