"""Jacobian comparison engine: full mode (every element) and probe mode (random projections)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .compare import BlockTally
from .config import CheckConfig
from .numerics import analytical_rows, numerical_columns, one_sided, vjp_rows
from .problem import Problem, output_names
from .results import Block, Outcome

# A reference gives the intended VJP rows (B, n_out) -> (B, n_in) instead of finite differences.
Reference = Callable[[torch.Tensor], torch.Tensor]
DENSE_LIMIT = 2_000_000  # keep whole blocks for diagnosis up to this many elements
FINITE_MACHINE = {torch.float64: 2.2e-16, torch.float32: 1.2e-7, torch.float16: 9.8e-4,
                  torch.bfloat16: 7.8e-3}


@dataclass
class Verdict:
    """What the engine found: an outcome, one Block per (input, output) pair, and how."""

    outcome: Outcome
    blocks: list[Block]
    mode: str
    mode_reason: str
    details: list[str] = field(default_factory=list)
    dense: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def prime(problem: Problem) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the forward once with a graph; fix which outputs are differentiable and their names."""
    problem.output_mask = None
    leaves, outs = problem.graph()
    problem.output_mask = [o.is_floating_point() or o.is_complex() for o in outs]
    labels = problem.output_labels or output_names(len(outs))
    problem.output_names = [n for n, keep in zip(labels, problem.output_mask) if keep]
    return leaves, [o for o, keep in zip(outs, problem.output_mask) if keep]


def choose_mode(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                outs: Sequence[torch.Tensor]) -> tuple[str, str]:
    """full while predicted to take about config.full_budget_s and fit in memory, else probe."""
    n_in = sum(v.numel() for v in leaves)
    n_out = sum(o.numel() for o in outs)
    memory = 8.0 * n_in * n_out
    if config.mode != "auto":
        if config.mode == "full" and memory > config.max_memory:
            raise MemoryError(f"full mode needs ~{_bytes(memory)} for the Jacobian "
                              f"({n_out} x {n_in}), above --max-memory {_bytes(config.max_memory)}")
        return config.mode, f"--mode {config.mode}"
    if memory > config.max_memory:
        return "probe", f"the {n_out} x {n_in} Jacobian needs ~{_bytes(memory)}"
    seconds = _predict_full_seconds(problem, leaves, outs, n_in, n_out)
    if seconds <= config.full_budget_s:
        return "full", f"{n_out} x {n_in} Jacobian, predicted {seconds:.2g} s"
    return "probe", f"full mode predicted {seconds:.2g} s for a {n_out} x {n_in} Jacobian"


def _predict_full_seconds(problem: Problem, leaves: Sequence[torch.Tensor],
                          outs: Sequence[torch.Tensor], n_in: int, n_out: int) -> float:
    sample_cols = torch.arange(min(16, leaves[0].numel()))
    start = time.perf_counter()
    numerical_columns(problem, problem.inputs, 0, sample_cols, 1e-6)
    per_col = (time.perf_counter() - start) / max(1, len(sample_cols))
    rows = torch.arange(min(16, n_out))
    start = time.perf_counter()
    analytical_rows(problem, leaves, outs, rows)
    per_row = (time.perf_counter() - start) / max(1, len(rows))
    return per_col * n_in + per_row * n_out + 2e-9 * n_in * n_out


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TB"


def check_full(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
               outs: Sequence[torch.Tensor], reference: Reference | None, reason: str) -> Verdict:
    """Every element: analytical rows once, numerical (or reference) columns chunk by chunk."""
    atol, rtol, h = config.tolerance("atol"), config.tolerance("rtol"), config.tolerance("eps")
    n_out = sum(o.numel() for o in outs)
    in_sizes = [v.numel() for v in leaves]
    out_sizes = [o.numel() for o in outs]
    analytical = analytical_rows(problem, leaves, outs, torch.arange(n_out))
    expected = reference(torch.eye(n_out, dtype=outs[0].dtype)) if reference else None
    tallies = _tallies(problem, leaves, outs, atol, rtol, config.max_worst)
    dense = {}
    keep_dense = n_out * sum(in_sizes) <= DENSE_LIMIT
    in_off = 0
    for i, size in enumerate(in_sizes):
        cols_all = torch.arange(size)
        if expected is not None:
            numerical = expected[:, in_off:in_off + size]
        else:
            numerical = numerical_columns(problem, problem.inputs, i, cols_all, h)
        block_a = analytical[:, in_off:in_off + size]
        out_off = 0
        for o, out_size in enumerate(out_sizes):
            rows = slice(out_off, out_off + out_size)
            tallies[i][o].add(block_a[rows], numerical[rows])
            if keep_dense:
                dense[(i, o)] = (block_a[rows].clone(), numerical[rows].clone())
            out_off += out_size
        in_off += size
    verdict = _finish(problem, config, tallies, reference is not None, "full", reason)
    verdict.dense = dense
    return verdict


def _tallies(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
             atol: float, rtol: float, keep: int) -> list[list[BlockTally]]:
    return [[BlockTally(name, tuple(v.shape), oname, tuple(o.shape), atol, rtol, keep)
             for oname, o in zip(problem.output_names, outs)]
            for name, v in zip(problem.input_names, leaves)]


def _finish(problem: Problem, config: CheckConfig, tallies: list[list[BlockTally]],
            has_reference: bool, mode: str, reason: str) -> Verdict:
    """Re-estimate failing elements with other steps: disagreement means inconclusive."""
    blocks, outcomes, details = [], [], []
    for i, row in enumerate(tallies):
        for o, tally in enumerate(row):
            if not tally.mismatched:
                blocks.append(tally.to_block())
                continue
            offset = sum(math.prod(t.output_shape) for t in row[:o])
            elements, inconclusive = _confirm(problem, config, tally, i, offset, has_reference)
            blocks.append(tally.to_block(tuple(elements)))
            outcomes.append(Outcome.INCONCLUSIVE if inconclusive else Outcome.FAILED)
            if inconclusive:
                details.append(_kink_note(tally, elements))
    outcome = Outcome.PASSED
    if outcomes:
        outcome = Outcome.FAILED if Outcome.FAILED in outcomes else Outcome.INCONCLUSIVE
    return Verdict(outcome, blocks, mode, reason, details)


def _confirm(problem: Problem, config: CheckConfig, tally: BlockTally, i: int, out_offset: int,
             has_reference: bool) -> tuple[list, bool]:
    """Worst elements, each marked inconclusive when finite differences disagree there."""
    elements = []
    if has_reference:  # a declared surrogate is exact: nothing to re-estimate
        return [tally.element(r, c, a, n) for _, r, c, a, n in tally.worst], False
    h = config.tolerance("eps")
    cache: dict[int, dict[str, torch.Tensor]] = {}
    for _, r, c, a, n in tally.worst:
        if c not in cache:
            cache[c] = one_sided(problem, problem.inputs, i, c, h)
        estimates = [e[out_offset + r].item() for e in cache[c].values()]
        spread = max(estimates) - min(estimates)
        shaky = not math.isfinite(spread) or spread > tally.atol + tally.rtol * abs(n)
        elements.append(tally.element(r, c, a, n, inconclusive=shaky))
    return elements, all(e.inconclusive for e in elements)


def _kink_note(tally: BlockTally, elements: Sequence) -> str:
    where = ", ".join(f"{tally.input}{list(e.input_index)}" for e in elements[:3])
    return (f"inconclusive: finite differences disagree across step sizes at {where} — "
            f"a non-differentiable point (kink, tie) near the input; try --resample")
