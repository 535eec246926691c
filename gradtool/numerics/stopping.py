"""Full mode told to stop at its first confirmed failure: inputs likeliest to fail first, and
the analytical rows computed output by output, only as far as the comparison gets."""

# Double backward of a backward already wrong at first order (checks/double_backward.py) needs
# one confirmed failure. Each analytical row of its Jacobian runs the user's backward again
# where G's graph passes through the Function's saved output, so rows cost as much as columns:
# rows of an output are computed only when the comparison reaches it. Numerical columns are
# evaluated as in the whole run (every output at once, kept), so an output compared later
# costs no evaluation, and a block found is the block the whole run finds.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from .compare import BlockTally
from .sparsity import SAVING, AnalyticalJacobian
from .steps import analytical_rows, chunk_size


# The drop-in's slow mode (gradcheck's fast_mode=False) stops as torch's failing slow mode
# does: torch raises at its first output whose analytical rows disagree, so gradtool needs one
# confirmed failing block, its elements, diagnosis and culprit; the others are offered with
# exhaustive=True. A pass is swept whole either way: no verdict changes.
DROPIN_SLOW = ("gradcheck's slow mode pays for a failure what torch's does (the analytical "
               "rows up to its first failing output), so the sweep stopped at its first block "
               "with a confirmed failure (gradtool.check(..., exhaustive=True), or --exhaustive "
               "on the command line, sweeps every block)")


def dropin_slow(config: Any) -> str | None:
    """Why full mode stops at its first confirmed failing block in the drop-in's slow mode
    (full mode asked for, in gradcheck's scope, not exhaustive): probe.py's dropin_cut's
    twin; None elsewhere."""
    if config.mode != "full" or not config.gradcheck_cost:
        return None
    return DROPIN_SLOW


class ByOutput:
    """The analytical Jacobian (n_out, n_in), its rows computed one output at a time; rows of
    the outputs not computed yet read NaN."""

    def __init__(self, problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                 bounds: Sequence[int]) -> None:
        self.problem, self.leaves, self.outs, self.bounds = problem, leaves, outs, bounds
        n_in = sum(v.numel() for v in leaves)
        self.jac = AnalyticalJacobian(bounds[-1], n_in, dense=torch.full(
            (bounds[-1], n_in), float("nan"), dtype=leaves[0].dtype, device=leaves[0].device),
            one_hot=True)
        self.known = 0  # outputs [0, known) computed

    @property
    def whole(self) -> bool:
        return self.known == len(self.outs)

    def more(self) -> bool:
        """Compute the next output's rows; False when every output is known already."""
        if self.whole:
            return False
        rows = torch.arange(self.bounds[self.known], self.bounds[self.known + 1],
                            device=self.jac.device)
        if len(rows):
            self.jac.dense[rows] = analytical_rows(self.problem, self.leaves, self.outs, rows)
        self.jac.vjps += len(rows)
        self.known += 1
        return True

    def too_wide(self, offset: int, size: int) -> bool:
        """Whether a known row meets more of input's columns than a colouring allows
        (sparsity.colour_columns: at most size // SAVING colours, at least the widest row's
        count): the whole pattern, a superset, colours no better, so the sweep is dense."""
        known = self.jac.dense[:self.bounds[self.known], offset:offset + size]
        return bool(len(known)) and int((known != 0).sum(1).max()) > size // SAVING


def order(n: int, first: Sequence[int]) -> list[int]:
    """Inputs `first` (those whose first-order gradient failed), then the others, each in
    order."""
    ahead = [i for i in first if 0 <= i < n]
    return ahead + [i for i in range(n) if i not in ahead]


def compare_kept(tallies: Sequence[BlockTally], jac: AnalyticalJacobian, o: int,
                 bounds: Sequence[int], offset: int, size: int,
                 kept: dict[int, tuple[torch.Tensor, torch.Tensor]], h: float) -> None:
    """Output o's block of one input from the columns its sweep kept, in the sweep's chunks
    (columns.sweep_dense), so it tallies what the sweep would have."""
    rows = slice(bounds[o], bounds[o + 1])
    step = chunk_size(bounds[-1] + size, limit=1024)
    for start in range(0, size, step):
        cols = torch.arange(start, min(size, start + step), device=jac.device)
        plus = torch.stack([kept[c][0] for c in cols.tolist()])
        minus = torch.stack([kept[c][1] for c in cols.tolist()])
        numerical = ((plus - minus) / (2 * h)).T
        analytical = jac.columns(cols + offset, numerical.dtype)
        tallies[o].add(analytical[rows], numerical[rows], cols=cols)


def scratch(tally: BlockTally) -> BlockTally:
    """A tally of the same block that nothing reads: an output whose rows are not known yet."""
    return BlockTally(tally.input, tally.input_shape, tally.output, tally.output_shape,
                      tally.atol, tally.rtol, tally.keep)


def zero_block(jac: AnalyticalJacobian, offset: int, size: int) -> bool:
    """Whether backward's whole block for an input is exactly zero (every output's rows
    known), as a backward computed from tensors without a graph gives. A failure there is
    diagnosed by that alone: a nonzero finite difference where backward says zero
    (`double_backward.untracked`, "zero for all elements"), so the columns after a confirmed
    one can add counts, never another verdict or kind of mistake, but for one: a finite
    difference not finite in a column left (`nonfinite`), a forward failing at x ± h there."""
    return not len(jac.entries(offset, offset + size)[0])


def compared_in_part(verdict: Any, problem: Any, jac: AnalyticalJacobian,
                     cut: dict[int, list[int]], kept: Sequence[dict], bounds: Sequence[int],
                     h: float) -> None:
    """Inputs whose sweep stopped at a confirmed failure before their last column: their
    compared columns kept for the diagnosis (`Verdict.partial`), their blocks marked not swept
    whole, and the cut said."""
    n_out = len(bounds) - 1
    for i, cols in cut.items():
        offset = sum(v.numel() for v in problem.inputs[:i])
        numerical = torch.stack([(kept[i][c][0] - kept[i][c][1]) / (2 * h) for c in cols], 1)
        analytical = jac.columns(torch.tensor(cols, device=numerical.device) + offset,
                                 numerical.dtype)
        for o in range(n_out):
            rows = slice(bounds[o], bounds[o + 1])
            verdict.partial[(i, o)] = (analytical[rows], numerical[rows])
            verdict.blocks[i * n_out + o] = replace(verdict.blocks[i * n_out + o],
                                                    exhaustive=False)
        verdict.details.append(
            f"compared in part: {len(cols)} of {problem.inputs[i].numel()} columns of "
            f"'{problem.input_names[i]}', up to the first confirmed failure: backward's whole "
            "block there is zero, so the other columns could add counts, a heat map and at most "
            "a non-finite difference's diagnosis, never another verdict (--exhaustive compares "
            "every column)")


def left_unchecked(verdict: Any, problem: Any, blocks: list[tuple[int, int]], stop: str) -> None:
    """Say which blocks the stop left and why; mark them not swept whole (JSON, JUnit)."""
    verdict.details.append(f"not checked: {_unchecked(problem, blocks)}, for cost: {stop}")
    n_out = len(problem.output_names)
    for i, o in blocks:
        k = i * n_out + o
        verdict.blocks[k] = replace(verdict.blocks[k], exhaustive=False)


def _unchecked(problem: Any, blocks: list[tuple[int, int]]) -> str:
    """'input(s) 'a', 'b'' wholly left, and the outputs left of an input partly compared."""
    n_out = len(problem.output_names)
    inputs = sorted({i for i, _ in blocks})
    whole = [i for i in inputs if sum(1 for k, _ in blocks if k == i) == n_out]
    parts = [f"input(s) {', '.join(repr(problem.input_names[i]) for i in whole)}"] if whole \
        else []
    for i in inputs:
        if i not in whole:
            names = [repr(problem.output_names[o]) for k, o in blocks if k == i]
            parts.append(f"{', '.join(names)} w.r.t. '{problem.input_names[i]}'")
    return " and ".join(parts)
