"""A failing block's |analytical - numerical| downsampled to a small grid for heat maps."""

from __future__ import annotations

import math

import torch

from ..results import ErrorGrid

MAX_CELLS = 64  # per side: a 64 x 64 map shows a pattern and keeps a page small


def error_grid(analytical: torch.Tensor, numerical: torch.Tensor, atol: float, rtol: float,
               max_cells: int = MAX_CELLS, bad: torch.Tensor | None = None) -> ErrorGrid:
    """The (n_out, n_in) block's errors, max-pooled over tiles so at most max_cells a side
    remain: a single wrong element still shows in its cell (a mean would dilute it). `bad`:
    the elements the verdict judged wrong (else those beyond atol + rtol |n|)."""
    a = analytical.detach().to(torch.float64).cpu()
    n = numerical.detach().to(torch.float64).cpu()
    diff = (a - n).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    # Relative to |numerical|, floored at atol: exact zeros (most of a sparse block) stay 0.
    rel = diff / n.abs().clamp_min(max(atol, 1e-300))
    bad = (diff > atol + rtol * n.abs() if bad is None else bad).to(torch.float64)
    n_rows, n_cols = diff.shape
    row_tile, col_tile = math.ceil(n_rows / max_cells), math.ceil(n_cols / max_cells)
    return ErrorGrid(n_rows, n_cols, row_tile, col_tile,
                     _rows(_pool(diff, row_tile, col_tile, "max")),
                     _rows(_pool(rel, row_tile, col_tile, "max")),
                     tuple(map(tuple, _pool(bad, row_tile, col_tile, "sum").long().tolist())))


def _pool(values: torch.Tensor, row_tile: int, col_tile: int, how: str) -> torch.Tensor:
    """Reduce each row_tile x col_tile tile (the last ones may be partial: padded with 0,
    which changes neither a max of non-negative values nor a sum)."""
    n_rows, n_cols = values.shape
    rows, cols = math.ceil(n_rows / row_tile), math.ceil(n_cols / col_tile)
    padded = torch.zeros(rows * row_tile, cols * col_tile, dtype=values.dtype, device=values.device)
    padded[:n_rows, :n_cols] = values
    tiles = padded.reshape(rows, row_tile, cols, col_tile)
    return tiles.amax(dim=(1, 3)) if how == "max" else tiles.sum(dim=(1, 3))


def _rows(values: torch.Tensor) -> tuple[tuple[float, ...], ...]:
    # Three significant digits are all a colour scale can show; they keep the JSON small.
    # One format string per row, not an f-string per cell: the same "%.3g" rounding in a sixth
    # less time (a failing double backward's 60 x 60 block is two 3,600-cell maps).
    return tuple(tuple(map(float, ("%.3g " * len(row) % tuple(row)).split()))
                 for row in values.tolist())
