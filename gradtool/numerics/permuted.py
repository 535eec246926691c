"""Probes of a block too large to evaluate whole, for diagnosis/structure.py's permutation test:
backward's gradient for random cotangents, and J u along random directions by finite
differences (so rolls, transposes and swapped gradients are named without a dense block)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..config.settings import CheckConfig
from .problem import Problem
from .steps import directional

PROBES = 2  # two random pairs: a wrong permutation matching both by chance is negligible


@dataclass
class Probes:
    """Per probe p (flat numpy vectors): v_p on output o, u_p on input i, the analytical
    gradient g_p = v_pᵀ J_analytical of input i, J_oi u_p, and for each other input of input i's
    shape, v_pᵀ J_oj u_p (u_p placed on that input)."""

    cotangents: list[Any] = field(default_factory=list)
    directions: list[Any] = field(default_factory=list)
    grads: list[Any] = field(default_factory=list)
    jvps: list[Any] = field(default_factory=list)
    others: dict[str, list[float]] = field(default_factory=dict)


def probes(problem: Problem, config: CheckConfig, i: int, o: int, seed: int) -> Probes:
    """PROBES backward calls and finite-difference J u's for block (input i, output o)."""
    leaves, outs = problem.graph()
    start = sum(t.numel() for t in outs[:o])
    out = outs[o]
    values = [v.detach() for v in problem.inputs]
    same = [j for j, v in enumerate(values) if j != i and v.shape == values[i].shape]
    gen = torch.Generator().manual_seed(seed + 977)
    h = config.tolerance("eps")
    found = Probes(others={problem.input_names[j]: [] for j in same})
    for _ in range(PROBES):
        v = torch.randn(out.shape, generator=gen, dtype=out.dtype)
        u = torch.randn(values[i].shape, generator=gen, dtype=values[i].dtype)
        grads = [v if k == o else torch.zeros_like(t) for k, t in enumerate(outs)]
        g = problem.vjp(leaves, outs, grads)[i]
        placed = [[u if k == j else torch.zeros_like(x) for k, x in enumerate(values)]
                  for j in [i, *same]]
        jus = directional(problem, values, placed, h)[0][:, start:start + out.numel()]
        found.cotangents.append(_flat(v))
        found.directions.append(_flat(u))
        found.grads.append(_flat(g))
        found.jvps.append(_flat(jus[0]))
        for j, ju in zip(same, jus[1:]):
            found.others[problem.input_names[j]].append(float(_flat(ju) @ _flat(v)))
    return found


def _flat(t: torch.Tensor) -> Any:
    return t.detach().reshape(-1).double().cpu().numpy()
