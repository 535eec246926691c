"""Structured inputs: a symmetric matrix is perturbed and its gradients compared as symmetric."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..tracebacks import calls_user_code


def symmetrise(t: torch.Tensor) -> torch.Tensor:
    """(X + Xᵀ) / 2 over the last two dimensions: the projection onto symmetric matrices."""
    return (t + t.transpose(-1, -2)) / 2


def projecting(fn: Callable[..., Any], positions: Sequence[int]) -> Callable[..., Any]:
    """fn with the arguments at `positions` symmetrised first.

    The check then runs on fn(P(X)): a finite difference along element (i, j) is the
    derivative along the symmetric direction (E_ij + E_ji) / 2, which stays in the tangent
    space (an SPD matrix stays SPD, a Function reading one triangle sees the change), and
    autograd through P gives P(gradient): both sides are the projected gradients, as
    ChainRulesTestUtils' ProjectTo compares them. At a symmetric X, P(X) = X."""

    @calls_user_code
    def run(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for position in positions:
            args[position] = symmetrise(args[position])
        run.projected = {p: args[p] for p in positions}  # type: ignore[attr-defined]
        return fn(*args, **kwargs)

    run.projected = {}  # type: ignore[attr-defined]
    return run


def projected_tensors(fn: Callable[..., Any], diff: Sequence[int]) -> dict[int, torch.Tensor]:
    """{leaf index: the projected tensor} of fn's last call (what user code received in place
    of that leaf): the culprit search re-runs a Function given such a tensor by replay."""
    found = getattr(fn, "projected", None) or {}
    return {diff.index(p): t for p, t in found.items() if p in diff}
