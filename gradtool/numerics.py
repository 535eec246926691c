"""The maths only: analytical and numerical Jacobians, batched where vmap allows, and probes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .problem import Problem, flat_cat, select_outputs, split_flat

CHUNK_BYTES = 32 * 2**20  # per batched call: bounds the memory of one chunk of perturbations


def chunk_size(width: int, itemsize: int = 8, limit: int = 4096) -> int:
    """How many perturbations (or VJPs) of `width` values each fit in one chunk."""
    return max(1, min(limit, CHUNK_BYTES // max(1, width * itemsize)))


# ---------------------------------------------------------------- analytical (from backward)

def analytical_rows(problem: Problem, leaves: Sequence[torch.Tensor],
                    outs: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """Rows of the analytical Jacobian: VJPs with one-hot grad_outputs, batched when possible."""
    n_out = sum(o.numel() for o in outs)
    n_in = sum(leaf.numel() for leaf in leaves)
    result = torch.empty(len(rows), n_in, dtype=leaves[0].dtype, device=leaves[0].device)
    step = chunk_size(n_out + n_in)
    for start in range(0, len(rows), step):
        idx = rows[start:start + step]
        eye = torch.zeros(len(idx), n_out, dtype=outs[0].dtype, device=outs[0].device)
        eye[torch.arange(len(idx)), idx] = 1
        result[start:start + len(idx)] = vjp_rows(problem, leaves, outs, eye)
    return result


def vjp_rows(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
             grad_rows: torch.Tensor) -> torch.Tensor:
    """vᵀJ for each row v of grad_rows (B, n_out) -> (B, n_in); falls back to a loop."""
    grads = split_flat(grad_rows, [o.shape for o in outs])
    if problem.batched_vjp_ok is not False and len(grad_rows) > 1:
        try:
            out = flat_cat(problem.vjp_batched(leaves, outs, grads), batch=True)
            problem.batched_vjp_ok = True
            return out
        except Exception:
            problem.batched_vjp_ok = False  # the user's backward is not vmap-friendly
    return torch.stack([flat_cat(problem.vjp(leaves, outs, [g[k] for g in grads]))
                        for k in range(len(grad_rows))])


# ---------------------------------------------------------------- numerical (finite differences)

def numerical_columns(problem: Problem, values: Sequence[torch.Tensor], which: int,
                      cols: torch.Tensor, h: float) -> torch.Tensor:
    """Central-difference columns of the Jacobian for elements `cols` of input `which`."""
    if problem.vmap_ok is not False:
        try:
            result = _columns_batched(problem, values, which, cols, h)
            if problem.vmap_ok is None:
                _verify_batched(problem, values, which, cols, h, result)
            return result
        except _NotBatchable:
            problem.vmap_ok = False
    return _columns_loop(problem, values, which, cols, h)


class _NotBatchable(Exception):
    pass


def _columns_loop(problem: Problem, values: Sequence[torch.Tensor], which: int,
                  cols: torch.Tensor, h: float) -> torch.Tensor:
    work = [v.detach().clone() for v in values]
    flat = work[which].view(-1)
    columns = []
    for j in cols.tolist():
        original = flat[j].item()
        flat[j] = original + h
        plus = flat_cat(problem.outputs(work))
        flat[j] = original - h
        minus = flat_cat(problem.outputs(work))
        flat[j] = original
        columns.append((plus - minus) / (2 * h))
    return torch.stack(columns, dim=1)


def _columns_batched(problem: Problem, values: Sequence[torch.Tensor], which: int,
                     cols: torch.Tensor, h: float) -> torch.Tensor:
    base = values[which].detach().reshape(-1)
    pieces = []
    for start in range(0, len(cols), chunk_size(base.numel() * 2 + 1024, limit=2048)):
        idx = cols[start:start + chunk_size(base.numel() * 2 + 1024, limit=2048)]
        batch = base.expand(2 * len(idx), -1).clone()
        rows = torch.arange(len(idx))
        batch[rows, idx] += h
        batch[rows + len(idx), idx] -= h
        out = batched_outputs(problem, values, which, batch.view(-1, *values[which].shape))
        pieces.append(((out[:len(idx)] - out[len(idx):]) / (2 * h)).T)
    return torch.cat(pieces, dim=1)


def batched_outputs(problem: Problem, values: Sequence[torch.Tensor], which: int | None,
                    batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Outputs (B, n_out) for a batch of values of input `which` (or of all inputs when None)."""
    if problem.batched_fn is None:
        raise _NotBatchable()
    positions = problem.diff if which is None else [problem.diff[which]]
    batches = list(batch) if which is None else [batch]
    args = problem.with_inputs([v.detach() for v in values])
    in_dims = tuple(0 if k in positions else None for k in range(len(args)))
    for position, b in zip(positions, batches):
        args[position] = b

    def run(*a: object) -> tuple[torch.Tensor, ...]:
        return tuple(select_outputs(problem.batched_fn(*a), problem.output_mask))

    try:
        with torch.no_grad(), problem.rng():
            problem.calls["forward"] += 1
            outs = torch.func.vmap(run, in_dims=in_dims)(*args)
    except Exception as exc:  # no vmap support: data-dependent control flow, .item(), ...
        problem.calls["forward"] -= 1
        raise _NotBatchable() from exc
    return flat_cat(outs, batch=True)


def _verify_batched(problem: Problem, values: Sequence[torch.Tensor], which: int,
                    cols: torch.Tensor, h: float, batched: torch.Tensor) -> None:
    """Trust vmap only once it agrees with plain calls (a forward may behave differently)."""
    loop = _columns_loop(problem, values, which, cols[:1], h)
    scale = loop.abs().max().item() + 1.0
    if not torch.allclose(loop[:, 0], batched[:, 0], rtol=1e-7, atol=1e-9 * scale):
        problem.vmap_ok = False
        raise _NotBatchable()
    problem.vmap_ok = True


# ---------------------------------------------------------------- directional (probes)

def directional(problem: Problem, values: Sequence[torch.Tensor],
                directions: Sequence[Sequence[torch.Tensor]], h: float) -> torch.Tensor:
    """Central differences along each direction at steps h and 2h: (2, K, n_out)."""
    k = len(directions)
    factors = torch.tensor([h, -h, 2 * h, -2 * h], dtype=values[0].dtype)
    if problem.vmap_ok is not False and problem.batched_fn is not None:
        try:
            out = _directional_batched(problem, values, directions, factors)
            problem.vmap_ok = True if problem.vmap_ok is None else problem.vmap_ok
            return _differences(out.view(4, k, -1), h)
        except _NotBatchable:
            problem.vmap_ok = False
    rows = []
    for f in factors.tolist():
        for u in directions:
            rows.append(flat_cat(problem.outputs([v + f * d for v, d in zip(values, u)])))
    return _differences(torch.stack(rows).view(4, k, -1), h)


def _directional_batched(problem: Problem, values: Sequence[torch.Tensor],
                         directions: Sequence[Sequence[torch.Tensor]],
                         factors: torch.Tensor) -> torch.Tensor:
    batches = []
    for i, v in enumerate(values):
        u = torch.stack([d[i] for d in directions])                  # (K, *shape)
        f = factors.view(4, 1, *([1] * v.dim()))
        batches.append((v.detach().unsqueeze(0) + f * u.unsqueeze(0)).reshape(-1, *v.shape))
    return batched_outputs(problem, values, None, batches)


def _differences(out: torch.Tensor, h: float) -> torch.Tensor:
    d_h = (out[0] - out[1]) / (2 * h)
    d_2h = (out[2] - out[3]) / (4 * h)
    return torch.stack([d_h, d_2h])


def one_sided(problem: Problem, values: Sequence[torch.Tensor], which: int, col: int,
              h: float) -> dict[str, torch.Tensor]:
    """Derivative estimates of one column by several formulas and steps (kink detection)."""
    work = [v.detach().clone() for v in values]
    flat = work[which].view(-1)
    original = flat[col].item()

    def at(delta: float) -> torch.Tensor:
        flat[col] = original + delta
        out = flat_cat(problem.outputs(work))
        flat[col] = original
        return out

    f0, plus, minus = at(0.0), at(h), at(-h)
    plus10, minus10 = at(10 * h), at(-10 * h)
    return {
        "right": (plus - f0) / h,
        "left": (f0 - minus) / h,
        "central": (plus - minus) / (2 * h),
        "central x10": (plus10 - minus10) / (20 * h),
    }
