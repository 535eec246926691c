"""layout: gradients with non-contiguous grad_outputs and inputs equal the contiguous ones."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.bounds import admit
from ..numerics.compare import unravel
from ..numerics.problem import Problem, select_outputs, vjp
from ..numerics.terms import terms_scale
from ..results import CheckResult, Finding, Outcome, Severity
from ..targets.cases import Case
from ..targets.probe import both_nan, equal
from ..tracebacks import calls_user_code, gradtool_frame, innermost_user_frame, raised_in_gradtool
from .contract_rounding import MEASURED_SLACK, measured_noise
from ._common import Context, calls_since, declare, no_output
from .layout_variants import GRAD_VARIANTS, INPUT_VARIANTS, Variant, evaluations

NAME = "layout"
# Same values in another layout may be summed in another order (a different kernel): that is
# rounding, not a bug. A layout bug reads wrong elements, off by the values' own size.
ROUNDING_ULPS = 256
ROUNDING_CAP = 1 / 32
# A gradient that cancels whole (a conv bias before batch norm: zero, computed as a sum) is
# rounding noise of the size of the terms it sums, which the largest gradient of the same
# backward shows (measured on conv/instance/group norm stacks: 0.5-9 units of it in float64
# and float32). A gradient within NOISE_ULPS of that scale is taken for such noise and compared
# at FLOOR_ULPS of it; a larger one at its own scale only, so a small but real gradient keeps
# its own tolerance (the limit: in bfloat16 a real gradient under ~12 % of the largest one).
NOISE_ULPS = 16
FLOOR_ULPS = 64


def applies(case: Case, context: Context) -> str | None:
    if not case.problem.diff:
        return "no differentiable inputs"
    if all(not isinstance(v, torch.Tensor) or v.numel() < 2 for v in case.problem.inputs):
        return "every differentiable input is 0-d or has one element: one layout only"
    return None


def run(case: Case, context: Context) -> CheckResult:
    """Every grad_output layout on one graph, then every input layout through forward, each
    against the contiguous result."""
    start, problem = time.perf_counter(), case.problem
    if not problem.output_names:  # a Python number, None: the contract's finding, not a pass
        return CheckResult(NAME, Outcome.SKIPPED, no_output(problem))
    before = dict(problem.calls)
    source = context.target.source
    # A stochastic forward's draws (rand_like) follow its input's memory layout: another
    # layout is another mask, not a bug. Only grad_output layouts are tried then. A sparse
    # input is rebuilt in its own layout for every call: gradtool's strides never reach it.
    sparse = {problem.diff.index(p) for p in problem.sparse}
    movable = [] if problem.freeze_seed is not None else \
        [k for k, info in enumerate(_diff_infos(case)) if not _is_parameter(info)
         and k not in sparse]
    findings, tried = compare_layouts(problem, context.config, case.seed, GRAD_VARIANTS,
                                      INPUT_VARIANTS, movable, source)
    calls = calls_since(problem, before)
    elapsed = time.perf_counter() - start
    if not tried:
        why = ("input layouts are not tried on a stochastic forward" if problem.freeze_seed
               is not None else "no input has another layout")
        return CheckResult(NAME, Outcome.SKIPPED, "no layout to try: every output is 0-d or "
                           f"has one element, and {why}", calls=calls, duration_s=elapsed)
    failures = [f for f in findings if f.severity is Severity.FAILURE]
    if not failures:
        return CheckResult(NAME, Outcome.PASSED, "gradients equal the contiguous ones with "
                           + "; ".join(tried), calls=calls, duration_s=elapsed,
                           findings=tuple(findings))
    return CheckResult(NAME, Outcome.FAILED, failures[0].message, source=failures[0].source,
                       calls=calls, duration_s=elapsed, findings=(*failures, *(
                           f for f in findings if f.severity is not Severity.FAILURE)))


def _diff_infos(case: Case) -> list[object]:
    by_name = {info.name: info for info in case.infos}
    return [by_name.get(name) for name in case.problem.input_names]


def _is_parameter(info: object) -> bool:
    """A module's parameter: its layout is the module's, never the caller's."""
    return bool(getattr(info, "parameter", False))


def compare_layouts(problem: Problem, config: CheckConfig, seed: int,
                    grad_variants: Sequence[Variant], input_variants: Sequence[Variant],
                    movable: Sequence[int], source: str | None
                    ) -> tuple[list[Finding], list[str]]:
    """(findings, what was tried): each grad_output variant through one recorded graph, each
    input variant (on the differentiable inputs numbered in `movable`) through a forward."""
    # before the baseline, its forward and backward and a guess at the rest; then the count
    declare(lambda: 2 + len(grad_variants) + 2 * len(input_variants))
    leaves, outs, grads, base, fresh = _baseline(problem, seed)
    check = _Comparer(problem, config, leaves, outs, base, source)
    check.grads, check.fresh = grads, fresh
    declare(lambda: evaluations(problem, outs, grads, fresh, grad_variants, input_variants,
                                 movable))
    tried = []
    for variant in grad_variants:
        if check.grad_output(variant, grads):
            tried.append(variant.words)
    moved_words = []
    for variant in input_variants:
        if check.inputs(variant, grads, movable):
            moved_words.append(variant.name)
    if moved_words:
        names = ", ".join(repr(problem.input_names[k]) for k in movable)
        tried.append(f"{'/'.join(moved_words)} inputs {names}")
    return check.findings, tried


def _baseline(problem: Problem, seed: int) -> tuple[list[torch.Tensor], ...] | tuple:
    """(leaves, outs, grad_outputs, gradients, fresh): the contract's, read, else paid."""
    shared = problem.cache.ledger.graph(problem.inputs)  # its backward wrote nothing it saved
    if shared is not None:
        return shared.leaves, shared.outs, shared.grads, shared.result, False
    leaves, outs = _forward(problem, [v.detach().clone() for v in problem.inputs])
    gen = torch.Generator().manual_seed(seed + 53)
    grads = [torch.randn(o.shape, generator=gen, dtype=torch.float64, device="cpu").to(o)
             if o.requires_grad else torch.zeros_like(o) for o in outs]
    before = [leaf.detach().clone() for leaf in leaves]
    base = _backward(problem, leaves, outs, grads)
    # fresh: backward wrote its saved inputs (the contract's finding), a graph per layout
    return leaves, outs, grads, base, not all(equal(a, b) or both_nan(a, b)
                                              for a, b in zip(before, leaves))


class _Comparer:
    """Runs one layout at a time against the contiguous baseline, collecting findings."""

    def __init__(self, problem: Problem, config: CheckConfig, leaves: list[torch.Tensor],
                 outs: list[torch.Tensor], base: list[torch.Tensor], source: str | None) -> None:
        self.problem, self.config, self.source = problem, config, source
        self.leaves, self.outs, self.base = leaves, outs, base
        # The random-cotangent gradients set the scale: a constant cotangent may cancel to
        # rounding noise (a normalisation's input gradient), which is no scale at all.
        self.scales = [_max_abs(b) for b in base]
        self.floor = max(self.scales, default=0.0)
        self.findings: list[Finding] = []
        self.flagged: set[int] = set()  # inputs with a finding: later layouts leave them be
        self.fresh = False  # every backward on a forward of its own (see compare_layouts)
        self.grads: list[torch.Tensor] = []  # the grad_outputs `base` was computed at
        self.noise: list[float] | None = None  # per input: backward's rounding, measured
        self.terms: dict[int, float] | None = None  # per element count: numerics/terms.py

    def _graph(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(leaves, outputs) to run one more backward through: the recorded forward's, or a
        forward of fresh copies where backward writes what it saved."""
        if not self.fresh:
            return self.leaves, self.outs
        return _forward(self.problem, [v.detach().clone() for v in self.problem.inputs])

    def grad_output(self, variant: Variant, grads: list[torch.Tensor]) -> bool:
        """Backward with grad_outputs in this layout; False when it applies to none."""
        moved = [variant.make(g, k) if o.requires_grad else None
                 for k, (g, o) in enumerate(zip(grads, self.outs))]
        if all(m is None for m in moved):
            return False
        given = [g if m is None else m for g, m in zip(grads, moved)]
        problem = self.problem
        try:
            got = _backward(problem, *self._graph(), given)
        except Exception as exc:  # noqa: BLE001 - a backward refusing a layout is the finding
            self.findings.append(self._raised(
                "layout.grad_output_raises", f"backward raises on {variant.words}", exc,
                _contiguity_fix(exc, "grad_output")))
            return True
        want = self.base if variant.same_values else _backward(
            problem, *self._graph(), [g.contiguous() for g in given])
        bad = self._first_difference(got, want, problem.input_names)
        if bad and not self._nondeterministic(grads):
            self.findings.append(Finding(
                "layout.grad_output_strides",
                f"backward ignores grad_output's strides: wrong for {variant.words} ({bad[1]})",
                source=self.source, data={"layout": variant.words, "inputs": [bad[0]]}))
        return True

    def inputs(self, variant: Variant, grads: list[torch.Tensor], movable: Sequence[int]) -> bool:
        """Forward and backward with the movable inputs in this layout: all at once, then, when
        that goes wrong, one at a time, so a finding names the inputs that cause it. An input
        with a finding already is left contiguous (one finding per input, and an expensive
        forward is not re-run for every layout)."""
        leaves = [v.detach().clone() for v in self.problem.inputs]
        moved = [k for k in movable if k not in self.flagged
                 and variant.make(leaves[k], k) is not None]
        if not moved:
            return False
        together = self._attempt(variant, grads, moved)
        if together is None:
            return True
        alone = {k: self._attempt(variant, grads, [k]) for k in moved} if len(moved) > 1 else \
            {moved[0]: together}
        culprits = {k: found for k, found in alone.items() if found is not None}
        if not culprits:  # wrong only in combination: the combination is the finding
            culprits = {moved[0]: together}
            self.flagged.update(moved)
        for k, found in culprits.items():
            self.flagged.add(k)
            if not any(f.rule == found.rule and f.data == found.data for f in self.findings):
                self.findings.append(found)
        return True

    def _attempt(self, variant: Variant, grads: list[torch.Tensor], moved: Sequence[int]
                 ) -> Finding | None:
        """The finding of forward and backward with these inputs in this layout, or None."""
        problem = self.problem
        moved_names = [problem.input_names[k] for k in moved]
        names = ", ".join(map(repr, moved_names))
        what = f"{variant.words} input{'s' if len(moved) > 1 else ''} {names}"
        try:
            leaves, outs = _forward(problem, [v.detach().clone() for v in problem.inputs],
                                    {k: variant.make for k in moved})
        except Exception as exc:  # noqa: BLE001 - forward refusing a layout is the finding
            return self._raised("layout.input_raises", f"forward raises on a {what}", exc,
                                _contiguity_fix(exc, names), moved_names)
        bad = self._first_difference(outs, self.outs, problem.output_names
                                     or [f"output {k}" for k in range(len(outs))], False)
        if bad and self._forward_varies():
            return None  # the contract's finding (a stochastic forward), not a layout's
        if bad:  # a warning: code addressing storage (as_strided) may mean it
            return Finding("layout.input_values", f"forward gives other values for a {what} "
                           f"({bad[1]})", Severity.WARNING, source=self.source,
                           data={"layout": variant.words, "inputs": moved_names,
                                 "output": bad[0]})
        try:
            got = _backward(problem, leaves, outs, grads)
        except Exception as exc:  # noqa: BLE001
            return self._raised("layout.input_raises", f"backward raises after a {what}", exc,
                                "read saved tensors through their strides, or save "
                                "x.contiguous()", moved_names)
        bad = self._first_difference(got, self.base, problem.input_names)
        if bad and not self._nondeterministic(grads):
            return Finding("layout.input_strides", f"backward ignores the strides of a saved "
                           f"input: wrong for a {what} ({bad[1]})", source=self.source,
                           data={"layout": variant.words, "inputs": [*moved_names, bad[0]]})
        return None

    def _raised(self, rule: str, what: str, exc: Exception, fix: str,
                inputs: Sequence[str] = ()) -> Finding:
        if isinstance(exc, InternalError):
            raise exc
        if raised_in_gradtool(exc):
            raise InternalError(exc, gradtool_frame(exc)) from exc
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return Finding(rule, f"{what}: {type(exc).__name__}: {first}; fix: {fix}",
                       source=innermost_user_frame(exc) or self.source,
                       data={"inputs": list(inputs), "exception": type(exc).__name__})

    def _first_difference(self, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                          names: Sequence[str], gradients: bool = True
                          ) -> tuple[str, str] | None:
        """(name, words) of the first tensor that differs, or None (`gradients`: got holds a
        gradient per input, else forward's outputs, judged at their own scale)."""
        scales = self.scales if gradients else [0.0] * len(got)
        # the largest gradient of either backward compared (a constant grad_output's differs)
        floor = max([self.floor, *map(_max_abs, want)]) if gradients else 0.0
        for k, (have, expect, name, scale) in enumerate(zip(got, want, names, scales)):
            text = difference(have, expect, self.config.nondet_tol, name, scale, floor)
            if text and gradients and self.grads:  # against backward's measured rounding too
                text = difference(have, expect, self.config.nondet_tol, name, scale, floor,
                                  MEASURED_SLACK * self._noise()[k])
            if text and gradients and self.grads:  # a tensor that cancels whole: its terms'
                text = difference(have, expect, self.config.nondet_tol, name, scale,
                                  max(floor, self._terms().get(have.numel(), 0.0)),
                                  MEASURED_SLACK * self._noise()[k], "its terms' scale")
            if text:
                return name, text
        return None

    def _noise(self) -> list[float]:
        """Per input, backward's own rounding noise, measured once (a gradient that cancels
        hides its terms' scale inside backward: a normalisation over one element's 1/std)."""
        if self.noise is None:
            self.noise = measured_noise(
                lambda g: _backward(self.problem, *self._graph(), g), (self.grads, self.base))
        return self.noise

    def _terms(self) -> dict[int, float]:
        """The scale of the terms backward combines, per element count, recorded once: where
        neither the gradients nor backward at a scaled grad_output show it (a summed
        softmax's g − g·Σs summed in another order per call)."""
        if self.terms is None:
            self.terms = terms_scale(lambda g: _backward(self.problem, *self._graph(), g),
                                     self.grads)
        return self.terms

    def _forward_varies(self) -> bool:
        _, again = _forward(self.problem, [v.detach().clone() for v in self.problem.inputs])
        return self._first_difference(again, self.outs, ["output"] * len(again), False) \
            is not None

    def _nondeterministic(self, grads: list[torch.Tensor]) -> bool:
        """A backward that differs from itself is the contract's finding, not a layout's."""
        again = _backward(self.problem, *self._graph(), grads)
        return self._first_difference(again, self.base, self.problem.input_names) is not None


def _contiguity_fix(exc: Exception, names: str) -> str:
    """The fix for a layout that raised, matching what raised: a view, or code needing the
    memory contiguous (where: the raising line, the finding's source)."""
    text = str(exc)
    if "view size is not compatible" in text or "Use .reshape(" in text:
        return f"use reshape instead of view where it raised, or call .contiguous() on {names} first"
    return f"call .contiguous() on {names} before the line that raised, which needs that layout"


def _max_abs(t: torch.Tensor) -> float:
    finite = t.detach().abs()[torch.isfinite(t.detach().abs())]
    return float(finite.max()) if finite.numel() else 0.0


def _identical(have: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit the same strided values (NaN never equals itself: left to the tolerance)."""
    return (have.layout == want.layout == torch.strided and have.dtype == want.dtype
            and torch.equal(have.detach(), want.detach()))


def difference(have: torch.Tensor, want: torch.Tensor, nondet_tol: float, name: str,
               scale: float = 0.0, floor: float = 0.0, measured: float = 0.0,
               floor_from: str = "the backward's largest gradient") -> str | None:
    """'gradient of x at (1, 0): 0.3, contiguous 1.2; 6 of 12 elements differ', or None when
    the two agree within the dtype's rounding (of their own scale, and FLOOR_ULPS of `floor`:
    the largest gradient of the backward that gave them; `measured`: backward's own rounding,
    measured, MEASURED_SLACK times). The bound goes through the door (numerics/bounds.py):
    finite, below the size of the values the backward compares (a sign flip of a gradient a
    tenth of the largest is no rounding in bfloat16, whose 64 ulps are half of it), and
    never tighter than --nondet-tol."""
    if have.shape != want.shape:
        return f"{name}: shape {tuple(have.shape)}, contiguous {tuple(want.shape)}"
    if want.numel() == 0 or not (want.is_floating_point() or want.is_complex()):
        return None
    if _identical(have, want):  # the usual outcome: no tolerance to work out
        return None
    have, want = have.detach().to(want.dtype), want.detach()
    eps = torch.finfo(want.real.dtype if want.is_complex() else want.dtype).eps
    scale = max(_max_abs(want), scale)
    noise = scale <= NOISE_ULPS * eps * floor  # it cancels whole: the backward's scale
    own = min(ROUNDING_ULPS * eps, ROUNDING_CAP) * max(scale, 1e-30)
    tol = max(own, FLOOR_ULPS * eps * floor if noise else 0.0) + nondet_tol + measured
    door = admit(tol, have, want, origin=_origin(noise, floor_from, measured),
                 scale=max(scale, floor if noise else 0.0), floor=own + nondet_tol)
    diff = (have - want).abs().nan_to_num(float("inf"))
    same_nan = torch.isnan(have.abs()) == torch.isnan(want.abs())
    bad = ((diff > door.tol) & ~(torch.isnan(want.abs()) & same_nan)) | ~same_nan
    if not bool(bad.any()):
        return None
    flat = int(torch.where(bad, diff, torch.zeros_like(diff)).reshape(-1).argmax())
    index = tuple(unravel(flat, tuple(want.shape)))
    a, b = have.reshape(-1)[flat].item(), want.reshape(-1)[flat].item()
    shown = _apart(a, b)
    cut = door.words() if bool(door.capped.reshape(-1)[flat]) else None
    return (f"'{name}'{list(index)}: {shown[0]}, contiguous {shown[1]} (differing by "
            f"{abs(a - b):.3g}, "
            f"beyond the {float(door.tol.reshape(-1)[flat]):.3g} allowed"
            f"{f'; {cut}' if cut else ''}); {int(bad.sum())} of {want.numel()} "
            "elements differ")


def _origin(noise: bool, floor_from: str, measured: float) -> str:
    """Where difference's bound came from, each widening with its factor."""
    parts = [f"{ROUNDING_ULPS} ulps of the gradient's scale (at most {ROUNDING_CAP:g} of it)"]
    if noise:
        parts.append(f"{FLOOR_ULPS} ulps of {floor_from} (the gradient cancels whole)")
    if measured:
        parts.append(f"{MEASURED_SLACK:g} x backward's measured rounding")
    return " + ".join(parts)


def _apart(a: complex | float, b: complex | float) -> tuple[str, str]:
    """Two differing values printed with the fewest digits (6 at least) that tell them apart:
    a finding never prints equal numbers as differing."""
    for digits in (6, 9, 12, 17):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


@calls_user_code
def _forward(problem: Problem, leaves: list[torch.Tensor],
             moved: dict[int, Callable[..., torch.Tensor]] | None = None
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the tensors to differentiate at, outputs) with a recorded graph; inputs numbered in
    `moved` are passed rebuilt in another layout (the same values) by differentiable ops."""
    leaves = [leaf.detach().requires_grad_(True) for leaf in leaves]
    with torch.enable_grad(), problem.rng():
        problem.calls["forward"] += 1
        passed = [leaf.clone() if problem.mutates else leaf for leaf in leaves]
        for k, build in (moved or {}).items():
            passed[k] = build(passed[k], k)  # differentiable: gradients reach the leaf
        outs = select_outputs(problem.fn(*problem.with_inputs(passed)), problem.output_mask)
    # Differentiated at the tensors the target received: a gradient the layout's view ops
    # cannot carry back (nn.Embedding(sparse=True)'s) needs no trip through them. A forward
    # that writes its inputs wrote those tensors: it is differentiated at the leaves.
    return (leaves if problem.mutates else passed), outs


@calls_user_code
def _backward(problem: Problem, leaves: list[torch.Tensor], outs: list[torch.Tensor],
              grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """vᵀJ with grad_outputs passed as they are (Problem.vjp would give them storage of their
    own, contiguous: the very layout this check must avoid)."""
    problem.calls["backward"] += 1
    with problem.bind(problem.with_inputs(leaves)):
        return vjp(outs, leaves, grads)
