"""The layouts each inner Function received in a model (input and grad_output strides), and its
re-check in exactly those layouts: a Function that passes on contiguous tensors may still be the
culprit when the model hands it a transposed gradient."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem, function_nodes
from ..results import CheckResult, Outcome, Severity
from .applyhook import Call, hooked
from .culprit import Application, FunctionFinding, _is_torch, _Recorder, captured_case
from .culprit import annotate as _annotate

Strides = tuple[tuple[int, ...], tuple[int, ...], int]  # shape, stride, storage offset


@dataclass
class Received:
    """The strides of one application's tensor arguments (by position) and grad_outputs."""

    inputs: dict[int, Strides] = field(default_factory=dict)
    grads: list[Strides | None] = field(default_factory=list)


class _StrideRecorder(_Recorder):
    """culprit's recorder, also noting the strides of each application's tensor arguments
    (its snapshots are clones: a slice or an expanded tensor comes out contiguous)."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[int, Received] = {}

    def _enter(self, call: Call) -> Application:
        app = super()._enter(call)
        self.received[id(app)] = Received(
            {k: _strides(v) for k, v in enumerate(call.args) if _is_dense(v)})
        return app


def _is_dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _strides(t: torch.Tensor) -> Strides:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def capture(problem: Problem) -> list[tuple[Application, Received]]:
    """One forward and one backward of the model: each applied Function in the graph with the
    strides of what it received, grad_outputs included (a pre-hook on its node)."""
    recorder = _StrideRecorder()
    with hooked(recorder):
        leaves, outs = problem.graph()
    nodes = function_nodes(outs)
    recorder.settle(nodes)
    used = [app for app in recorder.calls if app.node is not None and id(app.node) in nodes
            and not _is_torch(app.cls)]
    handles = []
    for app in used:
        received = recorder.received[id(app)]

        def hook(grad_outputs: Sequence[Any], received: Received = received) -> None:
            received.grads = [_strides(g) if _is_dense(g) else None for g in grad_outputs]

        handles.append(app.node.register_prehook(hook))
    try:
        gen = torch.Generator().manual_seed(59)
        grads = [torch.randn(o.shape, generator=gen, dtype=torch.float64, device="cpu").to(o)
                 for o in outs]
        problem.vjp(leaves, outs, grads)
    finally:
        for handle in handles:
            handle.remove()
    return [(app, recorder.received[id(app)]) for app in used]


def restride(t: torch.Tensor, strides: Strides | None, differentiable: bool = False
             ) -> torch.Tensor | None:
    """t's values in the captured strides (None: nothing to change, or a layout that cannot
    hold them). A stride-0 dimension repeats t's first slice along it, as .expand() does."""
    if strides is None or tuple(t.shape) != strides[0]:
        return None
    shape, stride, offset = strides
    if t.numel() < 2 or (stride == tuple(t.stride()) and offset == t.storage_offset()):
        return None
    if any(s == 0 and n > 1 for s, n in zip(stride, shape)):
        index = tuple(slice(0, 1) if s == 0 else slice(None) for s in stride)
        return t[index].clone().expand(shape)
    span = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    buffer = torch.full((span,), float("nan"), dtype=t.dtype, device=t.device)
    out = buffer.as_strided(shape, stride, offset)
    if _overlaps(shape, stride):  # overlapping memory cannot hold distinct values
        return None
    out.copy_(t if differentiable else t.detach())
    return out


def _overlaps(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether two indices share memory: sorted by stride, each must step past the span of
    the smaller ones."""
    reach = 0
    for s, n in sorted((s, n) for s, n in zip(stride, shape) if n > 1):
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def describe(strides: Strides) -> str:
    """'transposed', 'expanded (stride-0)', 'channels_last', or the strides themselves."""
    shape, stride, offset = strides
    probe = torch.empty_strided(shape, stride, device="meta")  # strides only, no memory
    if any(s == 0 and n > 1 for s, n in zip(stride, shape)):
        return "expanded (stride-0)"
    if len(shape) in (4, 5) and probe.is_contiguous(
            memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d):
        return "channels_last"
    if len(shape) >= 2 and probe.mT.is_contiguous():
        return "transposed"
    where = f", storage offset {offset}" if offset else ""
    return f"strided {stride}{where}"


def annotate(result: CheckResult, problem: Problem, config: CheckConfig) -> CheckResult:
    """culprit.annotate, with the Functions that pass alone re-checked in received strides."""
    return _annotate(result, problem, config, with_received_layouts)


def with_received_layouts(problem: Problem, config: CheckConfig,
                          findings: list[FunctionFinding]) -> list[FunctionFinding]:
    """Each Function that passed alone, re-checked in the layouts the model gave it (not when
    exactly one Function fails alone: the plain re-check has named the culprit already)."""
    failed = sum(f.outcome is Outcome.FAILED for f in findings)
    if failed == 1 or not any(f.outcome is Outcome.PASSED for f in findings):
        return findings
    try:
        captured = capture(problem)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - a diagnosis: the findings so far still stand
        return findings
    by_site = {}
    for app, received in captured:
        by_site.setdefault((app.cls.__qualname__, app.created_at), (app, received))
    out = []
    for finding in findings:
        pair = by_site.get((finding.qualname, finding.created_at))
        if finding.outcome is Outcome.PASSED and pair is not None:
            finding = _recheck(finding, *pair, config, problem.freeze_seed)
        out.append(finding)
    return out


def _recheck(finding: FunctionFinding, app: Application, received: Received,
             config: CheckConfig, freeze_seed: int | None) -> FunctionFinding:
    from ..checks.layout import Variant, compare_layouts  # lazy, like culprit's checks

    target, case, own = captured_case(app, config, freeze_seed)
    problem = case.problem
    grads = received.grads
    grad_words = ", ".join(dict.fromkeys(describe(s) for s in grads if s and _moved(s)))
    grad_variant = Variant("received", f"the {grad_words} grad_output it received",
                           lambda g, k: restride(g, grads[k] if k < len(grads) else None),
                           same_values=False)
    positions = problem.diff
    input_variant = Variant("received", "received",
                            lambda x, k: restride(x, received.inputs.get(positions[k]), True))
    try:
        layouts, _ = compare_layouts(problem, own, case.seed,
                                     [grad_variant] if grad_words else [], [input_variant],
                                     range(len(positions)), target.source)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - arguments that no longer bind: keep the first verdict
        return finding
    layouts = [f for f in layouts if f.severity is Severity.FAILURE]
    if not layouts:
        return finding
    named = {n for f in layouts for n in f.data.get("inputs", ())}
    wrong = tuple(n for n in problem.input_names if n in named)
    where = finding.created_at or "an unknown line"
    text = (f"{finding.qualname} at {where} is wrong in the layouts it received (backward at "
            f"{target.source}): {layouts[0].message}")
    return replace(finding, outcome=Outcome.FAILED, wrong_inputs=wrong or ("?",), summary=text,
                   source=layouts[0].source or target.source)


def _moved(strides: Strides) -> bool:
    shape, stride, offset = strides
    return offset != 0 or not torch.empty_strided(shape, stride, device="meta").is_contiguous()
