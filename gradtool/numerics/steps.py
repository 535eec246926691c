"""The maths only: analytical and numerical Jacobians, batched where vmap allows, and probes."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..tracebacks import calls_user_code
from .placement import same_devices
from .batching import quiet_batching
from .bounds import finite_max
from .handed import served_vjps
from .problem import Problem, flat_cat, select_outputs, split_flat
from .transforms import vmap

# Per batched call. Kept under glibc's 32 MB mmap ceiling: bigger buffers are mmapped afresh on
# every call and their page faults cost more than the arithmetic (measured: 0.6 GB/s vs 10).
CHUNK_BYTES = 16 * 2**20
LOOP_MAX = 8  # batches this small run as plain calls: vmap's fixed ~100 µs costs more
FINITE_MACHINE = {torch.float64: 2.2e-16, torch.float32: 1.2e-7, torch.float16: 9.8e-4,
                  torch.bfloat16: 7.8e-3}


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
        result[start:start + len(idx)] = vjp_rows(problem, leaves, outs, one_hot(idx, n_out, outs))
    return result


def one_hot(idx: torch.Tensor, n_out: int, outs: Sequence[torch.Tensor]) -> torch.Tensor:
    eye = torch.zeros(len(idx), n_out, dtype=outs[0].dtype, device=outs[0].device)
    eye[torch.arange(len(idx), device=eye.device), idx] = 1
    return eye


def vjp_rows(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
             grad_rows: torch.Tensor) -> torch.Tensor:
    """vᵀJ for each row v of grad_rows (B, n_out) -> (B, n_in); falls back to a loop."""
    grads = split_flat(grad_rows, [o.shape for o in outs])
    kept = served_vjps(leaves, outs, grads)
    if kept is not None:  # the drop-in's lean path ran them through this graph (handed.py)
        return torch.stack([flat_cat(k) for k in kept])
    # vmap batches no sparse tensor, and a sparse argument's rebuild hands its gradient back
    # sparse: the attempt would always fail, after a backward of the user's.
    if not problem.sparse and problem.cache.batched_vjp_ok is not False \
            and len(grad_rows) > LOOP_MAX // 2:
        if problem.cache.batched_vjp_ok is None and len(grad_rows) > LOOP_MAX + 1:
            return _trial(problem, leaves, outs, grad_rows)
        try:
            out = flat_cat(problem.vjp_batched(leaves, outs, grads), batch=True)
            problem.cache.batched_vjp_ok = True
            return out
        except Exception:
            problem.cache.batched_vjp_ok = False  # the user's backward is not vmap-friendly
    return torch.stack([flat_cat(problem.vjp(leaves, outs, [g[k] for g in grads]))
                        for k in range(len(grad_rows))])


def _trial(problem: Problem, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
           grad_rows: torch.Tensor) -> torch.Tensor:
    """vjp_rows the first time a problem's rows could batch: one row plain, the next LOOP_MAX
    batched, both timed; batching is kept only where it costs no more per row. vmap runs an op
    without a batching rule (a custom Function's Python backward) row by row through its
    fallback, several times a plain call's cost: 20x a plain loop on a symmetric eigensolver's
    double backward (xitorch's symeig)."""
    import time

    problem.cache.batched_vjp_ok = False
    start = time.perf_counter()
    first = vjp_rows(problem, leaves, outs, grad_rows[:1])
    plain = time.perf_counter() - start
    problem.cache.batched_vjp_ok = True
    start = time.perf_counter()
    batch = vjp_rows(problem, leaves, outs, grad_rows[1:LOOP_MAX + 1])
    if problem.cache.batched_vjp_ok:  # False: it raised, and ran as plain calls
        problem.cache.batched_vjp_ok = time.perf_counter() - start <= LOOP_MAX * plain
    rest = vjp_rows(problem, leaves, outs, grad_rows[LOOP_MAX + 1:])
    return torch.cat([first, batch, rest])


# ---------------------------------------------------------------- numerical (finite differences)

def numerical_columns(problem: Problem, values: Sequence[torch.Tensor], which: int,
                      cols: torch.Tensor, h: float) -> torch.Tensor:
    """Central-difference columns (n_out, len(cols)) for elements `cols` of input `which`."""
    eye = torch.zeros(len(cols), values[which].numel(), dtype=values[which].dtype,
                      device=values[which].device)
    eye[torch.arange(len(cols), device=eye.device), cols] = 1
    return central(problem, values, which, eye, h).T


def central(problem: Problem, values: Sequence[torch.Tensor], which: int,
            directions: torch.Tensor, h: float) -> torch.Tensor:
    """(f(x + h d) - f(x - h d)) / 2h for each row d of directions (D, n_which) -> (D, n_out)."""
    base = values[which].detach().reshape(-1)
    pieces = []
    width = 2 * (base.numel() + sum(v.numel() for v in values))
    step = chunk_size(width, limit=2048)
    for start in range(0, len(directions), step):
        d = directions[start:start + step] * h
        batch = torch.cat([base + d, base - d])
        out = outputs_of(problem, values, which, batch.view(-1, *values[which].shape))
        pieces.append((out[:len(d)] - out[len(d):]) / (2 * h))
    return torch.cat(pieces)


def outputs_of(problem: Problem, values: Sequence[torch.Tensor], which: int,
               batch: torch.Tensor) -> torch.Tensor:
    """Flat outputs (B, n_out) for a batch of values of input `which`: vmap, else a loop."""
    if problem.cache.vmap_ok is not False and len(batch) > LOOP_MAX:
        try:
            return batched_outputs(problem, values, which, batch)
        except _NotBatchable:
            problem.cache.vmap_ok = False
    rows = []
    for member in batch:
        work = list(values)
        work[which] = member
        rows.append(flat_cat(problem.outputs(work)))
    return torch.stack(rows)


class _NotBatchable(Exception):
    pass


def batched_outputs(problem: Problem, values: Sequence[torch.Tensor], which: int | None,
                    batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Outputs (B, n_out) for a batch of values of input `which` (or of all inputs when None)."""
    if problem.batched_fn is None:
        raise _NotBatchable()
    positions = problem.diff if which is None else [problem.diff[which]]
    batches = list(batch) if which is None else [batch]
    same_devices(batches, [problem.args[p] for p in positions], "batch of input")
    args = problem.with_inputs([v.detach() for v in values])
    in_dims = tuple(0 if k in positions else None for k in range(len(args)))
    for position, b in zip(positions, batches):
        args[position] = b

    @calls_user_code
    def run(*a: object) -> tuple[torch.Tensor, ...]:
        return tuple(o.detach() for o in select_outputs(problem.batched_fn(*a),
                                                        problem.output_mask))

    size = int(batches[0].shape[0])
    start = time.perf_counter()
    try:
        with torch.no_grad(), problem.rng(), quiet_batching():
            outs = flat_cat(vmap(run, in_dims=in_dims)(*args), batch=True)
    except Exception as exc:  # no vmap support: data-dependent control flow, .item(), ...
        raise _NotBatchable() from exc
    batched_s = time.perf_counter() - start
    problem.calls["forward"] += size
    if which not in problem.cache.vmap_checked:
        # The last of the batch: a batching rule that reuses the first element's values for
        # all (torch's _cdist_backward under vmap, for a batched grad_output) agrees there only.
        plain_s = _verify_batched(problem, values, which, [b[-1] for b in batches], outs[-1])
        problem.cache.vmap_checked.add(which)
        problem.cache.vmap_ok = _worth_batching(problem, size, batched_s, plain_s)
    return outs


# A first batched call may cost more than the loop it replaces: a target that compiles for
# each new input shape (numba, torch.compile, Triton autotuning) compiles again for the
# batched shapes. Beyond this factor over the loop, and this many seconds, batching is dropped.
BATCH_WORSE, BATCH_FLOOR_S = 2.0, 0.05


def _worth_batching(problem: Problem, size: int, batched_s: float, plain_s: float) -> bool:
    """Whether batching pays: the first batched call against `size` plain calls timed on the
    same values; when not, every later evaluation is a plain call, and the mode says why."""
    loop_s = size * plain_s
    if batched_s <= BATCH_WORSE * loop_s + BATCH_FLOOR_S:
        return True
    problem.cache.unbatched = (f"batching dropped: the first batched call of {size} "
                               f"evaluations took {batched_s:.2g} s against {plain_s:.2g} s for "
                               "one plain call (a target compiling for each new input shape), "
                               "so every evaluation is a plain call")
    return False


def _verify_batched(problem: Problem, values: Sequence[torch.Tensor], which: int | None,
                    element: Sequence[torch.Tensor], batched: torch.Tensor) -> float:
    """Trust vmap only where it agrees with a plain call (a forward may behave differently);
    the plain call's seconds."""
    work = list(element) if which is None else list(values)
    if which is not None:
        work[which] = element[0]
    start = time.perf_counter()
    plain = flat_cat(problem.outputs(work))
    seconds = time.perf_counter() - start
    scale = finite_max(plain)  # a NaN or inf output made atol NaN: torch raised, internal
    if not torch.allclose(plain, batched, rtol=1e-10, atol=1e-12 * (scale + 1.0)):
        problem.cache.vmap_ok = False
        raise _NotBatchable()
    return seconds


# ---------------------------------------------------------------- directional (probes)

def directional(problem: Problem, values: Sequence[torch.Tensor],
                directions: Sequence[Sequence[torch.Tensor]], h: float,
                f0: torch.Tensor | None = None,
                known: Sequence[Sequence[torch.Tensor]] = ()) -> torch.Tensor:
    """Two estimates of J u for each direction u: (2, K, n_out). Row 0 is the central
    difference at h; row 1 an estimate whose truncation error is 4x row 0's (the central
    difference at 2h), so row 0 + (row 0 - row 1) / 3 is a Richardson estimate and their gap
    measures the error. With f0 = f(x) known, it takes 3 evaluations, at x + h, x - h, x + 2h:
    (f(x+2h) - 2 f(x+h) - 2 f(x-h) + 3 f(x)) / 2h = f' + (2/3) h^2 f^(3) + ..., just like the
    central difference at 2h. Without f0, 4: at x +- h and x +- 2h. `known`: per direction,
    the flat outputs already evaluated at x + h u and x - h u (plain calls: not evaluated again)."""
    k = len(directions)
    factors = [h, -h, 2 * h] if f0 is not None else [h, -h, 2 * h, -2 * h]
    batch = problem.cache.vmap_ok is not False and problem.batched_fn is not None
    if batch and 4 * k > LOOP_MAX and not known:
        try:
            out = _directional_batched(problem, values, directions,
                                       torch.tensor([h, -h, 2 * h, -2 * h],
                                                    dtype=values[0].dtype,
                                                    device=values[0].device))
            return _differences(out.view(4, k, -1), h)
        except _NotBatchable:
            problem.cache.vmap_ok = False
    diff = None
    for k_dir, u in enumerate(directions):
        given = known[k_dir] if k_dir < len(known) else ()
        outs = [given[j] if j < len(given) else
                flat_cat(problem.outputs([torch.add(v, d, alpha=f) for v, d in zip(values, u)]))
                for j, f in enumerate(factors)]
        if diff is None:
            diff = torch.empty(2, k, outs[0].numel(), dtype=outs[0].dtype,
                               device=outs[0].device)
        torch.sub(outs[0], outs[1], out=diff[0, k_dir]).div_(2 * h)
        if f0 is None:
            torch.sub(outs[2], outs[3], out=diff[1, k_dir]).div_(4 * h)
        else:
            second = diff[1, k_dir]
            torch.add(outs[2], f0, alpha=3, out=second)
            second.sub_(outs[0], alpha=2).sub_(outs[1], alpha=2).div_(2 * h)
    return diff


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
    """(2, K, n_out): central differences at h (from out[0] - out[1]) and 2h (out[2] - out[3])."""
    diff = out[0::2] - out[1::2]
    diff[0] /= 2 * h
    diff[1] /= 4 * h
    return diff


def one_sided(problem: Problem, values: Sequence[torch.Tensor], which: int, col: int,
              h: float) -> dict[str, torch.Tensor]:
    """Derivative estimates of one column by several formulas and steps (kink detection)."""
    work = [v.detach().clone() for v in values]
    at_col = element(work[which].shape, col)
    original = work[which][at_col].item()

    def at(delta: float) -> torch.Tensor:
        work[which][at_col] = original + delta
        out = flat_cat(problem.outputs(work))
        work[which][at_col] = original
        return out

    f0, plus, minus = at(0.0), at(h), at(-h)
    plus10, minus10 = at(10 * h), at(-10 * h)
    return {
        "right": (plus - f0) / h,
        "left": (f0 - minus) / h,
        "central": (plus - minus) / (2 * h),
        **at_far(f0, plus10, minus10, 10 * h),
    }


def element(shape: Sequence[int], col: int) -> tuple[int, ...]:
    """The index of flat element `col` (row-major) in a tensor of `shape`, whatever its strides:
    a clone keeps a transposed input's strides, where `.view(-1)` would raise."""
    index = []
    for size in reversed(shape):
        col, k = divmod(col, size)
        index.append(k)
    return tuple(reversed(index))


# The estimates whose disagreement marks an element unreliable (the others only tell why).
KINK_TEST = ("right", "left", "central", "central x10")


def at_far(f0: torch.Tensor, plus: torch.Tensor, minus: torch.Tensor, step: float
           ) -> dict[str, torch.Tensor]:
    """The estimates at the far step: central (the kink test's) and one-sided (why)."""
    return {"central x10": (plus - minus) / (2 * step), "right x10": (plus - f0) / step,
            "left x10": (f0 - minus) / step}
