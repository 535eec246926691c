"""compiled: first- and second-order gradients under torch.compile against eager mode."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..numerics.compare import unravel
from ..numerics.problem import Problem, select_outputs
from ..results import CheckResult, Outcome
from ..targets.cases import Case
from ..tracebacks import calls_user_code
from ._common import Context, calls_since

NAME = "compiled"


def backend() -> str:
    """inductor where a C compiler is present, else aot_eager (which needs none);
    GRADTOOL_COMPILE_BACKEND overrides."""
    forced = os.environ.get("GRADTOOL_COMPILE_BACKEND")
    if forced:
        return forced
    return "inductor" if shutil.which("cc") or shutil.which("gcc") else "aot_eager"


def applies(case: Case, context: Context) -> str | None:
    return None if case.problem.diff else "no differentiable inputs"


@calls_user_code
def _compile(fn: Any, backend_name: str) -> Any:
    """torch.compile of the target: what it raises (a bad backend, a failed trace) is a result."""
    return torch.compile(fn, backend=backend_name)


def run(case: Case, context: Context) -> CheckResult:
    """The same v and w through eager and compiled: vᵀJ, then the gradient of ⟨vᵀJ, w⟩."""
    start, problem, config = time.perf_counter(), case.problem, context.config
    before = dict(problem.calls)
    name = backend()
    gen = torch.Generator().manual_seed(case.seed + 53)
    eager = _gradients(problem, problem.fn, gen, case.seed)
    torch._dynamo.reset()
    try:
        compiled = _gradients(problem, _compile(problem.fn, name), gen, case.seed)
    except Exception as exc:  # a compile failure is a result, never a crash of gradtool
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        return CheckResult(NAME, Outcome.ERROR, f"torch.compile (backend {name}) failed: "
                           f"{type(exc).__name__}: {first}", source=context.target.source,
                           calls=calls_since(problem, before),
                           duration_s=time.perf_counter() - start)
    breaks = _graph_breaks(problem)
    found = _compare("first-order gradient", eager[0], compiled[0], problem.input_names, config)
    found += _compare("second-order gradient", eager[1], compiled[1], problem.input_names,
                      config)
    details = tuple(found[1:]) + breaks
    common: dict[str, Any] = {
        "calls": calls_since(problem, before), "duration_s": time.perf_counter() - start,
        "tolerance": {"atol": config.tolerance("atol"), "rtol": config.tolerance("rtol")}}
    if found:
        return CheckResult(NAME, Outcome.FAILED, f"under torch.compile (backend {name}) the "
                           f"{found[0]}", details, source=context.target.source, **common)
    return CheckResult(NAME, Outcome.PASSED, f"first- and second-order gradients under "
                       f"torch.compile (backend {name}) equal eager's", details, **common)


def _gradients(problem: Problem, fn: Callable[..., Any], gen: torch.Generator, seed: int
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    leaves = [v.detach().clone().requires_grad_(True) for v in problem.inputs]
    with torch.enable_grad(), problem.rng():
        problem.calls["forward"] += 1
        outs = [o for o in select_outputs(fn(*problem.with_inputs(leaves)), None)
                if o.requires_grad]
        g = torch.Generator().manual_seed(seed + 59)
        vs = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o) for o in outs]
        first = torch.autograd.grad(outs, leaves, vs, create_graph=True, allow_unused=True,
                                    materialize_grads=True)
        problem.calls["backward"] += 1
        ws = [torch.randn(x.shape, generator=g, dtype=torch.float64).to(x) for x in leaves]
        total = sum((f * w).sum() for f, w in zip(first, ws) if f.requires_grad)
        second = (torch.autograd.grad(total, leaves, allow_unused=True, materialize_grads=True)
                  if isinstance(total, torch.Tensor) else [torch.zeros_like(x) for x in leaves])
        problem.calls["backward"] += 1
    return [f.detach() for f in first], [s.detach() for s in second]


def _graph_breaks(problem: Problem) -> tuple[str, ...]:
    """What torch._dynamo.explain says about graph breaks (informational: gradients decide)."""
    try:
        explained = torch._dynamo.explain(problem.fn)(*problem.args)
    except Exception as exc:  # explain is best effort: its failure is not the target's
        return (f"graph breaks unknown: torch._dynamo.explain raised {type(exc).__name__}",)
    count = getattr(explained, "graph_break_count", 0)
    if not count:
        return ()
    reasons = "; ".join(str(getattr(b, "reason", b)).splitlines()[0]
                        for b in explained.break_reasons[:3])
    return (f"{count} graph break(s): {reasons}",)


def _compare(what: str, eager: Sequence[torch.Tensor], compiled: Sequence[torch.Tensor],
             names: Sequence[str], config: Any) -> list[str]:
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    lines = []
    for name, e, c in zip(names, eager, compiled):
        diff = (c - e).abs().nan_to_num(float("inf"))
        bad = diff > atol + rtol * e.abs()
        if bool(bad.any()):
            flat = int(torch.where(bad, diff, torch.zeros_like(diff)).reshape(-1).argmax())
            index = list(unravel(flat, tuple(e.shape)))
            lines.append(f"{what} of '{name}'{index} is {c.reshape(-1)[flat].item():.6g}, "
                         f"eager {e.reshape(-1)[flat].item():.6g} ({int(bad.sum())} of "
                         f"{e.numel()} elements differ)")
    return lines
