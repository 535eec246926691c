"""compiled: first- and second-order gradients under torch.compile against eager mode."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..numerics.compare import unravel
from ..numerics.problem import Problem, select_outputs
from ..numerics.sparse import dense_output
from ..results import CheckResult, Finding, Outcome
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
    if case.problem.sparse:
        return "sparse inputs: torch.compile's support for sparse tensors is partial, not compared"
    return None if case.problem.diff else "no differentiable inputs"


@calls_user_code
def _compile(fn: Any, backend_name: str) -> Any:
    """torch.compile of the target: what it raises (a bad backend, a failed trace) is a result."""
    return torch.compile(fn, backend=backend_name)


def run(case: Case, context: Context) -> CheckResult:
    """The same v and w through eager and compiled: vᵀJ, then the gradient of ⟨vᵀJ, w⟩.

    First order decides wherever torch.compile runs the target. Second order is compared where
    compiled code can be differentiated twice; where it cannot (aot_autograd refuses double
    backward) that part is skipped with torch's reason. torch's own log during compilation is
    captured into the result's details, never printed."""
    start, problem, config = time.perf_counter(), case.problem, context.config
    before = dict(problem.calls)
    name = backend()
    eager = _first(problem, problem.fn, case.seed), _second(problem, problem.fn, case.seed)
    common: dict[str, Any] = {
        "tolerance": {"atol": config.tolerance("atol"), "rtol": config.tolerance("rtol")}}
    with _captured_log() as log:
        torch._dynamo.reset()
        try:
            compiled_fn = _compile(problem.fn, name)
            first = _first(problem, compiled_fn, case.seed)
        except Exception as exc:  # a compile failure is a result, never a crash of gradtool
            return CheckResult(NAME, Outcome.ERROR, f"torch.compile (backend {name}) failed: "
                               f"{_one_line(exc)}", _log_details(log), source=context.target.source,
                               calls=calls_since(problem, before),
                               duration_s=time.perf_counter() - start)
        second, second_skipped = _second_or_reason(problem, compiled_fn, case.seed)
        breaks = _graph_breaks(problem)
    found = _compare("compiled.first_order", "first-order gradient", eager[0], first,
                     problem.input_names, config)
    if second is not None:
        found += _compare("compiled.second_order", "second-order gradient", eager[1], second,
                          problem.input_names, config)
    skipped = (f"second order skipped: {second_skipped}",) if second_skipped and found else ()
    details = skipped + breaks + _log_details(log)
    common.update(calls=calls_since(problem, before), duration_s=time.perf_counter() - start)
    if found:
        return CheckResult(NAME, Outcome.FAILED, f"under torch.compile (backend {name}) the "
                           f"{found[0].message}", details, source=context.target.source,
                           findings=tuple(found), **common)
    what = "first-order gradients" if second is None else "first- and second-order gradients"
    summary = f"{what} under torch.compile (backend {name}) equal eager's"
    if second_skipped:
        summary += f"; second order skipped: {second_skipped}"
    return CheckResult(NAME, Outcome.PASSED, summary, details, **common)


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:240]
    return f"{type(exc).__name__}: {first}"


def _second_or_reason(problem: Problem, fn: Callable[..., Any], seed: int
                      ) -> tuple[list[torch.Tensor] | None, str | None]:
    """Compiled second-order gradients, or (None, torch's reason) where compiled code cannot be
    differentiated twice (eager could: its second order ran first)."""
    try:
        return _second(problem, fn, seed), None
    except Exception as exc:  # noqa: BLE001 - torch's limit, not the target's: eager ran
        return None, f"torch.compile cannot differentiate this twice ({_one_line(exc)})"


def _leaves_and_outputs(problem: Problem, fn: Callable[..., Any]
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    leaves = [v.detach().clone().requires_grad_(True) for v in problem.inputs]
    problem.calls["forward"] += 1
    outs = [o for o in select_outputs(fn(*problem.with_inputs(leaves)), None) if o.requires_grad]
    return leaves, outs


def _vectors(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor], seed: int
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """v (one per output) and w (one per input), the same for eager and compiled."""
    g = torch.Generator().manual_seed(seed + 59)
    vs = [torch.randn(o.shape, generator=g, dtype=torch.float64, device="cpu").to(o) for o in outs]
    ws = [torch.randn(x.shape, generator=g, dtype=torch.float64, device="cpu").to(x)
          for x in leaves]
    return vs, ws


def _first(problem: Problem, fn: Callable[..., Any], seed: int) -> list[torch.Tensor]:
    """vᵀJ, without a graph of it (what compiled code always supports)."""
    with torch.enable_grad(), problem.rng():
        leaves, outs = _leaves_and_outputs(problem, fn)
        vs, _ = _vectors(outs, leaves, seed)
        first = torch.autograd.grad(outs, leaves, vs, allow_unused=True,
                                    materialize_grads=True) if outs else \
            [torch.zeros_like(x) for x in leaves]
        problem.calls["backward"] += 1
    return [dense_output(f).detach() for f in first]  # a sparse gradient: the values it means


def _second(problem: Problem, fn: Callable[..., Any], seed: int) -> list[torch.Tensor]:
    """The gradient of ⟨vᵀJ, w⟩: backward differentiated once more."""
    with torch.enable_grad(), problem.rng():
        leaves, outs = _leaves_and_outputs(problem, fn)
        vs, ws = _vectors(outs, leaves, seed)
        if not outs:
            return [torch.zeros_like(x) for x in leaves]
        first = torch.autograd.grad(outs, leaves, vs, create_graph=True, allow_unused=True,
                                    materialize_grads=True)
        problem.calls["backward"] += 1
        first = [dense_output(f) for f in first]
        total = sum((f * w).sum() for f, w in zip(first, ws) if f.requires_grad)
        second = (torch.autograd.grad(total, leaves, allow_unused=True, materialize_grads=True)
                  if isinstance(total, torch.Tensor) else [torch.zeros_like(x) for x in leaves])
        problem.calls["backward"] += 1
    return [dense_output(t).detach() for t in second]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.extend(f"torch log: {line}" for line in self.format(record).splitlines())
        except Exception:  # noqa: BLE001 - a log line that cannot format is dropped
            pass


@contextlib.contextmanager
def _captured_log() -> Iterator[list[str]]:
    """torch's loggers write to our list instead of stderr (and torch's warnings too), for
    the duration; their handlers are restored after."""
    handler = _Lines()
    saved: dict[logging.Logger, list[logging.Handler]] = {}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger) \
                and logger.handlers:
            saved[logger] = list(logger.handlers)
            logger.handlers = [handler]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield handler.lines
        handler.lines.extend(f"torch warning: {w.message}" for w in caught)
    finally:
        for logger, handlers in saved.items():
            logger.handlers = handlers


def _log_details(lines: Sequence[str], keep: int = 40) -> tuple[str, ...]:
    if len(lines) <= keep:
        return tuple(lines)
    return (*lines[:keep], f"torch log: ... {len(lines) - keep} more line(s)")


def _graph_breaks(problem: Problem) -> tuple[str, ...]:
    """What torch._dynamo.explain says about graph breaks (informational: gradients decide)."""
    try:
        explained = torch._dynamo.explain(problem.fn)(*problem.with_inputs(problem.inputs))
    except Exception as exc:  # explain is best effort: its failure is not the target's
        return (f"graph breaks unknown: torch._dynamo.explain raised {type(exc).__name__}",)
    count = getattr(explained, "graph_break_count", 0)
    if not count:
        return ()
    reasons = "; ".join(str(getattr(b, "reason", b)).splitlines()[0]
                        for b in explained.break_reasons[:3])
    return (f"{count} graph break(s): {reasons}",)


def _compare(rule: str, what: str, eager: Sequence[torch.Tensor],
             compiled: Sequence[torch.Tensor], names: Sequence[str], config: Any
             ) -> list[Finding]:
    """One finding of `rule` per input whose gradient differs, naming its worst element."""
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    lines = []
    for name, e, c in zip(names, eager, compiled):
        diff = (c - e).abs().nan_to_num(float("inf"))
        bad = diff > atol + rtol * e.abs()
        if bool(bad.any()):
            flat = int(torch.where(bad, diff, torch.zeros_like(diff)).reshape(-1).argmax())
            index = list(unravel(flat, tuple(e.shape)))
            got, want = c.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()
            lines.append(Finding(rule, f"{what} of '{name}'{index} is {got:.6g}, eager "
                                 f"{want:.6g} ({int(bad.sum())} of {e.numel()} elements differ)",
                                 data={"input": name, "index": index, "compiled": got,
                                       "eager": want, "differ": int(bad.sum()),
                                       "elements": e.numel()}))
    return lines
