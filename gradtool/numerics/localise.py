"""After a failing probe: the probe test itself, and bisection down to named elements."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..config.settings import CheckConfig
from ..results import Element
from .compare import BlockTally
from .problem import Problem, flat_cat
from .measured import K, first_bound
from .steps import FINITE_MACHINE, KINK_TEST, directional, one_sided, vjp_rows


class Tests:
    """Probe tests for every (direction p, cotangent q): vᵀ(J u) from differences at steps h
    and 2h against (vᵀJ) u, each with a tolerance from the error measured between the two.

    Entries of u and v lie in ±[1, 2) (or are 0), so |u|, |v| < 2 bounds every weighted sum
    by a plain norm: a handful of fused reductions instead of ~25 elementwise passes."""

    def __init__(self, v: torch.Tensor, d: torch.Tensor, f0: torch.Tensor, g: torch.Tensor,
                 u: torch.Tensor, h: float, eps_m: float, atol: float,
                 ceiling: tuple[float, float] | None = None) -> None:
        # v (Q, n_out), d (2, P, n_out), f0 (n_out), g (Q, n_in), u (P, n_in): results (P, Q).
        # On the CPU numpy reads the same memory and its small-array operations cost a tenth of
        # torch's dispatch: ~30 of them are most of a tiny probe check's own time.
        # ceiling: the fixed (atol, rtol) a pass may not be more lenient than (see `noisy`).
        if all(t.device.type == "cpu" and t.dtype in NUMPY_DTYPES for t in (v, d, f0, g, u)):
            with np.errstate(all="ignore"):  # NaN and inf are verdicts here, not warnings
                self._judge(*(t.detach().numpy() for t in (v, d, f0, g, u)), h, eps_m, atol,
                            ceiling)
        else:  # outputs of another dtype than the inputs (a float64 op returning bfloat16):
            # the products need one dtype
            common = functools.reduce(torch.promote_types, (t.dtype for t in (v, d, f0, g, u)))
            self._judge(*(t.to(common) for t in (v, d, f0, g, u)), h, eps_m, atol, ceiling)

    def _judge(self, v: Any, d: Any, f0: Any, g: Any, u: Any, h: float, eps_m: float,
               atol: float, ceiling: tuple[float, float] | None = None) -> None:
        """The tests, on tensors or on the arrays that share their memory."""
        d_h, delta = d[0], d[0] - d[1]                   # delta: measured error, per output
        dv = delta @ v.T
        analytical = u @ g.T
        numerical = d_h @ v.T + dv / 3                     # Richardson: (4 d_h - d_2h) / 3
        # The projected error of a random v is a random sum: estimate it from every output's
        # measured error (robust: ||v * delta|| <= 2 ||delta||), and from the projection
        # itself (systematic errors).
        # (norms written out: numpy's norm costs ~8 µs of Python a call, a tenth of a tiny check)
        spread = 2 * ((delta * delta).sum(-1) ** 0.5)[:, None]
        rounding = (20 * eps_m / h) * (f0 @ f0) ** 0.5
        floor = 200 * eps_m * (abs(g).sum(-1)[None, :] + abs(d_h).sum(-1)[:, None])
        # atol at one typical element (|u v| ~ 2.25): what full mode accepts passes here too.
        # K: the same multiple of the measured error that full mode's measured tolerance uses
        measured = K * spread + 3 * abs(dv)
        tolerance = measured + rounding + floor + 2.25 * atol
        parts = [analytical, numerical, tolerance]
        if ceiling is not None:
            # what the test compares, before any cancellation: sum over outputs of |v (J u)|
            parts += [measured, ceiling[0] * 2.25 + ceiling[1] * (abs(d_h) @ abs(v).T)]
        a, n, t, *noise = [np.asarray(x, np.float64) for x in parts] \
            if isinstance(d_h, np.ndarray) else np.array(torch.stack(parts).tolist())
        self.analytical, self.numerical, self.tolerance = a, n, t
        self.difference = np.abs(a - n)
        self.fails = ~(self.difference <= t)               # NaN fails
        # A test whose measured error is beyond the fixed tolerance of what it compares (the
        # finite differences are noise: a backward or forward rounding through float32) could
        # pass a wrong gradient full mode fails, since full mode is never more lenient than
        # the fixed tolerance element by element: it cannot pass. NaN is left to `fails`.
        self.measured, self.ceiling = noise or (t, t)
        self.noisy = self.measured > self.ceiling if noise else np.zeros_like(self.fails)
        # The one door's first rule (numerics/bounds.py), here on numpy: an inf bound (a step
        # that left the domain, a -inf reaching the differences) is never a pass: noisy.
        self.noisy = self.noisy | (~np.isfinite(t) & ~self.fails)


NUMPY_DTYPES = (torch.float64, torch.float32, torch.float16)


def machine(dtype: torch.dtype, config: CheckConfig) -> float:
    """The unit roundoff a probe test allows for: the values' dtype's, or the configuration's
    where coarser (a forward computing in float32 though given float64 is judged as float32)."""
    judged = getattr(torch, config.dtype, dtype)
    return max(FINITE_MACHINE.get(dtype, 2.2e-16), FINITE_MACHINE.get(judged, 2.2e-16))


class Test(Tests):
    """One probe test (one direction, one cotangent), for localisation."""

    def __init__(self, v: torch.Tensor, d: torch.Tensor, f0: torch.Tensor, g: torch.Tensor,
                 u: torch.Tensor, h: float, eps_m: float, atol: float) -> None:
        super().__init__(v[None], d[:, None], f0, g[None], u[None], h, eps_m, atol)
        self.fails = bool(self.fails[0, 0])
        self.difference = float(self.difference[0, 0])


class Locator:
    """Bisection over one block's input elements, then output elements, to name wrong entries."""

    def __init__(self, problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                 outs: Sequence[torch.Tensor], i: int, u: torch.Tensor, v: torch.Tensor,
                 g: torch.Tensor, in_slice: slice, out_slice: slice) -> None:
        self.problem, self.config, self.i = problem, config, i
        self.leaves, self.outs = leaves, outs
        self.values = [x.detach() for x in problem.inputs]
        self.u, self.v, self.g = u, v, g
        self.in_slice, self.out_slice = in_slice, out_slice
        self.h = config.tolerance("eps")
        # a test's floor: the measured tolerance's first bound, else the fixed atol
        self.atol = (first_bound(self.values, flat_cat(outs).detach(), self.h)[0]
                     if config.measured else config.tolerance("atol"))
        self.eps_m = machine(self.values[0].dtype, config)
        self.f_all = flat_cat(outs).detach()
        self.f0 = self.f_all[out_slice]
        gen = torch.Generator().manual_seed(4242)  # drawn on the CPU: the same everywhere
        n = self.f0.numel()
        self.signs = ((torch.randint(0, 2, (n,), generator=gen, device="cpu") * 2 - 1
                       ).to(self.f0.dtype)
                      * (1 + torch.rand(n, generator=gen, dtype=self.f0.dtype, device="cpu"))
                      ).to(self.f0.device)
        self.tally = BlockTally(problem.input_names[i], tuple(self.values[i].shape),
                                _output_name(problem, outs, out_slice),
                                tuple(_output_of(outs, out_slice).shape), 0, 0)

    def elements(self, limit: int = 3,
                 decisive: Callable[[Element], bool] | None = None) -> list[Element]:
        """Up to `limit` wrong elements, each found by its own bisection; stops at the first
        element `decisive` says settles the block's verdict."""
        found: list[Element] = []
        excluded: list[int] = []
        for _ in range(limit):
            cols = bisect(self._input_subset_fails, self._remaining(excluded))
            if cols is None:
                break
            for col in cols[:2]:
                found.append(self._element(col))
                excluded.append(col)
                if decisive is not None and decisive(found[-1]):
                    return found
        return found

    def _remaining(self, excluded: list[int]) -> torch.Tensor:
        mask = torch.ones(self.g.numel(), dtype=torch.bool, device=self.g.device)
        mask[excluded] = False
        return torch.nonzero(mask).reshape(-1)

    def _input_subset_fails(self, subset: torch.Tensor) -> bool:
        direction = torch.zeros_like(self.u)
        direction[subset] = self.u[subset]
        shaped = direction.view(self.values[self.i].shape)
        dirs = [[shaped if j == self.i else torch.zeros_like(x) for j, x in enumerate(self.values)]]
        d = directional(self.problem, self.values, dirs, self.h, self.f_all)
        d = d[:, 0, self.out_slice]
        return Test(self.v, d, self.f0, self.g[subset], self.u[subset], self.h, self.eps_m,
                    self.atol).fails

    def _element(self, col: int) -> Element:
        estimates = one_sided(self.problem, self.values, self.i, col, self.h)
        column = {k: e[self.out_slice] for k, e in estimates.items()}
        noise = (column["central"] - column["central x10"]).abs()
        rows = bisect(lambda s: self._output_subset_fails(s, col, column["central"], noise),
                      torch.arange(self.v.numel(), device=self.v.device))
        row = int(rows[0]) if rows is not None else int(column["central"].abs().argmax())
        analytical = float(self._vjp_at(torch.tensor([row], device=self.f0.device))[col])
        values = [column[k][row].item() for k in KINK_TEST]
        numerical = column["central"][row].item()
        spread = max(values) - min(values)
        atol, rtol = self.config.tolerance("atol"), self.config.tolerance("rtol")
        shaky = not spread <= atol + rtol * abs(numerical)
        return self.tally.element(row, col, analytical, numerical, inconclusive=shaky)

    def _output_subset_fails(self, subset: torch.Tensor, col: int, column: torch.Tensor,
                             noise: torch.Tensor) -> bool:
        """Signed sum over the subset (signs: no cancellation between two wrong rows); the
        tolerance is one element's atol plus the measured differences' error, never the
        subset's size times rtol."""
        signs = self.signs[subset]
        grad = float(self._vjp_at(subset, signs)[col])
        numerical = float(signs @ column[subset])
        tol = self.atol + 3 * float(noise[subset].norm()) + 100 * self.eps_m * float(
            column[subset].abs().sum())
        return not abs(grad - numerical) <= tol

    def _vjp_at(self, subset: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
        """Σ of the analytical rows in `subset` (signed), restricted to this block's input."""
        grad = torch.zeros(sum(o.numel() for o in self.outs), dtype=self.f0.dtype,
                           device=self.f0.device)
        grad[self.out_slice.start + subset] = 1.0 if signs is None else signs
        return vjp_rows(self.problem, self.leaves, self.outs, grad.unsqueeze(0))[0, self.in_slice]


def _output_of(outs: Sequence[torch.Tensor], out_slice: slice) -> torch.Tensor:
    start = 0
    for o in outs:
        if start == out_slice.start:
            return o
        start += o.numel()
    return outs[0]


def _output_name(problem: Problem, outs: Sequence[torch.Tensor], out_slice: slice) -> str:
    start = 0
    for name, o in zip(problem.output_names, outs):
        if start == out_slice.start:
            return name
        start += o.numel()
    return problem.output_names[0]


def bisect(fails: Callable[[torch.Tensor], bool], indices: torch.Tensor) -> list[int] | None:
    """Narrow a failing index set by halves; stops when neither half fails on its own."""
    if len(indices) == 0 or not fails(indices):
        return None
    while len(indices) > 1:
        half = len(indices) // 2
        left, right = indices[:half], indices[half:]
        if fails(left):
            indices = left
        elif fails(right):
            indices = right
        else:
            break
    return indices.tolist()
