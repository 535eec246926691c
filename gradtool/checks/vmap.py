"""vmap: a Function's vmap rule, batched forward and backward, against the per-sample loop."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..numerics.compare import unravel
from ..numerics.batching import quiet_batching
from ..numerics.problem import Problem, select_outputs, vjp
from ..numerics.transforms import grads_batched, vmap, vmap_of_vjp
from ..results import CheckResult, Finding, Outcome
from ..targets.cases import Case
from ..targets.load import source_of
from ._common import Context, calls_since

NAME = "vmap"
SAMPLES = 3


def applies(case: Case, context: Context) -> str | None:
    """On for Functions with generate_vmap_rule = True or a vmap staticmethod."""
    if _rule(context.target.function_cls) is None:
        return "no vmap rule (the Function sets no generate_vmap_rule and defines no vmap)"
    if not case.problem.diff:
        return "no differentiable inputs to batch"
    if case.problem.sparse:
        return "sparse inputs: torch.vmap batches no sparse tensor"
    return None


def _rule(cls: type | None) -> str | None:
    if cls is None:
        return None
    if _own_vmap(cls):
        return f"the vmap staticmethod ({source_of(cls.vmap)})"
    if getattr(cls, "generate_vmap_rule", False):
        return f"the generated vmap rule (generate_vmap_rule = True, forward at " \
               f"{source_of(cls.forward)})"
    return None


def _own_vmap(cls: type) -> bool:
    """The Function defines a vmap staticmethod of its own."""
    from torch.autograd import Function

    return getattr(cls, "vmap", Function.vmap) is not Function.vmap


def run(case: Case, context: Context) -> CheckResult:
    """Three samples: vmap(forward) with every input batched and with each alone; vmap of the
    VJP; and backward with batched grad_outputs (is_grads_batched); each against a loop."""
    start, problem = time.perf_counter(), case.problem
    before = dict(problem.calls)
    cls = context.target.function_cls
    rule = _rule(cls)
    config = context.config
    samples = _samples(problem, case.seed)
    found: list[Finding] = []
    subsets = [list(range(len(problem.diff)))]
    if len(problem.diff) > 1:
        subsets += [[k] for k in range(len(problem.diff))]
    with quiet_batching():
        for batched in subsets:
            found += _forward(problem, samples, batched, config)
        found += _backward(problem, samples, case.seed, config)
    skipped: list[str] = []
    with quiet_batching():  # torch's fallback warnings: what this check measures, not news
        found += _grads_batched(problem, case.seed, config, skipped)
    calls = calls_since(problem, before)
    elapsed = time.perf_counter() - start
    tolerance = {"atol": config.tolerance("atol"), "rtol": config.tolerance("rtol")}
    if not found:
        parts = "forward, vmap of the VJP" + (f"; {skipped[0]}" if skipped
                                              else ", batched grad_outputs")
        return CheckResult(NAME, Outcome.PASSED,
                           f"{rule} matches the per-sample loop over {SAMPLES} samples "
                           f"({parts})", tuple(skipped), tolerance=tolerance,
                           calls=calls, duration_s=elapsed)
    where = source_of(cls.vmap) if _own_vmap(cls) else source_of(cls.forward)
    return CheckResult(NAME, Outcome.FAILED, f"{rule} differs from the per-sample loop: "
                       f"{found[0].message}", tuple(skipped),
                       source=where, tolerance=tolerance, calls=calls, duration_s=elapsed,
                       findings=tuple(found))


def _samples(problem: Problem, seed: int) -> list[list[torch.Tensor]]:
    """SAMPLES sets of the differentiable inputs: the case's, then seeded perturbations."""
    gen = torch.Generator().manual_seed(seed + 31)
    base = [v.detach() for v in problem.inputs]
    out = [base]
    for _ in range(SAMPLES - 1):
        out.append([v + 0.5 * torch.randn(v.shape, generator=gen, dtype=torch.float64,
                                          device="cpu").to(v)
                    for v in base])
    return out


def _call(problem: Problem, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    problem.calls["forward"] += 1
    with problem.rng():
        return select_outputs(problem.fn(*problem.with_inputs(list(values))), None)


def _forward(problem: Problem, samples: list[list[torch.Tensor]], batched: list[int],
             config: Any) -> list[Finding]:
    """vmap over the inputs in `batched` (the others fixed at sample 0's) against a loop."""
    per_sample = [[s[k] if k in batched else samples[0][k] for k in range(len(s))]
                  for s in samples]
    stacked = [torch.stack([s[k] for s in per_sample]) if k in batched else samples[0][k]
               for k in range(len(samples[0]))]
    dims = tuple(0 if k in batched else None for k in range(len(stacked)))
    with torch.no_grad():
        expected = [_call(problem, s) for s in per_sample]
        got = vmap(lambda *xs: tuple(_call(problem, xs)), in_dims=dims)(*stacked)
    problem.calls["forward"] += SAMPLES - 1  # the vmapped call evaluates every sample
    names = [problem.input_names[k] for k in batched]
    what = f"forward with {', '.join(repr(n) for n in names)} batched"
    return _compare("vmap.forward", what, got, expected, problem, config)


def _backward(problem: Problem, samples: list[list[torch.Tensor]], seed: int,
              config: Any) -> list[Finding]:
    """vmap of x -> vᵀJ(x) (torch.func.vjp inside torch.func.vmap) against autograd per sample."""
    outs0 = _call(problem, samples[0])
    gen = torch.Generator().manual_seed(seed + 37)
    grads = [torch.randn((SAMPLES, *o.shape), generator=gen, dtype=torch.float64,
                         device="cpu").to(o)
             for o in outs0]

    stacked = [torch.stack([s[k] for s in samples]) for k in range(len(samples[0]))]
    got = vmap_of_vjp(lambda *x: tuple(_call(problem, x)), stacked, grads)
    expected = []
    for n, s in enumerate(samples):
        leaves = [v.clone().requires_grad_(True) for v in s]
        with torch.enable_grad():
            outs = _call(problem, leaves)
        problem.calls["backward"] += 1
        expected.append(vjp(outs, leaves, [g[n] for g in grads]))
    problem.calls["backward"] += SAMPLES
    return _compare("vmap.backward", "vmap of the VJP (backward)", got, expected, problem, config,
                    problem.input_names)


def _grads_batched(problem: Problem, seed: int, config: Any, skipped: list[str]
                   ) -> list[Finding]:
    """autograd.grad(..., is_grads_batched=True) against one backward per grad_output.

    is_grads_batched runs backward under torch's legacy batching, which lacks rules that
    torch.func has (einsum, say): where it raises but one backward per grad_output runs, this
    part is skipped with torch's reason (added to `skipped`), not an error of the user's."""
    leaves = [v.detach().clone().requires_grad_(True) for v in problem.inputs]
    with torch.enable_grad():
        outs = [o for o in _call(problem, leaves) if o.requires_grad]
    gen = torch.Generator().manual_seed(seed + 41)
    grads = [torch.randn((SAMPLES, *o.shape), generator=gen, dtype=torch.float64,
                         device="cpu").to(o)
             for o in outs]
    try:
        got = grads_batched(outs, leaves, grads)
    except Exception as exc:  # noqa: BLE001 - the user's backward, or legacy batching's limit
        vjp(outs, leaves, [g[0] for g in grads])  # raises (the user's error) if backward does
        problem.calls["backward"] += 1
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        skipped.append("batched grad_outputs (is_grads_batched) skipped: torch's legacy "
                       f"batching cannot run this backward ({reason})")
        return []
    expected = [vjp(outs, leaves, [g[n] for g in grads]) for n in range(SAMPLES)]
    problem.calls["backward"] += 2 * SAMPLES
    return _compare("vmap.grads_batched", "backward with batched grad_outputs "
                    "(is_grads_batched)", got, expected,
                    problem, config, problem.input_names)


def _compare(rule: str, what: str, got: Sequence[torch.Tensor],
             expected: list[Sequence[torch.Tensor]], problem: Problem, config: Any,
             names: Sequence[str] | None = None) -> list[Finding]:
    """One finding of `rule` per tensor that differs, naming its first bad sample's worst
    element."""
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    lines = []
    labels = names or _output_labels(len(got))
    for t, (batch, label) in enumerate(zip(got, labels)):
        bad_samples = [n for n in range(SAMPLES) if _differs(batch[n], expected[n][t], atol, rtol)]
        if not bad_samples:
            continue
        n = bad_samples[0]
        have, want = batch[n], expected[n][t]
        others = (f"; samples {', '.join(map(str, bad_samples))} of {SAMPLES} differ"
                  if len(bad_samples) > 1 else "")
        data = {"tensor": label, "sample": n, "bad_samples": bad_samples}
        if have.shape != want.shape:
            lines.append(Finding(rule, f"{what}: sample {n}, {label}: batched shape "
                                 f"{tuple(have.shape)}, per-sample {tuple(want.shape)}{others}",
                                 data={**data, "batched_shape": list(have.shape),
                                       "shape": list(want.shape)}))
            continue
        diff = (have - want).abs().nan_to_num(float("inf"))
        bad = (diff > atol + rtol * want.abs()) | (torch.isnan(have) != torch.isnan(want))
        flat = int(torch.where(bad, diff, torch.zeros_like(diff)).reshape(-1).argmax())
        index = list(unravel(flat, tuple(want.shape)))
        batched, single = have.reshape(-1)[flat].item(), want.reshape(-1)[flat].item()
        lines.append(Finding(rule, f"{what}: sample {n}, {label}{index}: batched "
                             f"{batched:.6g}, per-sample {single:.6g} ({int(bad.sum())} of "
                             f"{want.numel()} elements differ{others})",
                             data={**data, "index": index, "batched": batched,
                                   "per_sample": single, "differ": int(bad.sum()),
                                   "elements": want.numel()}))
    return lines


def _differs(have: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> bool:
    if have.shape != want.shape:
        return True
    diff = (have - want).abs().nan_to_num(float("inf"))
    return bool(((diff > atol + rtol * want.abs()) | (torch.isnan(have) != torch.isnan(want)))
                .any())


def _output_labels(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output {k}" for k in range(count)]

