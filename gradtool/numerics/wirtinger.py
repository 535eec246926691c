"""Complex targets as real ones: each complex tensor as its (real, imaginary) parts."""

# PyTorch's convention (torch/autograd/gradcheck.py, and the autograd notes): for a real loss L of
# z = x + iy, the gradient autograd returns is dL/dx + i dL/dy, the conjugate Wirtinger derivative
# times 2. So a backward obeys the convention exactly when, read through (real, imaginary) parts,
# it is the transposed Jacobian of the real map (x, y) -> (Re f, Im f): the same map the finite
# differences see. Checking that real map checks the convention, holomorphic or not, and
# real -> complex and complex -> real Functions alike, with the real engine unchanged.

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .facts import Facts
from .problem import Problem, tensor_outputs


def is_complex(problem: Problem) -> bool:
    """Whether any differentiable input or output is complex (one forward, remembered)."""
    if problem.facts.complex is None:  # a problem the probe phase never saw
        found = any(v.is_complex() for v in problem.inputs) or any(
            o.is_complex() for o in problem.outputs(problem.inputs))
        problem.learn(problem.facts.with_(complex=found))
    return bool(problem.facts.complex)


def realify(problem: Problem) -> Problem:
    """The same target as a real function: complex inputs become (..., 2) real tensors of their
    parts, complex outputs likewise; real ones pass through. Names are kept."""
    complex_at = [p for p, v in zip(problem.diff, problem.inputs) if v.is_complex()]
    args = list(problem.args)
    for position in complex_at:
        args[position] = torch.view_as_real(args[position].detach()).clone()
    fn = _wrap(problem.fn, complex_at)
    batched = _wrap(problem.batched_fn, complex_at) if problem.batched_fn is not None else None
    # Its outputs are other tensors (real parts): the priming forward learns them afresh.
    facts = Facts(learnt=True, mutates=problem.mutates, seed=problem.freeze_seed, complex=False)
    return Problem(fn, args, list(problem.names), list(problem.diff), batched_fn=batched,
                   facts=facts, sparse=problem.sparse)


def _wrap(fn: Callable[..., Any], complex_at: list[int]) -> Callable[..., Any]:
    def real_fn(*args: Any) -> tuple[torch.Tensor, ...]:
        args = list(args)
        for position in complex_at:  # a new tensor, not a view: the target may write to it
            args[position] = torch.complex(args[position][..., 0], args[position][..., 1])
        return tuple(torch.stack((o.real, o.imag), -1) if o.is_complex() else o
                     for o in tensor_outputs(fn(*args)))

    return real_fn


def parts_sign(rows_complex: bool, cols_complex: bool, n_rows: int, n_cols: int,
               device: torch.device) -> torch.Tensor:
    """+1, or -1 where exactly one of (row, column) is an imaginary part: multiplying a realified
    Jacobian block by it gives the block of z -> conj(f(conj z))."""
    r = torch.ones(n_rows, dtype=torch.float64, device=device)
    c = torch.ones(n_cols, dtype=torch.float64, device=device)
    if rows_complex:
        r[1::2] = -1
    if cols_complex:
        c[1::2] = -1
    return r[:, None] * c[None, :]
