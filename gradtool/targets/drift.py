"""Forward drift: outputs that differ between two calls on the same inputs with torch's RNG
frozen, judged against what the checks can resolve (targets/probe.py asks).

A drift is a failure (`gradient.forward_drift`) only where it could corrupt what the checks
measure: larger than the rounding of summing the inputs in another order (CUDA atomics,
index_add_/scatter_add_ with repeated indices: any correct kernel may do that) and larger than
finite differences resolve (its difference over 2·eps beyond the gradient tolerance,
atol + rtol·|J|). Below both the forward is checked as deterministic, with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import torch

from ..config.settings import DEFAULT_TOLERANCES, CheckConfig
from ..numerics.bounds import finite_max
from ..numerics.facts import output_names
from ..numerics.problem import Problem, tensor_outputs
from ..numerics.rounding import dtype_name
from ..numerics.sparse import dense_output
from ..tracebacks import calls_user_code

Found = tuple[tuple[str, str], ...]  # (output name, 'by up to ... at k of n elements')


@dataclass(frozen=True)
class Drift:
    failing: Found = ()  # outputs whose drift corrupts what the checks measure
    benign: Found = ()  # outputs that differ, but below what the checks resolve
    size: float = 0.0  # the largest benign difference: finite differences' error allows for it


def judge(problem: Problem, first: Sequence[torch.Tensor], second: Sequence[torch.Tensor],
          config: CheckConfig | None = None) -> Drift:
    """Per output that differs between `first` and `second`: failing or benign, and how far."""
    names = problem.output_labels or output_names(len(first))
    failing: list[tuple[str, str]] = []
    benign: list[tuple[str, str]] = []
    largest = 0.0
    slopes: list[float] | None = None  # |J| per output, estimated only where it is needed
    for k, (a, b) in enumerate(zip(first, second)):
        name = names[k] if k < len(names) else f"output {k}"
        size = _size(a, b)
        if size == 0.0:
            continue
        bound = _rounding(problem, a, b)
        if size > bound:
            slopes = _slopes(problem, len(first), config) if slopes is None else slopes
            bound = max(bound, _resolved(problem, config, slopes[k] if k < len(slopes) else 0.0))
        how = how_far(a.detach(), b.detach())
        if size > bound:
            failing.append((name, f"{how}, beyond the {bound:.3g} the checks could resolve"))
        else:
            benign.append((name, how))
            largest = max(largest, size)
    if len(first) != len(second):
        failing.append(("outputs", f"{len(first)} then {len(second)} tensors"))
    return Drift(tuple(failing), tuple(benign), largest)


def _size(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between two calls' values (real and imaginary parts apart); inf
    where they cannot be compared: another shape or dtype, NaN or inf on one call only, a
    non-float output that changed (a counter)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    a, b = _real(a), _real(b)
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    d = torch.where(same, torch.zeros_like(a, dtype=torch.float64), (a.double() - b.double()).abs())
    if not bool(torch.isfinite(d).all()):
        return float("inf")
    return float(d.max()) if d.numel() else 0.0


def _dense(t: torch.Tensor) -> torch.Tensor:
    """Dense and detached; complex32 (no comparison kernels on the CPU) as complex64."""
    t = dense_output(t).detach()
    return t.to(torch.complex64) if t.dtype == torch.complex32 else t


def _real(t: torch.Tensor) -> torch.Tensor:
    """The values to compare: a complex tensor as its real and imaginary parts."""
    t = _dense(t)
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _rounding(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> float:
    """What summing the inputs in another order may change: the output dtype's unit roundoff
    (times 2) times the element count times the scale of the terms (the inputs', else the
    output's own)."""
    a, b = _real(a), _real(b)
    if not a.is_floating_point():
        return 0.0
    values = [v for v in problem.args if isinstance(v, torch.Tensor)]
    count = sum(v.numel() for v in values if v.is_floating_point() or v.is_complex())
    scale = max(finite_max(*values), finite_max(a, b))
    return torch.finfo(a.dtype).eps * max(count, 1) * scale


def tolerances(problem: Problem, config: CheckConfig | None) -> tuple[float, float, float]:
    """(eps, atol, rtol) the gradient check compares with: the config's, at the defaults of the
    coarsest floating input where that is coarser (as checks/gradient.py:precision_config)."""
    names = [dtype_name(v.dtype) for v in problem.inputs if v.is_floating_point()]
    names += [config.dtype] if config is not None else []
    known = [n for n in names if n in DEFAULT_TOLERANCES] or ["float64"]
    loosest = max(known, key=lambda n: DEFAULT_TOLERANCES[n]["eps"])
    config = (config or CheckConfig()).with_(dtype=loosest)
    eps, atol, rtol = (config.tolerance(name) for name in ("eps", "atol", "rtol"))
    return eps, atol, rtol


def _resolved(problem: Problem, config: CheckConfig | None, slope: float) -> float:
    """The smallest drift finite differences can tell from the gradient: 2·eps times the
    tolerance atol + rtol·|J| (a drift d moves a central difference by up to d / (2·eps))."""
    eps, atol, rtol = tolerances(problem, config)
    return 2 * eps * (atol + rtol * slope)


DIRECTIONS = 2  # all ones, then random signs: a Jacobian row summing to zero along both is rare
AGREE = 0.1  # a slope read at eps and at 2 eps within this fraction: J's, not the drift's


@calls_user_code
def _slopes(problem: Problem, n_outputs: int, config: CheckConfig | None) -> list[float]:
    """Per output, an estimate of |J| from the forward alone: the largest central difference
    along a direction over its step, read at eps and at 2 eps and kept only where the two agree
    (a drift moves them apart: garbage never explains itself). 0 where forward cannot be moved."""
    eps = tolerances(problem, config)[0]
    best = [0.0] * n_outputs
    generator = torch.Generator().manual_seed(0)
    for k in range(DIRECTIONS):
        moves = [_direction(v, k, generator) for v in problem.inputs]
        try:
            near, far = (_central(problem, moves, h) for h in (eps, 2 * eps))
        except Exception:  # noqa: BLE001 - the checks report forward's own errors
            return best
        for j, (a, b) in enumerate(zip(near, far)):
            if j < n_outputs and abs(a - b) <= AGREE * max(a, b):
                best[j] = max(best[j], min(a, b))
    return best


def _central(problem: Problem, moves: Sequence[torch.Tensor], h: float) -> list[float]:
    """Per output, the largest |f(x + h m) - f(x - h m)| / (2 h) (nan where not comparable)."""
    plus, minus = (_outputs(problem, [v + s * h * m for v, m in zip(problem.inputs, moves)])
                   for s in (1, -1))
    found = []
    for p, m in zip(plus, minus):
        p, m = _real(p), _real(m)
        ok = p.shape == m.shape and p.dtype == m.dtype and p.is_floating_point()
        found.append(finite_max(p.double() - m.double()) / (2 * h) if ok else float("nan"))
    return found


def _direction(value: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    if k == 0:
        return torch.ones_like(value.detach())
    # drawn on the CPU generator's own device (a seeded CPU generator), then moved to value's
    signs = torch.randint(0, 2, value.shape, generator=generator, device="cpu")
    return (signs * 2 - 1).to(device=value.device, dtype=value.dtype)


def _outputs(problem: Problem, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad(), problem.rng():
        problem.calls["forward"] += 1
        return [t.detach() for t in tensor_outputs(problem.fn(*problem.with_inputs(
            [v.detach() for v in values])))]


def how_far(a: torch.Tensor, b: torch.Tensor) -> str:
    """'by up to 0.001 at 12 of 12 elements' (NaN at some on one call only: said so)."""
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} then {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {dtype_name(a.dtype)} then {dtype_name(b.dtype)}"
    a, b = _dense(a), _dense(b)  # complex compared whole: its elements counted once
    if not (a.is_floating_point() or a.is_complex()):
        return f"at {int((a != b).sum())} of {a.numel()} elements"
    nan = torch.isnan(a) != torch.isnan(b)
    d = (a - b).abs()
    moved = nan | (d > 0)
    d = d[torch.isfinite(d) & moved]
    size = f"by up to {float(d.max()):.3g}" if d.numel() else "by inf"
    also = f", NaN on one call only at {int(nan.sum())}" if bool(nan.any()) else ""
    return f"{size} at {int(moved.sum())} of {a.numel()} elements{also}"


def note(benign: Found) -> str:
    """The note of a forward whose outputs differ below what the checks resolve."""
    where = "; ".join(f"{out} {how}" for out, how in benign)
    return (f"forward's outputs differ between calls on the same inputs ({where}): below what "
            "the checks resolve (a summation order, as CUDA atomics or index_add_ give); "
            "checked as deterministic")

