"""Sparse Jacobians: analytical rows recovered from grouped VJPs, and column colourings."""

# Most Jacobians are sparse (elementwise ops, linear layers, convolutions), and full mode then
# wastes its time pushing one-hot vectors through dense matrix products. Here a group of output
# rows is pushed through backward at once, twice: with weights t (random, distinct, in [1, 2))
# and with weights 1. Where one row alone reaches a column j, the ratio of the two results is
# exactly that row's t (to rounding): the row is named and the value is the weight-1 result,
# bit-for-bit what a one-hot VJP gives. Where two rows reach j, the ratio matches no row and the
# group falls back to one-hot VJPs. So grouping can only cost time, never correctness.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .problem import Problem
from .steps import analytical_rows, chunk_size, vjp_rows

RATIO_RTOL = 1e-13   # single-contributor ratios agree to a few ulps; mixtures miss by far more
MIN_ROWS = 64        # outputs smaller than this take one-hot rows: cheaper than a search
SAVING = 8           # group rows or columns only when that cuts the evaluations 8-fold or more


@dataclass
class AnalyticalJacobian:
    """The analytical Jacobian (n_out, n_in): dense, or its nonzero entries sorted by column."""

    n_out: int
    n_in: int
    dense: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    cols: torch.Tensor | None = None
    vals: torch.Tensor | None = None
    vjps: int = 0           # one-hot-equivalent rows it took (for reports and tests)
    one_hot: bool = False   # every row a backward at a one-hot grad_output (none decoded)

    @property
    def device(self) -> torch.device:
        return (self.dense if self.dense is not None else self.vals).device

    @property
    def sparse(self) -> bool:
        return self.dense is None

    def entries(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, cols - start, values) of the nonzeros in columns [start, stop)."""
        if self.dense is not None:
            rows, cols = torch.nonzero(self.dense[:, start:stop], as_tuple=True)
            return rows, cols, self.dense[:, start:stop][rows, cols]
        lo, hi = torch.searchsorted(self.cols, torch.tensor([start, stop], device=self.cols.device)
                                  ).tolist()
        return self.rows[lo:hi], self.cols[lo:hi] - start, self.vals[lo:hi]

    def row(self, r: int, start: int, stop: int) -> torch.Tensor:
        """Row r over columns [start, stop), dense."""
        if self.dense is not None:
            return self.dense[r, start:stop]
        rows, cols, vals = self.entries(start, stop)
        out = torch.zeros(stop - start, dtype=self.vals.dtype, device=self.vals.device)
        out[cols[rows == r]] = vals[rows == r]
        return out

    def columns(self, cols: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dense columns (n_out, len(cols))."""
        if self.dense is not None:
            return self.dense[:, cols]
        out = torch.zeros(self.n_out, len(cols), dtype=dtype, device=self.vals.device)
        if len(cols) == 0:
            return out
        where = torch.full((self.n_in,), -1, dtype=torch.long, device=self.cols.device)
        where[cols] = torch.arange(len(cols), device=self.cols.device)
        lo, hi = torch.searchsorted(self.cols, torch.stack([cols.min(), cols.max() + 1])).tolist()
        pos = where[self.cols[lo:hi]]
        keep = pos >= 0
        out[self.rows[lo:hi][keep], pos[keep]] = self.vals[lo:hi][keep]
        return out


Strides = list  # per output: the row stride m of its groups {g, g+m, ...}, or None (one-hot)


def analytical_jacobian(problem: Problem, leaves: Sequence[torch.Tensor],
                        outs: Sequence[torch.Tensor], strides: Strides | None = None,
                        trials: Trials | None = None) -> AnalyticalJacobian:
    """Grouped VJPs for the outputs whose rows group cleanly (strides given, or searched for),
    one-hot rows for the others. `trials`: groups the search decoded already."""
    n_out = sum(o.numel() for o in outs)
    n_in = sum(v.numel() for v in leaves)
    if strides is None:
        strides, trials = find_strides(problem, leaves, outs)
    if not any(strides):
        dense = analytical_rows(problem, leaves, outs, torch.arange(n_out, device=outs[0].device))
        return AnalyticalJacobian(n_out, n_in, dense=dense, vjps=n_out, one_hot=True)
    return _grouped(problem, leaves, outs, strides, trials or {})


Trials = dict  # output index -> (groups decoded while searching, their _Decoded)


def find_strides(problem: Problem, leaves: Sequence[torch.Tensor],
                 outs: Sequence[torch.Tensor]) -> tuple[Strides, Trials]:
    """Per output, the first candidate stride whose sample groups decode cleanly."""
    found: Strides = []
    trials: Trials = {}
    offset = 0
    float64 = all(t.dtype == torch.float64 for t in [*leaves, *outs])
    for o, out in enumerate(outs):
        n = out.numel()
        stride = None
        for m in row_strides(n, tuple(out.shape)) if float64 and n >= MIN_ROWS else []:
            groups = sorted({0, m // 2, m - 1})
            decoded = _decode_groups(problem, leaves, outs,
                                     _members(offset, n, m, groups, out.device))
            if not decoded.collided:
                stride, trials[o] = m, (groups, decoded)
                break
        found.append(stride)
        offset += n
    return found, trials


def row_strides(n: int, shape: tuple[int, ...]) -> list[int]:
    """Candidate strides up to n / 8: 1 (diagonal patterns), then every dimension and trailing
    size +- 1 (Latin-square diagonals of matmul-like patterns), then 2^k + 1 (odd, so they mix
    with power-of-two sizes). Each costs one trial, so the likely ones go first."""
    shaped = set()
    size = 1
    for dim in reversed(shape):
        size *= dim
        shaped.update({dim - 1, dim + 1, size - 1, size + 1})
    powers = {2 ** k + 1 for k in range(1, max(1, n // SAVING).bit_length() + 1)}
    ordered = [1] + sorted(shaped - {1}) + sorted(powers - shaped - {1})
    return [m for m in ordered if 1 <= m <= n // SAVING]


def _members(offset: int, n: int, m: int, groups: Sequence[int], device: torch.device
             ) -> torch.Tensor:
    """(len(groups), ceil(n / m)) flat rows of each group, -1 past the output's end."""
    t = torch.arange((n + m - 1) // m, device=device)
    local = torch.tensor(list(groups), device=device)[:, None] + m * t[None, :]
    return torch.where(local < n, local + offset, torch.full_like(local, -1))


@dataclass
class _Decoded:
    rows: list[torch.Tensor]
    cols: list[torch.Tensor]
    vals: list[torch.Tensor]
    collided: list[torch.Tensor]   # the member rows of each group that did not decode


def _weights(n_out: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(20240607)  # drawn on the CPU: the same on every device
    return 1.0 + torch.rand(n_out, generator=gen, dtype=torch.float64, device="cpu").to(device)


def _decode_groups(problem: Problem, leaves: Sequence[torch.Tensor],
                   outs: Sequence[torch.Tensor], members: torch.Tensor) -> _Decoded:
    """Push each group of rows (a row of `members`, -1 = none) through backward with weights t
    and with weights 1, and decode."""
    n_out = sum(o.numel() for o in outs)
    n_in = sum(v.numel() for v in leaves)
    device = outs[0].device
    t = _weights(n_out, device)
    decoded = _Decoded([], [], [], [])
    # Each group costs two VJP rows and ~8 (n_in)-sized temporaries while decoding.
    step = max(1, chunk_size(8 * n_in + 2 * n_out) // 2)
    for start in range(0, len(members), step):
        chunk = members[start:start + step]
        valid = chunk >= 0
        safe = chunk.clamp(min=0)
        weights = torch.where(valid, t[safe], torch.zeros((), dtype=t.dtype, device=device))
        grads = torch.zeros(2 * len(chunk), n_out, dtype=outs[0].dtype, device=device)
        rows_k = torch.arange(len(chunk), device=device)[:, None].expand_as(chunk)
        grads[rows_k[valid], chunk[valid]] = weights[valid].to(grads.dtype)
        grads[len(chunk) + rows_k[valid], chunk[valid]] = 1.0
        result = vjp_rows(problem, leaves, outs, grads)
        _decode(result[:len(chunk)], result[len(chunk):], safe, valid, weights, decoded)
    return decoded


def _decode(v_t: torch.Tensor, v_1: torch.Tensor, members: torch.Tensor, valid: torch.Tensor,
            weights: torch.Tensor, out: _Decoded) -> None:
    """Name the single row behind each nonzero column of each group, or mark the group."""
    ratio = torch.where(v_1 != 0, v_t / v_1, torch.full_like(v_t, float("nan")))
    key = torch.where(valid, weights, torch.full_like(weights, float("inf")))
    sorted_t, order = torch.sort(key, dim=1)
    pos = torch.searchsorted(sorted_t, ratio.nan_to_num(nan=-1.0).contiguous())
    best = torch.zeros_like(pos)
    best_err = torch.full_like(ratio, float("inf"))
    for cand in (pos - 1, pos):
        cand = cand.clamp(0, sorted_t.shape[1] - 1)
        err = (torch.gather(sorted_t, 1, cand) - ratio).abs()
        better = err < best_err
        best = torch.where(better, cand, best)
        best_err = torch.where(better, err, best_err)
    nonzero = (v_t != 0) | (v_1 != 0)
    matched = best_err <= RATIO_RTOL * ratio.abs()
    bad = (nonzero & ~matched).any(dim=1)
    good = nonzero & matched & ~bad[:, None]
    g_idx, cols = torch.nonzero(good, as_tuple=True)
    rows = members.gather(1, order.gather(1, best))[g_idx, cols]
    out.rows.append(rows)
    out.cols.append(cols)
    out.vals.append(v_1[g_idx, cols])
    out.collided.extend(members[k][valid[k]] for k in torch.nonzero(bad).reshape(-1).tolist())


def _grouped(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
             strides: Strides, trials: Trials) -> AnalyticalJacobian:
    n_out = sum(o.numel() for o in outs)
    n_in = sum(v.numel() for v in leaves)
    groups, one_hot, offset, vjps = [], [], 0, 0
    decoded = _Decoded([], [], [], [])
    for o, (out, m) in enumerate(zip(outs, strides)):
        n = out.numel()
        if m:
            done, found = trials.get(o, ([], None))
            if found is not None:  # groups the stride search decoded already
                for mine, theirs in ((decoded.rows, found.rows), (decoded.cols, found.cols),
                                     (decoded.vals, found.vals),
                                     (decoded.collided, found.collided)):
                    mine.extend(theirs)
            rest = [g for g in range(m) if g not in set(done)]
            if rest:
                groups.append(_members(offset, n, m, rest, out.device))
            vjps += 2 * m
        else:
            one_hot.append(torch.arange(offset, offset + n, device=out.device))
        offset += n
    if groups:
        width = max(g.shape[1] for g in groups)
        members = torch.cat([torch.nn.functional.pad(g, (0, width - g.shape[1]), value=-1)
                             for g in groups])
        more = _decode_groups(problem, leaves, outs, members)
        for mine, theirs in ((decoded.rows, more.rows), (decoded.cols, more.cols),
                             (decoded.vals, more.vals), (decoded.collided, more.collided)):
            mine.extend(theirs)
    vjps += _one_hot_rows(problem, leaves, outs, one_hot + decoded.collided, decoded)
    device = outs[0].device
    rows_t, cols_t, vals_t = (torch.cat(x) if x else torch.zeros(0, dtype=d, device=device)
                              for x, d in ((decoded.rows, torch.long), (decoded.cols, torch.long),
                                           (decoded.vals, outs[0].dtype)))
    cols_t, order = torch.sort(cols_t, stable=True)
    return AnalyticalJacobian(n_out, n_in, rows=rows_t[order], cols=cols_t, vals=vals_t[order],
                              vjps=vjps)


def _one_hot_rows(problem: Problem, leaves: Sequence[torch.Tensor],
                  outs: Sequence[torch.Tensor], pieces: list[torch.Tensor],
                  decoded: _Decoded) -> int:
    """Outputs without a grouping, and groups that collided: plain one-hot VJPs."""
    if not pieces:
        return 0
    rows = torch.cat(pieces)
    step = chunk_size(sum(o.numel() for o in outs) + sum(v.numel() for v in leaves))
    for start in range(0, len(rows), step):
        idx = rows[start:start + step]
        dense = analytical_rows(problem, leaves, outs, idx)
        r, c = torch.nonzero(dense, as_tuple=True)
        decoded.rows.append(idx[r])
        decoded.cols.append(c)
        decoded.vals.append(dense[r, c])
    return len(rows)


# ---------------------------------------------------------------- column colourings

def colour_columns(rows: torch.Tensor, cols: torch.Tensor, n_out: int,
                   shape: Sequence[int]) -> torch.Tensor | None:
    """A colour per input element such that no output row meets two columns of one colour
    (in the analytical pattern), with few colours; None when none saves enough."""
    n_cols = 1
    for dim in shape:
        n_cols *= int(dim)
    if len(rows) == 0:
        return torch.zeros(n_cols, dtype=torch.long, device=rows.device)
    low = int(torch.bincount(rows, minlength=n_out).max())
    limit = n_cols // SAVING
    index = torch.arange(n_cols, device=rows.device)
    for m in _colour_counts(low, shape, limit):
        for colour in _candidates(index, m, shape):
            if _proper(rows, colour[cols], m, n_out):
                return colour
    return None


def _colour_counts(low: int, shape: Sequence[int], limit: int) -> list[int]:
    found = {low, low + 1, low + 2}
    for k in (2, 4):
        found.update({k * low - 1, k * low, k * low + 1})
    size = 1
    for dim in reversed(shape):
        size *= int(dim)
        found.update({size - 1, size, size + 1})
    return sorted(m for m in found if low <= m <= limit and m >= 1)


def _candidates(index: torch.Tensor, m: int, shape: Sequence[int]) -> list[torch.Tensor]:
    """j mod m (contiguous supports), and (j // last dim) mod m (supports down a column)."""
    out = [index % m]
    if len(shape) >= 2 and int(shape[-1]) > 1:
        out.append((index // int(shape[-1])) % m)
    return out


def _proper(rows: torch.Tensor, colours: torch.Tensor, m: int, n_out: int) -> bool:
    key = rows * m + colours
    if n_out * m <= 2 ** 26:
        return int(torch.bincount(key, minlength=n_out * m).max()) <= 1
    return int(torch.unique(key).numel()) == len(key)
