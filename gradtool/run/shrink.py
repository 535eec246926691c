"""Shrinking a failing case: smaller sizes, simpler values, while it still fails the same way."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import GradtoolError
from ..results import CheckResult, Outcome, Severity
from ..targets.inputs import Keyword, LiteralSpec, TensorSpec
from .runner import CaseSpec, Job, case_for, run_case

MAX_VALUES = 64  # values are simplified (and written literally) only for cases this small

def failure_kind(result: CheckResult) -> str:
    """How a check fails, as a shrunk case must repeat it: by origin, as Hypothesis tells one
    failure from another: the first mismatched block and the rules found in it (a factor may
    change with the size, a mean's 1/n, so data never counts), else the rules broken."""
    rules = [f.rule for f in result.findings if f.severity is Severity.FAILURE]
    block = next((b for b in result.blocks if b.mismatched), None)
    if block is not None:
        here = sorted({f.rule for f in result.findings if f.severity is Severity.FAILURE
                       and (f.data.get("input"), f.data.get("output")) == (block.input,
                                                                            block.output)})
        return f"'{block.input}' -> {block.output}: {', '.join(here) or 'mismatch'}"
    if rules:
        return "broken rule " + ", ".join(sorted(set(rules)))
    return f"{result.name} {result.outcome.value}"


@dataclass
class Shrunk:
    """Where shrinking got: the inputs (specs; given values once simplified), how many checks
    it ran, and whether the budget stopped it."""

    check: str
    kind: str
    specs: list[Any]
    seed: int
    before: str
    after: str
    checks_run: int
    exhausted: bool
    values: bool = False  # the tensor inputs are simplified given values, not seeded samples
    note: str = ""


class Shrinker:
    """Greedy shrinking (as Hypothesis and delta debugging do): try each smaller candidate in
    turn, keep the first that fails the same way, start again from it; stop at a case no
    candidate improves, or when the budget of checks is spent."""

    def __init__(self, job: Job, check: str, seed: int, budget: int) -> None:
        self.job = replace(job, config=job.config.with_(checks=(check,)), xfail={})
        self.check, self.seed, self.budget = check, seed, budget
        self.runs = 0
        self.kind: str | None = None
        self.tried: set[str] = set()

    def outcome(self, specs: list[Any], label: str = "shrinking") -> CheckResult | None:
        """The check's result on these inputs (None: they are not valid inputs at all)."""
        self.runs += 1
        try:
            result = run_case(self.job, CaseSpec(label, specs, self.seed))
        except GradtoolError:
            return None
        return next((c for c in result.checks if c.name == self.check), None)

    def same(self, specs: list[Any]) -> bool:
        result = self.outcome(specs)
        return (result is not None and result.outcome is Outcome.FAILED
                and failure_kind(result) == self.kind)

    def left(self) -> bool:
        return self.runs < self.budget

    def sizes(self, specs: list[Any]) -> list[Any]:
        improved = True
        while improved and self.left():
            improved = False
            for candidate in smaller(specs):
                key = describe(candidate)
                if key in self.tried:
                    continue
                if not self.left():
                    break
                self.tried.add(key)
                if self.same(candidate):
                    specs, improved = candidate, True
                    break
        return specs

    def values(self, specs: list[Any]) -> list[Any] | None:
        """Simpler values (integers, then one decimal) for a small case, if it still fails."""
        if not flat(specs):
            return None
        case = case_for(self.job, CaseSpec("shrinking", specs, self.seed))
        if sum(v.numel() for v in tensors(case.problem.args)) > MAX_VALUES:
            return None
        for decimals in (0, 1):
            if not self.left():
                return None
            candidate = simplified(specs, case.problem.args, decimals)
            if candidate is not None and self.same(candidate):
                return candidate
        return None


def shrink(job: Job, spec: CaseSpec, check: str, budget: int) -> Shrunk | None:
    """Shrink one failing case of job; None when it does not fail the same way here (the
    first check of the budget confirms it)."""
    shrinker = Shrinker(job, check, spec.seed, budget)
    specs = list(spec.inputs) if spec.inputs is not None else \
        list(case_for(shrinker.job, spec).specs)
    first = shrinker.outcome(specs, spec.label)
    if first is None or first.outcome is not Outcome.FAILED:
        return None
    shrinker.kind = failure_kind(first)
    shrinker.tried.add(describe(specs))
    small = shrinker.sizes(specs) if shapes_of(specs) else specs
    simple = shrinker.values(small) if shapes_of(small) and shrinker.left() else None
    exhausted = not shrinker.left()
    note = "" if shapes_of(specs) else "given values replayed as they are, not shrunk"
    return Shrunk(check, shrinker.kind, simple or small, spec.seed, describe(specs),
                  describe(small), shrinker.runs, exhausted, simple is not None, note)


def tensors(values: Sequence[Any]) -> list[Any]:
    import torch

    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _slots(specs: Sequence[Any]) -> list[int]:
    """Positions of the tensor inputs that can shrink (top level, or keyword)."""
    return [k for k, s in enumerate(specs)
            if isinstance(s.spec if isinstance(s, Keyword) else s, TensorSpec)]


def _tensor(spec: Any) -> TensorSpec:
    return spec.spec if isinstance(spec, Keyword) else spec


def shapes_of(specs: Sequence[Any]) -> list[tuple[int, ...]]:
    return [_tensor(specs[k]).shape for k in _slots(specs)]


def _with_shapes(specs: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    out = list(specs)
    for k, shape in zip(_slots(specs), shapes):
        new = replace(_tensor(out[k]), shape=tuple(shape))
        out[k] = Keyword(out[k].name, new) if isinstance(out[k], Keyword) else new
    return out


def _targets(size: int) -> list[int]:
    """Smaller sizes to try for a dimension, smallest first (1 is the goal, halving the way)."""
    return sorted({t for t in (1, 2, size // 2, size - 1) if 0 < t < size})


def smaller(specs: Sequence[Any]) -> Iterator[list[Any]]:
    """Candidates, boldest first: every dimension of one size together (dimensions that must
    agree, a matmul's inner size, a square matrix, shrink as one), then each one alone."""
    shapes = shapes_of(specs)
    for size in sorted({d for s in shapes for d in s if d > 1}, reverse=True):
        for t in _targets(size):
            yield _with_shapes(specs, [tuple(t if d == size else d for d in s) for s in shapes])
    for k, shape in enumerate(shapes):
        for axis, size in enumerate(shape):
            for t in _targets(size):
                new = list(shapes)
                new[k] = shape[:axis] + (t,) + shape[axis + 1:]
                yield _with_shapes(specs, new)


def simplified(specs: Sequence[Any], args: Sequence[Any], decimals: int) -> list[Any] | None:
    """The sampled tensors rounded (a zero pushed to ±1 or ±0.1, away from kinks at 0), given
    as values in place of their specs; None when nothing would change."""
    import torch

    from ..targets.values import ValueSpec

    out, changed = list(specs), False
    for k, value in zip(_slots(specs), _slot_values(specs, args)):
        spec = _tensor(specs[k])
        if not value.is_floating_point():
            continue  # indices and masks stay as sampled
        step = float(f"{10.0 ** -decimals:.{decimals}f}")
        # Rounded through decimal text, so the test file's literals are exactly these values.
        rounded = torch.tensor([float(f"{x:.{decimals}f}") for x in value.reshape(-1).tolist()],
                               dtype=value.dtype, device=value.device).reshape(value.shape)
        rounded = torch.where(rounded == 0, torch.where(value < 0, -step, step), rounded)
        changed |= not torch.equal(rounded, value)
        given = ValueSpec(rounded.detach().clone(), spec.differentiable(), spec.name)
        out[k] = Keyword(out[k].name, given) if isinstance(out[k], Keyword) else given
    return out if changed else None


def flat(specs: Sequence[Any]) -> bool:
    """Every input a single tensor or literal (no nesting, no given value): one leaf each."""
    return all(isinstance(s.spec if isinstance(s, Keyword) else s, (TensorSpec, LiteralSpec))
               for s in specs)


def _slot_values(specs: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """The sampled value of each slot: the case's leaves are the positional inputs, then the
    keyword ones (targets/cases.py's order), one leaf each when the specs are flat."""
    order = ([k for k, s in enumerate(specs) if not isinstance(s, Keyword)]
             + [k for k, s in enumerate(specs) if isinstance(s, Keyword)])
    position = {k: i for i, k in enumerate(order)}
    return [args[position[k]] for k in _slots(specs)]


def describe(specs: Sequence[Any]) -> str:
    """'6x40, 2.5': the inputs as a reader compares them."""
    parts = []
    for spec in specs:
        inner = spec.spec if isinstance(spec, Keyword) else spec
        prefix = f"{spec.name}=" if isinstance(spec, Keyword) else ""
        if isinstance(inner, TensorSpec):
            text = "x".join(map(str, inner.shape)) if inner.shape else "()"
        elif isinstance(inner, LiteralSpec):
            text = repr(inner.value)
        else:
            text = getattr(inner, "describe", lambda: repr(inner))()
        parts.append(prefix + text)
    return ", ".join(parts)
