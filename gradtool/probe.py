"""Probe mode: vᵀ(J u) by finite differences against (vᵀJ) u by backward, then localisation."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .compare import BlockTally, within
from .config import CheckConfig
from .jacobian import FINITE_MACHINE, Reference, Verdict, _kink_note, _tallies
from .numerics import directional, one_sided, vjp_rows
from .problem import Problem, flat_cat
from .results import Element, Outcome


def check_probe(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                outs: Sequence[torch.Tensor], reference: Reference | None, reason: str,
                seed: int) -> Verdict:
    """A fixed number of calls whatever the size; tolerance from the measured FD error."""
    gen = torch.Generator().manual_seed(seed + 7919)
    values = [v.detach() for v in problem.inputs]
    k, n_in_tensors = config.probes, len(values)
    u = [[_rademacher(v.shape, gen, v.dtype) for v in values] for _ in range(k)]
    v = _rademacher((k, sum(o.numel() for o in outs)), gen, outs[0].dtype)
    out_slices = _slices([o.numel() for o in outs])
    in_slices = _slices([x.numel() for x in values])
    # v restricted to each output in turn: one VJP row per (probe, output).
    rows = torch.zeros(k * len(outs), v.shape[1], dtype=v.dtype)
    for p in range(k):
        for o, sl in enumerate(out_slices):
            rows[p * len(outs) + o, sl] = v[p, sl]
    grads = vjp_rows(problem, leaves, outs, rows)
    tallies = _tallies(problem, leaves, outs, config.tolerance("atol"), config.tolerance("rtol"),
                       config.max_worst)
    if reference is not None:
        return _against_reference(problem, config, tallies, grads, reference(rows), in_slices,
                                  reason)
    h = config.tolerance("eps")
    # One direction per (probe, input): u restricted to that input, so blocks stay separate.
    directions = [[u[p][i] if j == i else torch.zeros_like(values[j]) for j in range(n_in_tensors)]
                  for p in range(k) for i in range(n_in_tensors)]
    diffs = directional(problem, values, directions, h)        # (2, k * n_in_tensors, n_out)
    f0 = flat_cat(outs).detach()
    eps_m = FINITE_MACHINE.get(values[0].dtype, 2.2e-16)
    failing = set()
    for p in range(k):
        for i, isl in enumerate(in_slices):
            d = diffs[:, p * n_in_tensors + i]
            for o, osl in enumerate(out_slices):
                g = grads[p * len(outs) + o, isl]
                a = float(g @ u[p][i].reshape(-1))
                n, tol = _estimate(v[p, osl], d[:, osl], f0[osl], g, u[p][i], h, eps_m)
                tally = tallies[i][o]
                tally.checked += 1
                tally.max_abs = max(tally.max_abs, abs(a - n))
                if abs(a - n) > tol:
                    failing.add((i, o, p))
    return _localise_all(problem, config, tallies, failing, u, v, grads, out_slices, in_slices,
                         reason)


def _rademacher(shape: Sequence[int], gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """±1 entries: a single wrong element shifts vᵀJu by exactly its error, never less."""
    return (torch.randint(0, 2, tuple(shape), generator=gen) * 2 - 1).to(dtype)


def _slices(sizes: Sequence[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def _estimate(v: torch.Tensor, d: torch.Tensor, f0: torch.Tensor, g: torch.Tensor,
              u: torch.Tensor, h: float, eps_m: float) -> tuple[float, float]:
    """(Richardson estimate of vᵀJu, tolerance) from differences at steps h and 2h."""
    d_h, d_2h = d[0], d[1]
    numerical = float(v @ (4 * d_h - d_2h)) / 3
    truncation = abs(float(v @ (d_h - d_2h)))          # measured: shrinks as h², grows with noise
    rounding = 10 * eps_m * float((v * f0).norm()) / h   # random-walk rounding of the quotient
    floor = 100 * eps_m * (float((g * u.reshape(-1)).abs().sum()) + float((v * d_h).abs().sum()))
    return numerical, 3 * truncation + rounding + floor


def _against_reference(problem: Problem, config: CheckConfig, tallies: list[list[BlockTally]],
                       grads: torch.Tensor, expected: torch.Tensor, in_slices: list[slice],
                       reason: str) -> Verdict:
    """A declared surrogate is exact: compare the VJP vectors element by element."""
    n_out_blocks = len(tallies[0])
    for i, isl in enumerate(in_slices):
        for o in range(n_out_blocks):
            rows = slice(o, None, n_out_blocks)
            tallies[i][o].add(grads[rows, isl].T, expected[rows, isl].T)
    blocks = [t.to_block(exhaustive=False) for row in tallies for t in row]
    failed = any(t.mismatched for row in tallies for t in row)
    return Verdict(Outcome.FAILED if failed else Outcome.PASSED, blocks, "probe", reason)


def _localise_all(problem: Problem, config: CheckConfig, tallies: list[list[BlockTally]],
                  failing: set[tuple[int, int, int]], u: list, v: torch.Tensor,
                  grads: torch.Tensor, out_slices: list[slice], in_slices: list[slice],
                  reason: str) -> Verdict:
    blocks, outcomes, details = [], [], []
    seen = set()
    for i, o, p in sorted(failing):
        if (i, o) in seen:
            continue
        seen.add((i, o))
        tally = tallies[i][o]
        locator = Locator(problem, config, i, o, p, u, v, grads, out_slices, in_slices)
        elements = locator.elements()
        bad = [e for e in elements if not within(e.analytical, e.numerical, tally.atol, tally.rtol)
               or e.inconclusive]
        tally.mismatched = len(bad)
        tally.max_rel = max((e.rel_diff for e in bad), default=0.0)
        if not bad:
            details.append(f"{tally.input} -> {tally.output}: probes differ by {tally.max_abs:.3g},"
                           " but the located elements are within atol/rtol")
            continue
        if all(e.inconclusive for e in bad):
            outcomes.append(Outcome.INCONCLUSIVE)
            details.append(_kink_note(tally, bad))
        else:
            outcomes.append(Outcome.FAILED)
        tallies[i][o] = tally
        blocks.append((i, o, tally.to_block(tuple(bad), exhaustive=False)))
    located = {(i, o): b for i, o, b in blocks}
    all_blocks = [located.get((i, o)) or t.to_block(exhaustive=False)
                  for i, row in enumerate(tallies) for o, t in enumerate(row)]
    outcome = Outcome.PASSED
    if outcomes:
        outcome = Outcome.FAILED if Outcome.FAILED in outcomes else Outcome.INCONCLUSIVE
    return Verdict(outcome, all_blocks, "probe", reason, details)


class Locator:
    """Bisection over input elements, then output elements, to name the wrong entries."""

    def __init__(self, problem: Problem, config: CheckConfig, i: int, o: int, p: int,
                 u: list, v: torch.Tensor, grads: torch.Tensor, out_slices: list[slice],
                 in_slices: list[slice]) -> None:
        self.problem, self.config, self.i, self.o = problem, config, i, o
        self.values = [x.detach() for x in problem.inputs]
        self.u = u[p][i].reshape(-1)
        self.v = v[p, out_slices[o]]
        self.g = grads[p * len(out_slices) + o, in_slices[i]]
        self.out_slice, self.in_slice = out_slices[o], in_slices[i]
        self.h = config.tolerance("eps")
        self.eps_m = FINITE_MACHINE.get(self.values[0].dtype, 2.2e-16)
        self.tally = BlockTally("", (), "", (), 0, 0)

    def elements(self, limit: int = 3) -> list[Element]:
        """Up to `limit` wrong elements, each found by its own bisection."""
        found: list[Element] = []
        excluded: list[int] = []
        for _ in range(limit):
            cols = _bisect(self._input_subset_fails, self._remaining(excluded))
            if cols is None:
                break
            for col in cols[:2]:
                found.append(self._element(col))
                excluded.append(col)
        return found

    def _remaining(self, excluded: list[int]) -> torch.Tensor:
        mask = torch.ones(self.g.numel(), dtype=torch.bool)
        mask[excluded] = False
        return torch.nonzero(mask).reshape(-1)

    def _input_subset_fails(self, subset: torch.Tensor) -> bool:
        direction = torch.zeros_like(self.u)
        direction[subset] = self.u[subset]
        shaped = direction.view(self.values[self.i].shape)
        dirs = [[shaped if j == self.i else torch.zeros_like(x) for j, x in enumerate(self.values)]]
        d = directional(self.problem, self.values, dirs, self.h)[:, 0, self.out_slice]
        f0 = flat_cat(self.problem.outputs(self.values))[self.out_slice]
        a = float(self.g[subset] @ self.u[subset])
        n, tol = _estimate(self.v, d, f0, self.g[subset], self.u[subset], self.h, self.eps_m)
        return abs(a - n) > tol

    def _element(self, col: int) -> Element:
        estimates = one_sided(self.problem, self.values, self.i, col, self.h)
        column = {k: e[self.out_slice] for k, e in estimates.items()}
        rows = _bisect(lambda s: self._output_subset_fails(s, col, column["central"]),
                       torch.arange(self.v.numel()))
        row = int(rows[0]) if rows is not None else int(column["central"].abs().argmax())
        analytical = self._analytical(row, col)
        values = [c[row].item() for c in column.values()]
        numerical = column["central"][row].item()
        spread = max(values) - min(values)
        atol, rtol = self.config.tolerance("atol"), self.config.tolerance("rtol")
        shaky = spread > atol + rtol * abs(numerical)
        tally = self._block_tally()
        return tally.element(row, col, analytical, numerical, inconclusive=shaky)

    def _block_tally(self) -> BlockTally:
        p = self.problem
        outs = p.outputs(self.values)
        return BlockTally(p.input_names[self.i], tuple(self.values[self.i].shape),
                          p.output_names[self.o], tuple(outs[self.o].shape), 0, 0)

    def _output_subset_fails(self, subset: torch.Tensor, col: int, column: torch.Tensor) -> bool:
        grad_row = self._vjp_at(subset)[col]
        numerical = float(column[subset].sum())
        atol, rtol = self.config.tolerance("atol"), self.config.tolerance("rtol")
        return abs(float(grad_row) - numerical) > atol + rtol * float(column[subset].abs().sum())

    def _analytical(self, row: int, col: int) -> float:
        return float(self._vjp_at(torch.tensor([row]))[col])

    def _vjp_at(self, subset: torch.Tensor) -> torch.Tensor:
        leaves, outs = self.problem.graph(self.values)
        grad = torch.zeros(sum(x.numel() for x in outs), dtype=outs[0].dtype)
        grad[self.out_slice.start + subset] = 1.0
        return vjp_rows(self.problem, leaves, outs, grad.unsqueeze(0))[0, self.in_slice]


def _bisect(fails: Callable[[torch.Tensor], bool], indices: torch.Tensor) -> list[int] | None:
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
