"""Forward mode: J·u by the target's jvp (dual tensors) against finite differences, full or probe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..results import Outcome
from ..tracebacks import calls_user_code
from .jacobian import SMALL, Verdict, _finish, _tallies
from .batching import quiet_batching
from .draws import direction as _direction
from .problem import Problem, flat_cat, select_outputs
from .steps import FINITE_MACHINE, LOOP_MAX, directional, element, numerical_columns
from .transforms import vmap


@calls_user_code  # forward with dual inputs: a Function without jvp raises there, the user's
def jvp(problem: Problem, values: Sequence[torch.Tensor],
        tangents: Sequence[torch.Tensor]) -> torch.Tensor:
    """J·u as a flat (n_out,) vector: one forward with dual inputs (the Function's jvp runs)."""
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level(), problem.rng():
        problem.calls["jvp"] += 1
        duals = [fwad.make_dual(v.detach().clone(), t) for v, t in zip(values, tangents)]
        outs = select_outputs(problem.fn(*problem.with_inputs(duals)), problem.output_mask)
        tangent_out = []
        for out in outs:
            t = fwad.unpack_dual(out).tangent
            tangent_out.append(torch.zeros_like(out.detach()) if t is None else t.detach())
    return flat_cat(tangent_out) if tangent_out else torch.zeros(0, device=values[0].device)


def jvp_columns(problem: Problem, values: Sequence[torch.Tensor], which: int) -> torch.Tensor:
    """The analytical columns (n_out, n_which) of input `which`: all at once under
    torch.func.vmap where the Function allows it (checked against one plain jvp), else one jvp
    per element."""
    n = values[which].numel()
    if n > LOOP_MAX and problem.cache.batched_jvp_ok is not False:
        cols = _batched_columns(problem, values, which)
        problem.cache.batched_jvp_ok = cols is not None
        if cols is not None:
            return cols
    return torch.stack([jvp_column(problem, values, which, k) for k in range(n)], dim=1)


def _batched_columns(problem: Problem, values: Sequence[torch.Tensor],
                     which: int) -> torch.Tensor | None:
    shape = values[which].shape
    eye = torch.eye(values[which].numel(), dtype=values[which].dtype,
                    device=values[which].device).view(-1, *shape)
    primals = tuple(v.detach() for v in values)

    def f(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(select_outputs(problem.fn(*problem.with_inputs(list(xs))),
                                    problem.output_mask))

    def column(t: torch.Tensor) -> torch.Tensor:
        tangents = tuple(t if k == which else torch.zeros_like(v) for k, v in enumerate(primals))
        return flat_cat(torch.func.jvp(f, primals, tangents)[1])

    try:
        with problem.rng(), quiet_batching():
            cols = vmap(column)(eye).T
    except Exception:  # a classic ctx Function, .item(), ...: no functorch here, loop instead
        return None
    problem.calls["jvp"] += len(eye)
    if not torch.allclose(cols[:, 0], jvp_column(problem, values, which, 0), rtol=1e-10,
                          atol=1e-12):
        return None  # vmap changed what the jvp computes: trust only the plain calls
    return cols


def jvp_column(problem: Problem, values: Sequence[torch.Tensor], which: int,
               col: int) -> torch.Tensor:
    """J e_col for element `col` of input `which`."""
    tangents = [torch.zeros_like(v) for v in values]
    tangents[which][element(values[which].shape, col)] = 1  # zeros_like keeps strides
    return jvp(problem, values, tangents)


def forward_mode(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                 outs: Sequence[torch.Tensor], seed: int, reference: object = None) -> Verdict:
    """Full mode (every column) while small, else probes; then forward against reverse mode.
    (reference: a reverse-mode surrogate, which says nothing of jvp: unused.)"""
    n_in = sum(v.numel() for v in leaves)
    n_out = sum(o.numel() for o in outs)
    full = config.mode == "full" or (config.mode == "auto" and n_in * n_out <= SMALL)
    size = f"{n_out} x {n_in} Jacobian"
    reason = (f"--mode {config.mode}" if config.mode != "auto"
              else f"small {size}" if full else f"{size} above {SMALL} elements")
    gen = torch.Generator().manual_seed(seed + 4241)
    u = [_direction(v, gen) for v in problem.inputs]
    verdict, ju = (_full(problem, config, leaves, outs, reason, u) if full
                   else _probe(problem, config, leaves, outs, reason, u))
    mismatch = _reverse_consistency(problem, config, leaves, outs, gen, u, ju)
    if mismatch:
        verdict.details.insert(0, mismatch)
        if verdict.outcome is not Outcome.FAILED:
            verdict.outcome = Outcome.FAILED
    return verdict


def _full(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
          outs: Sequence[torch.Tensor], reason: str, u: Sequence[torch.Tensor]
          ) -> tuple[Verdict, torch.Tensor]:
    """Every column; J·u for the consistency test comes from the columns."""
    values = [v.detach() for v in problem.inputs]
    tallies = _tallies(problem, leaves, outs, config.tolerance("atol"), config.tolerance("rtol"),
                       config.max_worst)
    bounds = _bounds(outs)
    dense = {}
    ju = torch.zeros(bounds[-1], dtype=values[0].dtype, device=values[0].device)
    for i in range(len(values)):
        analytical = jvp_columns(problem, values, i)
        ju += analytical @ u[i].reshape(-1).to(analytical.dtype)
        numerical = numerical_columns(problem, values, i,
                                      torch.arange(values[i].numel(), device=values[i].device),
                                      config.tolerance("eps"))
        for o in range(len(outs)):
            rows = slice(bounds[o], bounds[o + 1])
            tallies[i][o].add(analytical[rows], numerical[rows])
            dense[(i, o)] = (analytical[rows].clone(), numerical[rows].clone())
    verdict = _finish(problem, config, tallies, False, "full", reason)
    verdict.dense = dense
    return verdict, ju


def _bounds(outs: Sequence[torch.Tensor]) -> list[int]:
    bounds = [0]
    for o in outs:
        bounds.append(bounds[-1] + o.numel())
    return bounds


def _probe(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor], reason: str, directions: Sequence[torch.Tensor]
           ) -> tuple[Verdict, torch.Tensor]:
    """One random direction over every input: jvp against a Richardson-checked difference.
    Only when it fails, a direction per input separates the blocks, and a failing (input,
    output) pair is bisected down to one input element."""
    values = [v.detach() for v in problem.inputs]
    tallies = _tallies(problem, leaves, outs, config.tolerance("atol"), config.tolerance("rtol"),
                       config.max_worst)
    bounds = _bounds(outs)
    f0 = flat_cat(outs).detach()
    outcomes = []
    joint_bad, ju, noisy = _mismatch(problem, config, values, None, directions, f0,
                                     with_jvp=True)
    if noisy:
        return _noisy(problem, config, leaves, outs, tallies, reason, directions, ju, noisy)
    joint = bool(joint_bad.any())
    for i, u in enumerate(directions):
        for tally in tallies[i]:
            tally.checked += 1
        bad = _mismatch(problem, config, values, i, u, f0) if joint else None
        for o, tally in enumerate(tallies[i]):
            if bad is None:
                continue
            rows = bad[bounds[o]:bounds[o + 1]]
            if not bool(rows.any()):
                continue
            r = int(rows.nonzero()[0])
            col, a, n = _bisect(problem, config, values, i, u, f0, bounds[o] + r)
            tally.mismatched += 1
            tally.worst.append((abs(a - n), r, col, a, n))
            outcomes.append(Outcome.FAILED)
    blocks = [t.to_block(exhaustive=False) for row in tallies for t in row]
    return Verdict(Outcome.FAILED if outcomes else Outcome.PASSED, blocks, "probe", reason), ju


def _noisy(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor], tallies: list, reason: str,
           directions: Sequence[torch.Tensor], ju: torch.Tensor,
           noisy: tuple[float, float]) -> tuple[Verdict, torch.Tensor]:
    """A probe whose finite differences are noise beyond the fixed tolerance (numerics/probe.py's
    rule in forward mode): every column where that is small, else inconclusive, never a pass."""
    why = (f"the probe's measured finite-difference error (up to {noisy[0]:.3g}) is beyond the "
           f"fixed tolerance of the elements it tests (up to {noisy[1]:.3g}): it could pass a "
           "wrong jvp")
    n_in, n_out = sum(v.numel() for v in leaves), sum(o.numel() for o in outs)
    if n_in * n_out <= SMALL:
        return _full(problem, config, leaves, outs, f"{reason}; {why}, so every column is "
                     "compared", directions)
    blocks = [t.to_block(exhaustive=False) for row in tallies for t in row]
    return Verdict(Outcome.INCONCLUSIVE, blocks, "probe", reason,
                   [f"inconclusive: {why}; full mode would compare every column: run it with "
                    "--mode full, or set --atol/--rtol to the noise you accept"]), ju


def _mismatch(problem: Problem, config: CheckConfig, values: Sequence[torch.Tensor],
              which: int | None, u: torch.Tensor | Sequence[torch.Tensor], f0: torch.Tensor,
              with_jvp: bool = False) -> Any:
    """Per output element: does jvp(u on input `which`, or u on every input when which is None)
    disagree with finite differences beyond tolerance plus the measured difference error?"""
    tangents = (list(u) if which is None
                else [u if k == which else torch.zeros_like(v) for k, v in enumerate(values)])
    analytical = jvp(problem, values, tangents)
    diffs = directional(problem, values, [tangents], config.tolerance("eps"), f0)
    numerical = diffs[0, 0] + (diffs[0, 0] - diffs[1, 0]) / 3  # Richardson
    fd_error = (diffs[0, 0] - diffs[1, 0]).abs()
    roundoff = FINITE_MACHINE.get(f0.dtype, 2.2e-16) * f0.abs() / config.tolerance("eps")
    tol = config.tolerance("atol") + config.tolerance("rtol") * numerical.abs()
    bad = (analytical - numerical).abs() > tol + fd_error + 10 * roundoff
    if not with_jvp:
        return bad
    # an element whose measured error is beyond the fixed tolerance passes any jvp: noise
    noisy = fd_error + 10 * roundoff > tol
    return bad, analytical, (float(fd_error[noisy].max()), float(tol[noisy].max())) \
        if bool(noisy.any()) else None


def _bisect(problem: Problem, config: CheckConfig, values: Sequence[torch.Tensor], which: int,
            u: torch.Tensor, f0: torch.Tensor, row: int) -> tuple[int, float, float]:
    """Halve the direction's support, keeping a half that still disagrees at output `row`; the
    element left, with its jvp and numerical column entries (log2 n jvps and differences)."""
    support = torch.arange(u.numel(), device=u.device)
    while len(support) > 1:
        half = support[: len(support) // 2]
        masked = torch.zeros_like(u).view(-1)
        masked[half] = u.view(-1)[half]
        if bool(_mismatch(problem, config, values, which, masked.view(u.shape), f0)[row]):
            support = half
        else:
            support = support[len(support) // 2:]
    col = int(support[0])
    analytical = jvp_column(problem, values, which, col)[row].item()
    numerical = numerical_columns(problem, values, which, support, config.tolerance("eps"))
    return col, analytical, numerical[row, 0].item()


def _reverse_consistency(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                         outs: Sequence[torch.Tensor], gen: torch.Generator,
                         u: Sequence[torch.Tensor], ju: torch.Tensor) -> str | None:
    """⟨v, J u⟩ by jvp against ⟨vᵀJ, u⟩ by backward: no finite differences, so exact up to
    rounding; a mismatch means jvp and backward disagree with each other."""
    v = [_direction(o.detach(), gen) for o in outs]
    forward = float((flat_cat(v) * ju).sum())
    grads = problem.vjp(leaves, outs, v)
    reverse = float(sum((g * d).sum() for g, d in zip(grads, u)))
    if abs(forward - reverse) <= config.tolerance("atol") + config.tolerance("rtol") * abs(reverse):
        return None
    return (f"forward and reverse mode disagree: ⟨v, J·u⟩ is {forward:.6g} by jvp but "
            f"{reverse:.6g} by backward (random u, v)")
