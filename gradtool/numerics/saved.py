"""Tensors a custom Function saved in forward that carry no graph to the inputs they depend on:
a backward built from them is right, its derivative misses every term through them."""

from __future__ import annotations

from typing import Any

import torch

from .problem import Problem, function_nodes


def untracked_saved(problem: Problem) -> list[dict[str, Any]]:
    """Per saved tensor that changes with the inputs yet has no graph (autograd is off in a
    Function's forward: an intermediate saved there is a constant to double backward): the
    Function's name, the tensor's place among its saved tensors, and its shape. Two forwards,
    at the inputs and at inputs moved by about a thousandth, tell a dependence from a
    constant (a weight the Function saves)."""
    with torch.enable_grad():
        _, outs = problem.graph()
        here = _saved(outs)
        gen = torch.Generator().manual_seed(7)  # the user's RNG stays untouched
        moved = [v + 1e-3 * (v.abs() + 1) * (0.5 + torch.rand(v.shape, generator=gen, device="cpu").to(v))
                 if v.is_floating_point() else v for v in problem.inputs]
        _, outs = problem.graph(moved)
        there = _saved(outs)
    found = []
    for (cls, saved), (other, saved_there) in zip(here, there):
        if cls is not other or len(saved) != len(saved_there):
            continue  # another graph at the moved inputs: nothing to compare
        for k, (t, u) in enumerate(zip(saved, saved_there)):
            if _untracked(t) and t.shape == u.shape and not torch.equal(t, u):
                found.append({"function": cls.__qualname__, "saved": k, "of": len(saved),
                              "shape": list(t.shape)})
    return found


def _saved(outs: list[torch.Tensor]) -> list[tuple[type, tuple[Any, ...]]]:
    """(Function class, saved tensors) per custom Function node, in the graph's walk order."""
    found = []
    for node in function_nodes(outs).values():
        try:
            saved = tuple(node.saved_tensors)
        except Exception:  # noqa: BLE001 - freed, or none: nothing to say of this node
            saved = ()
        found.append((node._forward_cls, saved))
    return found


def _untracked(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad
