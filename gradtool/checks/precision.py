"""Low precision: a float32/float16/bfloat16 run judged against a float64 reference, per element."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics.bounds import Admitted, admit, finite_max
from ..numerics.problem import Problem
from ..numerics.rounding import (
    FINEST_FIRST,
    MAX_SAMPLES,
    REFERENCE_FACTOR,
    UNIT_ROUNDOFF,
    Bound,
    dtype_name,
    finest_resolving,
    measure_bound,
)
from ..numerics.sparse import masked_places
from ..results import Block, CheckResult, Finding, Outcome
from ..targets.cases import Case
from ..targets.load import Target
from ._common import calls_since, error_result
from .precision_reference import load_reference, reference_of  # noqa: F401 - re-exported
from .precision_zero import (SCALE, ZERO_MEASURED, ZERO_UNITS, measured_rounding, scale_line,
                             sign_line, zero_noise, zero_tensors)

NAME = "gradient"
GRADIENT = "gradient"  # the output label of a gradient block (the VJP of every output)
DRAWS = 1   # grad_output draws (one VJP of random grad_outputs covers every input element)


def low_precision(problem: Problem, config: CheckConfig) -> str | None:
    """The least precise floating dtype the target computes in, or None for a float64 run."""
    names = {dtype_name(a.dtype) for a in problem.args
             if isinstance(a, torch.Tensor) and a.is_floating_point()}
    if config.autocast:
        names.add(config.autocast)
    found = coarsest(names)
    return None if found in (None, "float64") else found


def coarsest(names: Any) -> str | None:
    known = [n for n in names if n in UNIT_ROUNDOFF]
    return max(known, key=FINEST_FIRST.index) if known else None


def check_precision(case: Case, target: Target, config: CheckConfig,
                    reference: Callable[..., Any] | None = None,
                    float64_check: Callable[[Problem], CheckResult] | None = None) -> CheckResult:
    """Forward and VJPs of the low-precision run against a float64 reference on the same inputs.

    `reference` is the user's float64 callable; without one the target itself runs in float64
    (`float64_check` then verifies that run's own gradient). A target that cannot run in float64
    falls back on the Taylor-remainder test.
    """
    start, problem = time.perf_counter(), case.problem
    before = dict(problem.calls)
    if not problem.diff:
        return CheckResult(NAME, Outcome.SKIPPED, "no differentiable inputs to check")
    if problem.facts.drift:
        from .gradient import drift_result

        return drift_result(NAME, problem, target, start)
    try:
        low_run = _vjp_run(problem, case.seed)
    except Exception as exc:  # the user's forward or backward raised in its own dtype
        return error_result(NAME, exc, target, start, problem, before)
    # Outputs may come out coarser than every input (a kernel that returns bfloat16).
    dtype = coarsest([low_precision(problem, config) or "float32",
                      *(dtype_name(t.dtype) for t in low_run.values)]) or "float32"
    ref = reference_problem(case, target, config, reference)
    try:
        exact = _vjp_run(ref, case.seed, low_run.grad_outputs)
    except Exception as exc:
        if reference is not None:
            return error_result(NAME, exc, target, start, problem, before)
        from .taylor import taylor_result

        return taylor_result(problem, target, case.seed, dtype, exc, start, before)
    bound = measure_bound(lambda: _vjp_run(ref, case.seed, low_run.grad_outputs).values,
                          exact.values, dtype, case.seed, round_operands=bool(config.autocast))
    if reference is not None:
        bound.floors = _reference_error(problem, reference, low_run, exact, case.seed)
    try:
        cancelled = _cancelled_noise(problem, case.seed, low_run, exact, dtype)
    except Exception as exc:  # the user's backward raised at a scaled grad_output
        return error_result(NAME, exc, target, start, problem, before)
    verdict = judge(problem, low_run, exact, bound, cancelled=cancelled)
    while verdict.outcome is not Outcome.PASSED and bound.samples < MAX_SAMPLES:
        verdict = judge(problem, low_run, exact, bound.sample(bound.samples),
                        cancelled=cancelled)
    if verdict.outcome is not Outcome.PASSED:
        verdict = judge(problem, low_run, exact, bound, explain=True, cancelled=cancelled)
    calls = calls_since(problem, before)
    calls.update({f"float64 {k}": v for k, v in ref.calls.items()})
    own = float64_check(ref) if float64_check is not None and reference is None else None
    for k, v in (own.calls.items() if own is not None else ()):
        calls[f"float64 check {k}"] = v
    return _result(verdict, own, bound, config, target, calls, time.perf_counter() - start,
                   reference is not None)


@dataclass
class Run:
    """Outputs then, per grad_output draw, the gradient of every differentiable input."""

    values: list[torch.Tensor]
    grad_outputs: list[list[torch.Tensor]]
    n_outputs: int


def _vjp_run(problem: Problem, seed: int,
             grad_outputs: list[list[torch.Tensor]] | None = None) -> Run:
    leaves, outs = problem.graph()
    if grad_outputs is None:
        generator = torch.Generator().manual_seed(seed + 1)
        grad_outputs = [[torch.randn(o.shape, generator=generator, dtype=torch.float64,
                                     device="cpu")
                         .to(dtype=o.dtype, device=o.device) for o in outs]
                        for _ in range(DRAWS)]
    values = [_real(o) for o in outs]
    for draw in grad_outputs:
        grads = [g.to(dtype=o.dtype) for g, o in zip(draw, outs)]
        values += [_real(v) for v in problem.vjp(leaves, outs, grads)]
    return Run(values, grad_outputs, len(outs))


def _real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor (complex32 from half parts) compared as its real and imaginary parts."""
    t = t.detach()
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def reference_problem(case: Case, target: Target, config: CheckConfig,
                      reference: Callable[..., Any] | None) -> Problem:
    """The same (already rounded) values in float64, bound to the reference or the target and
    wrapped as the case's fn is (nested arguments, sparse inputs, symmetric projections)."""
    from ..targets.cases import bind

    problem = case.problem
    args = [a.detach().to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a.detach().to(torch.complex128) if isinstance(a, torch.Tensor) and a.is_complex()
            else a for a in problem.args]
    # bind() again in float64: a module's frozen buffers too, and no autocast region; its
    # scope binds the parameters in backward too (a checkpoint's recompute reads them there)
    scope = None
    if reference is None:
        bound, _, _, scope = bind(target, case.n_positional, config.with_(dtype="float64"),
                                  case.seed)
        reference, scope = bound, case.wrap_scope(scope)
    return Problem(case.wrap(reference), args, list(problem.names), list(problem.diff),
                   facts=problem.facts.with_(precision="float64"), sparse=problem.sparse,
                   scope=scope)


def _reference_error(problem: Problem, reference: Callable[..., Any], low: Run, exact: Run,
                     seed: int) -> list[float] | None:
    """Per compared tensor: REFERENCE_FACTOR x the largest error of the reference itself run
    on the low-precision inputs, against its float64 run: what rounding alone does to a
    computation of these values, where the kernel's algorithm is not the reference's (its
    chunks, tiles and fused steps round and cancel where the reference's do not). None when
    the reference cannot run in the low dtype."""
    same = Problem(reference, [a.detach() if isinstance(a, torch.Tensor) else a
                               for a in problem.args],
                   list(problem.names), list(problem.diff), facts=problem.facts)
    try:
        run = _vjp_run(same, seed, low.grad_outputs)
    except Exception:  # noqa: BLE001 - a float64-only reference: the simulated bound alone
        return None
    floors = []
    for r, e in zip(run.values, exact.values):
        error = (r.double() - e).abs() if r.shape == e.shape else e.new_zeros(())
        error = torch.where(error.isfinite(), error, torch.zeros_like(error))
        floors.append(REFERENCE_FACTOR * float(error.max()) if error.numel() else 0.0)
    return floors


@dataclass
class Verdict:
    """Per compared tensor: its label, element counts, and the worst elements found."""

    outcome: Outcome
    forward_bad: int
    blocks: list[Block]
    lines: list[str]
    resolve_with: str | None
    scaled: list[str]   # tensors whose every element is off by one common factor
    flipped: list[str]  # gradients the negated reference at every element beyond its bound


def judge(problem: Problem, low: Run, exact: Run, bound: Bound, explain: bool = False,
          cancelled: Sequence[float] = ()) -> Verdict:
    """Every element: |low - reference| <= its bound, or resolved as beyond it. `explain`: the
    worst elements' lines, with where each bound came from (re-runs, paid on a failure).
    `cancelled`: per compared tensor, backward's measured rounding (_cancelled_noise)."""
    labels = _labels(problem, low)
    sparse = masked_places(problem)
    noise = zero_noise(labels, exact.values, low.grad_outputs, bound.dtype)
    failed = unresolved = forward_bad = 0
    lines: list[str] = []
    stats: dict[tuple[str, str], list[Any]] = {}
    finer: list[str] = []
    scaled_names: list[str] = []
    flipped: list[str] = []
    doors: list[Admitted] = []
    # the door's scale: the run's largest value, inputs too (a one-element normalisation's
    # output is 0 exactly, in float32 rounding of its inputs' size)
    scale = finite_max(*low.values, *exact.values,
                       *(a for a in problem.args if isinstance(a, torch.Tensor)))
    for tensor, ((kind, name, shape), lo, ex, tol, sigma) in enumerate(zip(
            labels, low.values, exact.values, bound.tolerances, bound.sigmas)):
        diff = (lo.double() - ex).abs().cpu()
        tol, ex, lo = tol.cpu(), ex.cpu(), lo.cpu()
        # zero at the low dtype's resolution: within one unit of the backward's largest
        zero = kind != "forward" and ex.numel() > 0 and \
            float(ex.abs().max()) <= noise / ZERO_UNITS
        floor = None
        if zero:
            measured = cancelled[tensor] if tensor < len(cancelled) else 0.0
            floor = max(noise, ZERO_MEASURED * measured)
            tol = tol.clamp_min(floor)
        # the door: finite, below the size of the values (an inf bound passed a negated dv)
        # (scale: the run's largest value, forward and gradients: a result its terms cancel,
        # a summed normalisation's, is rounding of terms the size of the gradients)
        door = admit(tol, lo, ex, origin=f"simulated {bound.dtype} rounding", floor=floor,
                     scale=scale)
        simulated, tol, capped = tol, door.tol, door.capped
        doors.append(door)
        over = ~(diff <= tol)  # NaN too: a low-precision overflow or NaN is beyond any bound
        # Elements beyond their bound are reported as such; the fit looks for what hides below.
        scaled = None if zero else scale_line(kind, name, lo[~over], ex[~over],
                                              sigma.cpu()[~over], bound.dtype)
        if scaled:
            lines.insert(0, scaled)
            scaled_names.append(name)
            failed += 1
            forward_bad += kind == "forward"
        # Beyond the bound, but the dtype cannot resolve the value itself: no verdict there; nor
        # within a finite simulated bound the door cut (terms that cancel): never a pass, nor wrong
        uncut = capped & torch.isfinite(simulated) & (diff <= simulated)
        vague = over & ((~capped & (tol >= 0.5 * ex.abs()) & (diff <= 3 * tol)) | uncut)
        bad = over & ~vague
        sign = None if zero or kind == "forward" else sign_line(name, lo, ex, tol, bad)
        if sign:  # a sign flip is no rounding: said first, as gradient.sign
            lines.insert(0, sign)
            flipped.append(name)
        failed += int(bad.sum())
        unresolved += int(vague.sum())
        forward_bad += int(bad.sum()) if kind == "forward" else 0
        places, matrix = sparse.get(name, (None, shape)) if kind != "forward" else (None, shape)
        entry = stats.setdefault((kind, name), [matrix, 0, 0, 0.0, 0.0])
        entry[1] += diff.numel()
        entry[2] += int(over.sum())
        entry[3] = max(entry[3], float(diff.max()) if diff.numel() else 0.0)
        entry[4] = max(entry[4], float((diff / ex.abs().clamp_min(1e-300)).max())
                       if diff.numel() else 0.0)
        if explain:
            lines += _worst_lines(kind, name, shape, lo, ex, diff, tol, over,
                                  UNIT_ROUNDOFF[bound.dtype],
                                  lambda flat, t=tensor: bound.explain(t, flat), places)
        for index in torch.nonzero(vague.reshape(-1)).reshape(-1)[:1].tolist():
            need = finest_resolving(bound.dtype, float(
                torch.where(uncut, simulated, tol).flatten()[index] / diff.flatten()[index]))
            finer += [need] if need else []
    outcome = (Outcome.FAILED if failed else Outcome.INCONCLUSIVE if unresolved
               else Outcome.PASSED)
    # A gradient block reads "input 'x' (64, 64) -> gradient (64, 64)"; a forward one
    # "input '(forward)' () -> output (64, 64)".
    blocks = [Block(name if kind != "forward" else "(forward)",
                    shape if kind != "forward" else (), GRADIENT if kind != "forward" else name,
                    shape, n, bad_n, mad, mrd)
              for (kind, name), (shape, n, bad_n, mad, mrd) in stats.items()]
    resolve_with = min(finer, key=FINEST_FIRST.index, default=None) if finer else None
    cut = [w for w in (door.words() for door in doors) if w]
    return Verdict(outcome, forward_bad, blocks, lines[:8] + cut[:2], resolve_with,
                   list(dict.fromkeys(scaled_names)), list(dict.fromkeys(flipped)))


def _cancelled_noise(problem: Problem, seed: int, low: Run, exact: Run, dtype: str
                     ) -> list[float]:
    """Per compared tensor, backward's measured rounding where the reference is zero (one
    more forward and backward, only where such a gradient is); [] where none is."""
    labels = _labels(problem, low)
    zero = zero_tensors(labels, exact.values, zero_noise(labels, exact.values,
                                                         low.grad_outputs, dtype))
    if not any(zero):
        return []
    scaled = _vjp_run(problem, seed, [[SCALE * g for g in draw] for draw in low.grad_outputs])
    return measured_rounding(zero, low.values, scaled.values)


def _labels(problem: Problem, run: Run) -> list[tuple[str, str, tuple[int, ...]]]:
    outs = [("forward", name, tuple(v.shape))
            for name, v in zip(_output_names(problem, run.n_outputs), run.values)]
    grads = [("gradient", name, tuple(v.shape)) for name, v in
             zip(problem.input_names, run.values[run.n_outputs:run.n_outputs + len(problem.diff)])]
    return outs + grads * len(run.grad_outputs)


def _output_names(problem: Problem, count: int) -> list[str]:
    from ..numerics.problem import output_names

    names = problem.output_labels or problem.output_names
    return list(names) if len(names) == count else output_names(count)


def _worst_lines(kind: str, name: str, shape: tuple[int, ...], low: torch.Tensor,
                 exact: torch.Tensor, diff: torch.Tensor, tol: torch.Tensor,
                 over: torch.Tensor, u: float, explain: Callable[[int], str],
                 places: list[list[int]] | None = None) -> list[str]:
    """The worst elements beyond their bounds: values, the difference in units of u|value|
    (a kernel off by 40 u, or by rounding), and where the bound came from (`places`: a masked
    sparse input's element positions in its matrix)."""
    excess = torch.where(over, diff / tol.clamp_min(1e-300), torch.zeros_like(diff)).reshape(-1)
    lines = []
    for flat in torch.argsort(excess, descending=True)[:3].tolist():
        if not excess[flat] > 0:
            break
        index = tuple(places[flat]) if places is not None else tuple(
            int(i) for i in torch.unravel_index(torch.tensor(flat, device="cpu"), shape)) \
            if shape else ()  # a label only
        what = f"output {name!r}" if kind == "forward" else f"gradient of {name!r}"
        value, gap = float(exact.reshape(-1)[flat]), float(diff.reshape(-1)[flat])
        units = f" = {gap / (u * abs(value)):.3g} u|value|" if value else ""
        lines.append(f"{what} at {index}: low precision {float(low.reshape(-1)[flat]):.6g}, "
                     f"float64 reference {value:.6g}, diff {gap:.3g}{units} > rounding bound "
                     f"{float(tol.reshape(-1)[flat]):.3g} (from {explain(flat)})")
    return lines


def _result(verdict: Verdict, own: CheckResult | None, bound: Bound, config: CheckConfig,
            target: Target, calls: dict[str, int], seconds: float, user_reference: bool
            ) -> CheckResult:
    against = "the reference callable" if user_reference else "the same target in float64"
    summary = _summary(verdict, bound.dtype, against)
    details = list(verdict.lines)
    outcome = verdict.outcome
    blocks = tuple(verdict.blocks)
    if own is not None:
        details.append(f"float64 run's own gradient vs finite differences: {own.outcome.value}"
                       f" ({own.summary})")
        if own.outcome in (Outcome.FAILED, Outcome.ERROR):
            outcome = Outcome.FAILED
            blocks += own.blocks  # its elements and diagnosis: the bug is in every dtype
            summary = (f"the float64 run's own gradient is wrong ({own.summary}); "
                       f"low precision: {summary}")
        elif own.outcome is Outcome.INCONCLUSIVE and outcome is Outcome.PASSED:
            outcome = Outcome.INCONCLUSIVE
    details.append(f"rounding bound: {bound.describe()}")
    if verdict.resolve_with and outcome is Outcome.INCONCLUSIVE:
        details.append(f"{verdict.resolve_with} would resolve the differences {bound.dtype} "
                       "cannot (check the kernel in that dtype to decide)")
    tolerance = {"unit_roundoff": UNIT_ROUNDOFF[bound.dtype], "samples": float(bound.samples)}
    if own is not None and own.blocks and blocks[-len(own.blocks):] == own.blocks:
        tolerance = {**own.tolerance, **tolerance}  # the float64 blocks' own tolerance, shown
    return CheckResult(NAME, outcome, summary, tuple(details), blocks,
                       f"{bound.dtype} vs float64", f"judged against {against}",
                       findings=_findings(verdict, own, outcome, bound.dtype),
                       tolerance=tolerance, calls=calls, duration_s=seconds,
                       source=None if outcome is Outcome.PASSED else
                       target.forward_source if verdict.forward_bad else target.source)


def _findings(verdict: Verdict, own: CheckResult | None, outcome: Outcome, dtype: str
              ) -> tuple[Finding, ...]:
    """The float64 run's own findings (its bug is in every dtype), then gradient.rounding for
    each gradient beyond the rounding bound (or scaled, or the forward that is)."""
    if outcome is not Outcome.FAILED:
        return ()
    found = own.findings if own is not None and own.outcome is Outcome.FAILED else ()
    bad = [b for b in verdict.blocks if b.mismatched]
    rounding = tuple(Finding("gradient.rounding", f"{dtype} {b.output} of '{b.input}' differs "
                             f"from float64 beyond the rounding bound at {b.mismatched} "
                             f"element(s)", data={"input": b.input, "output": b.output,
                                                  "mismatched": b.mismatched, "dtype": dtype})
                     for b in bad)
    scaled = tuple(Finding("gradient.rounding", f"{dtype} run differs from float64 by a common "
                           f"scale factor in {name!r}", data={"input": name, "dtype": dtype,
                                                              "scaled": True})
                   for name in verdict.scaled)
    sign = tuple(Finding("gradient.sign", f"{dtype} gradient of {name!r} is the negated float64 "
                         "reference at every element beyond the rounding bound: sign flipped",
                         data={"input": name, "dtype": dtype}) for name in verdict.flipped)
    return (*found, *sign, *rounding, *scaled) or (Finding("gradient.rounding", f"{dtype} gradient "
                                                    "beyond the rounding bound",
                                                    data={"dtype": dtype}),)


def _summary(verdict: Verdict, dtype: str, against: str) -> str:
    grads = [b for b in verdict.blocks if b.output == GRADIENT]
    outs = [b for b in verdict.blocks if b.output != GRADIENT]
    bad = [b for b in grads if b.mismatched]
    if verdict.outcome is Outcome.PASSED:
        n = sum(b.checked for b in verdict.blocks)
        return (f"{dtype} forward and backward agree with {against} within rounding bounds "
                f"at all {n} elements")
    text = (f"{dtype} backward disagrees with {against} beyond the rounding bound at "
            f"{sum(b.mismatched for b in bad)} element(s) of "
            + ", ".join(repr(b.input) for b in bad)) if bad else \
        f"{dtype} backward agrees with {against} within rounding bounds"
    if verdict.flipped:
        text = (f"{dtype} gradient of {', '.join(repr(n) for n in verdict.flipped)} is "
                f"{against} negated (sign flipped)" + (f"; {text}" if bad else ""))
    if verdict.scaled:
        text = (f"{dtype} run differs from {against} by a common scale factor, beyond what "
                f"rounding can do, in {', '.join(repr(n) for n in verdict.scaled)}"
                + (f"; and {text}" if bad else ""))
    if verdict.forward_bad:
        bad_outs = sum(b.mismatched for b in outs)
        return (f"{dtype} forward disagrees with {against} beyond the rounding bound at "
                f"{bad_outs} element(s), so the gradient verdict rests on a wrong forward: "
                f"{text}")
    if verdict.outcome is Outcome.INCONCLUSIVE:
        return (f"{dtype} cannot resolve the differences from {against}: they exceed the "
                f"rounding bound only where the bound is as large as the values")
    return text


def run_precision_check(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """The entry point: load --reference if given, and verify the float64 run's own gradient."""
    from .gradient import diagnose_first_order, jacobian_result

    reference = reference_of(config)
    config64 = config.with_(dtype="float64")

    def float64_check(problem: Problem) -> CheckResult:
        from ..numerics.coarse import expected

        return expected(jacobian_result("gradient", problem, target, config64, case.seed, None,
                                        None, diagnose_first_order, first_order=True))

    return check_precision(case, target, config, reference, float64_check)


def run(case: Case, context: Any) -> CheckResult:
    """The registry's entry point, taken for `gradient` when the target computes below float64."""
    return run_precision_check(case, context.target, context.config)
