"""Element-wise comparison of Jacobian blocks: |a - n| <= atol + rtol * |n| (or a per-element
tolerance), the worst ones, and every failing element for a measured second look."""

from __future__ import annotations

from dataclasses import dataclass, field

import math

import torch

from ..results import Block, Element
from .bounds import admit


FLAGGED_LIMIT = 200_000  # failing elements recorded per block for a second look


@dataclass
class BlockTally:
    """Running statistics of one (input, output) block, fed chunk by chunk."""

    input: str
    input_shape: tuple[int, ...]
    output: str
    output_shape: tuple[int, ...]
    atol: float
    rtol: float
    keep: int = 5
    checked: int = 0
    mismatched: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    # (excess over tolerance, output flat index, input flat index, analytical, numerical)
    worst: list[tuple[float, int, int, float, float]] = field(default_factory=list)
    # Every failing element compared exactly, (rows, cols, analytical, numerical) per chunk,
    # for the measured tolerance's second step (numerics/measured.py); None: not recorded.
    flagged: list[tuple[torch.Tensor, ...]] | None = None
    recorded: int = 0
    # (rows, cols) of the elements the measured tolerance judged wrong (numerics/measured.py):
    # the count, the diagnosis and the heat map all read this one judgement; None: not measured
    standing: tuple[torch.Tensor, torch.Tensor] | None = None
    # The tolerance of the kink test (finite differences disagreeing across steps); the fixed
    # one even when the verdict's tolerance is measured: one-sided differences are O(h).
    kink_atol: float | None = None
    kink_rtol: float | None = None
    scale: float = 0.0  # the largest |numerical| compared
    capped: int = 0     # elements whose tolerance the door (numerics/bounds.py) cut
    # per input element (flat): the rtol of the column perturbing it (the measured first
    # bound's, numerics/measured.column_rtol); None: `rtol` for every column. `rtol` is then
    # its largest, for comparisons of sums over columns (a compressed sweep's screen).
    column_rtol: torch.Tensor | None = None

    def kink_tolerance(self, numerical: float) -> float:
        atol = self.atol if self.kink_atol is None else self.kink_atol
        rtol = self.rtol if self.kink_rtol is None else self.kink_rtol
        return atol + rtol * abs(numerical)

    def note(self, checked: int, max_abs: float) -> None:
        """Elements compared elsewhere (a compressed sweep) that all passed."""
        self.checked += checked
        self.max_abs = max(self.max_abs, max_abs)

    def add(self, analytical: torch.Tensor, numerical: torch.Tensor, col_offset: int = 0,
            cols: torch.Tensor | None = None, tol: torch.Tensor | None = None) -> None:
        """Compare a (n_out, n_cols) chunk: its columns are input elements `cols`, or
        col_offset, col_offset + 1, ... when cols is None; `tol`: per-element tolerances."""
        diff = (analytical - numerical).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
        if numerical.numel():  # the Jacobian's scale: a cancelled gradient's rounding is of it
            self.scale = max(self.scale, float(numerical.abs().nan_to_num(0, 0, 0).max()))
        if tol is None and self.column_rtol is not None and diff.numel():
            tol = self.atol + self._rtols(cols, col_offset, diff.shape[1], numerical) \
                * numerical.abs()
        tol = self.admitted(analytical, numerical, tol)
        bad = diff > tol
        self.checked += diff.numel()
        if diff.numel():
            self.max_abs = max(self.max_abs, diff.max().item())
        n_bad = int(bad.sum())
        if not n_bad:
            return
        if self.flagged is not None and self.recorded + n_bad <= FLAGGED_LIMIT:
            r, c = torch.nonzero(bad, as_tuple=True)
            col = cols[c] if cols is not None else c + col_offset
            self.flagged.append((r, col, analytical[r, c].double(), numerical[r, c].double()))
            self.recorded += n_bad
        rel = diff / numerical.abs().clamp_min(1e-300)
        self.max_rel = max(self.max_rel, torch.where(bad, rel, 0 * rel).max().item())
        self.mismatched += n_bad
        excess = torch.where(bad, diff - tol, torch.full_like(diff, -1.0)).reshape(-1)
        top = torch.topk(excess, min(self.keep, n_bad)).indices
        n_cols = diff.shape[1]
        for flat in top.tolist():
            r, c = divmod(flat, n_cols)
            col = int(cols[c]) if cols is not None else c + col_offset
            self.worst.append((excess[flat].item(), r, col,
                               analytical[r, c].item(), numerical[r, c].item()))
        self.worst = sorted(self.worst, key=lambda w: -w[0])[: self.keep]

    def _rtols(self, cols: torch.Tensor | None, col_offset: int, n_cols: int,
               numerical: torch.Tensor) -> torch.Tensor:
        """The chunk's per-column rtol (1, n_cols), in the comparison's dtype."""
        assert self.column_rtol is not None
        index = cols if cols is not None else torch.arange(
            col_offset, col_offset + n_cols, device=self.column_rtol.device)
        return self.column_rtol.to(numerical.device)[index].to(numerical.abs().dtype)[None, :]

    def admitted(self, analytical: torch.Tensor, numerical: torch.Tensor,
                 tol: torch.Tensor | None = None) -> torch.Tensor:
        """This chunk's per-element tolerance through the door (numerics/bounds.py): finite, and
        below the size of the values unless the fixed tolerance (gradcheck's, or the user's)
        allows more: the first bound's rtol read inf from a -inf input once, and passed all."""
        if tol is None:
            tol = self.atol + self.rtol * numerical.abs()
        if self.kink_atol is None or not analytical.numel():  # fixed: gradcheck's, as given
            return tol if math.isfinite(self.atol + self.rtol) else _finite(tol, numerical)
        floor = self.kink_atol + self.kink_rtol * numerical.abs().double()
        found = admit(tol, analytical, numerical, origin="the measured first bound",
                      scale=max(self.scale, float(analytical.abs().nan_to_num(0, 0, 0).max())),
                      floor=floor)
        self.capped += found.n_capped
        return found.tol.to(diff_dtype(analytical, numerical))

    def element(self, out_index: int, in_index: int, analytical: float, numerical: float,
                inconclusive: bool = False) -> Element:
        diff = abs(analytical - numerical)
        return Element(self.input, unravel(in_index, self.input_shape), self.output,
                       unravel(out_index, self.output_shape), analytical, numerical, diff,
                       diff / abs(numerical) if numerical else float("inf"), inconclusive)

    def to_block(self, elements: tuple[Element, ...] = (), diagnosis: str | None = None,
                 exhaustive: bool = True) -> Block:
        if not elements:
            elements = tuple(self.element(r, c, a, n) for _, r, c, a, n in self.worst)
        return Block(self.input, self.input_shape, self.output, self.output_shape, self.checked,
                     self.mismatched, self.max_abs, self.max_rel, elements, diagnosis, exhaustive)


def judged_mask(tally: BlockTally, analytical: torch.Tensor,
                numerical: torch.Tensor) -> torch.Tensor:
    """The block's mismatched elements as its tally judged them: the measured verdict's
    standing elements, else |a - n| > atol + rtol |n| at the tally's own tolerance."""
    if tally.standing is not None:
        mask = torch.zeros(analytical.shape, dtype=torch.bool, device=analytical.device)
        mask[tally.standing] = True
        return mask
    return ~((analytical - numerical).abs() <= tally.atol + tally.rtol * numerical.abs())


def diff_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    return torch.promote_types(a.dtype, b.dtype)


def _finite(tol: torch.Tensor, numerical: torch.Tensor) -> torch.Tensor:
    """A fixed tolerance that is not finite (rtol inf given, with |n| = 0: NaN) is taken as
    given where it is a number, and as nothing where NaN: a NaN bound never passes."""
    return torch.where(torch.isnan(tol), torch.zeros_like(tol), tol)


def unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Flat index -> multi-dimensional index (row-major, as torch stores it)."""
    out = []
    for size in reversed(shape):
        index, rem = divmod(index, size) if size else (index, 0)
        out.append(rem)
    return tuple(reversed(out))


def within(analytical: float, numerical: float, atol: float, rtol: float) -> bool:
    return abs(analytical - numerical) <= atol + rtol * abs(numerical)
