"""graph --grads: run backward with a hook on every node and flag where a gradient dies or explodes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .model import GradFlow, GradStat, Node, Output, Problem


def run_backward(order: list[Any], outs: list[torch.Tensor], seed: int
                  ) -> tuple[dict[int, GradFlow], str | None]:
    """Backward from seeded random grad_outputs with a hook on every node."""
    flows: dict[int, GradFlow] = {}

    def capture(key: int) -> Callable[[tuple, tuple], None]:
        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            flows[key] = GradFlow(tuple(map(_stat, grad_outputs)), tuple(map(_stat, grad_inputs)))
        return hook

    leaves = [n for n in order if hasattr(n, "variable")]
    handles = [n.register_hook(capture(id(n))) for n in order if not hasattr(n, "variable")]
    roots = [t for t in outs if t.requires_grad]
    if not roots:
        return flows, None
    generator = torch.Generator().manual_seed(seed)
    seeds = [torch.randn(t.shape, generator=generator, dtype=t.dtype, device="cpu").to(t.device)
             for t in roots]
    error = None
    try:
        # autograd.grad, not backward: leaf gradients are returned instead of written to .grad
        got = torch.autograd.grad(roots, [n.variable for n in leaves], seeds, allow_unused=True)
        flows.update({id(n): GradFlow((_stat(g),), ()) for n, g in zip(leaves, got)})
    except Exception as exc:  # noqa: BLE001 - the user's backward failing is a finding to show
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for handle in handles:
            handle.remove()
    return flows, error


def _stat(grad: torch.Tensor | None) -> GradStat | None:
    """Norm and NaN/Inf/all-zero flags; one reduction in the common (finite) case."""
    if grad is None:
        return None
    grad = grad.detach()
    if grad.is_sparse:
        grad = grad.coalesce().values()
    norm = float(torch.linalg.vector_norm(grad.abs() if grad.is_complex() else grad,
                                          dtype=torch.float64))
    if math.isfinite(norm):
        # a norm can underflow to 0 for tiny values, so zero is decided on the elements
        return GradStat(norm, zero=norm == 0 and not bool(grad.any()))
    return GradStat(None, nan=bool(torch.isnan(grad).any()), inf=bool(torch.isinf(grad).any()))


_SEED = GradStat(1.0)  # what an output's node receives from outside: finite, non-zero
_ZERO = GradStat(0.0, zero=True)
_WORD = {"nan": "a NaN", "inf": "an Inf", "zero": "an all-zero"}


def annotate(nodes: list[Node], flows: list[GradFlow | None], outputs: tuple[Output, ...]
              ) -> list[Node]:
    """Attach each node's gradient flow and the problems that start at it."""
    incoming: dict[str, list[GradStat | None]] = {o.node: [_SEED] for o in outputs if o.node}
    for node, flow in zip(nodes, flows):
        for child, stat in zip(node.next, flow.produced if flow else ()):
            if child is not None:
                incoming.setdefault(child, []).append(stat)
    result = []
    for node, flow in zip(nodes, flows):
        if flow is not None:
            found = (_arrival(node, flow, incoming.get(node.id, []))
                     or _production(node, flow, nodes))
            node = replace(node, grad=replace(flow, problems=found))
        result.append(node)
    return result


def _kind(stats: list[GradStat | None] | tuple[GradStat | None, ...]) -> str | None:
    """The worst thing about a set of gradients: nan, inf, zero (all of them zero) or None."""
    present = [s for s in stats if s is not None]
    if any(s.nan for s in present):
        return "nan"
    if any(s.inf for s in present):
        return "inf"
    return "zero" if present and all(s.zero for s in present) else None


def _arrival(node: Node, flow: GradFlow, incoming: list[GradStat | None]) -> tuple[Problem, ...]:
    """Bad on arrival though no single input was: the sum of incoming gradients went bad."""
    # an input that sent None sent nothing, which autograd treats as zeros
    got, sent = _kind(flow.received), _kind([s or _ZERO for s in incoming])
    if not incoming or got is None or got == sent or (got == "zero" and sent is not None):
        return ()
    how = "cancel to zero" if got == "zero" else f"sum to {_WORD[got].split()[1]}"
    return (_problem(node, got, None, f"the gradients it receives {how}"),)


def _production(node: Node, flow: GradFlow, nodes: list[Node]) -> tuple[Problem, ...]:
    """Bad gradients produced from good ones: NaN/Inf from finite, all-zero from non-zero."""
    if _kind(flow.received) in ("nan", "inf"):
        return ()
    live = any(s is not None and not s.zero for s in flow.received)
    found = []
    for i, stat in enumerate(flow.produced):
        kind = _kind([stat])
        if kind is None or (kind == "zero" and not live):
            continue
        target = nodes[int(node.next[i][1:])] if i < len(node.next) and node.next[i] else None
        name = target and (target.leaf.name if target.leaf else f"{target.name} {target.id}")
        came = "non-zero" if kind == "zero" else "finite"
        what = f"produced {_WORD[kind]} gradient for input {i}" + (f" ({name})" if name else "")
        found.append(_problem(node, kind, i, f"{what} from a {came} incoming gradient"))
    return tuple(found)


def _problem(node: Node, kind: str, i: int | None, what: str) -> Problem:
    custom = f", custom Function {node.function}" if node.function else ""
    return Problem(node.id, kind, i, what, f"{node.name} ({node.id}{custom}) {what}")
