"""op_autograd: an op with differentiable inputs has an autograd formula, registered at Autograd."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from ..numerics.problem import tensor_outputs
from ..results import CheckResult, Finding
from ..targets.ops import NO_RETURNS, backward_line, custom_op_def
from ..targets.ops import autograd_registered as registered
from ._ops import applies as _is_op
from ._ops import clone_args, overload, python_name, registered_at, result

__all__ = ["applies", "registered", "run"]


def applies(case: Any, context: Any) -> str | None:
    reason = _is_op(case, context)
    if reason:
        return reason
    if not case.problem.diff:
        return "no differentiable input (no floating tensor argument)"
    if not overload(context)._schema.returns:
        return NO_RETURNS
    return None


def run(case: Any, context: Any) -> CheckResult:
    start = time.perf_counter()
    op = overload(context)
    source = registered_at(context)
    names = [case.problem.names[i] for i in case.problem.diff]
    if not registered(op, context.config.device):
        wrong = custom_op_def(op) is None and _autograd_below(case)
        finding = _wrong_key(op, source) if wrong else _missing(op, names, source)
        return result("op_autograd", [finding], "", start, case, source)
    backward = backward_line(op)
    return result("op_autograd", [],
                  f"autograd formula registered for {', '.join(names)}"
                  + (f" (backward at {backward})" if backward else ""), start, case, source)


def _missing(op: Any, names: list[str], source: str | None) -> Finding:
    name = op._schema.name
    how = (f"{python_name(op)}.register_autograd(backward, setup_context=setup_context)"
           if custom_op_def(op) is not None
           else f"torch.library.register_autograd({name!r}, backward, setup_context=...)")
    return Finding("op_autograd.missing",
                   f"{name} takes differentiable input(s) {', '.join(names)} but has no "
                   f"autograd formula, so backward through it fails (or gives no gradient): "
                   f"register one with {how}; the checks that need backward are skipped",
                   source=source)


def _wrong_key(op: Any, source: str | None) -> Finding:
    return Finding("op_autograd.wrong_key",
                   f"{op._schema.name}'s outputs require grad although no autograd kernel is "
                   "registered at an Autograd key: its autograd logic sits in a backend (CPU/CUDA) "
                   "kernel, which torch.compile and other dispatch layers bypass; register it "
                   "with torch.library.register_autograd instead", source=source)


@contextlib.contextmanager
def _fallback_nothing() -> Iterator[None]:
    """Autograd's fallback leaves outputs alone, as opcheck's registration test sets it."""
    previous = torch._C._get_autograd_fallback_mode()
    torch._C._set_autograd_fallback_mode("nothing")
    try:
        yield
    finally:
        torch._C._set_autograd_fallback_mode(previous)


def _autograd_below(case: Any) -> bool:
    """An output requires grad with no Autograd kernel: autograd runs inside a backend kernel."""
    problem = case.problem
    args = clone_args(problem.args)
    for position in problem.diff:
        args[position].requires_grad_(True)
    with _fallback_nothing(), torch.enable_grad():
        problem.calls["forward"] += 1
        outs = tensor_outputs(problem.fn(*args))
    inputs = {id(a) for a in args}
    return any(o.requires_grad and id(o) not in inputs for o in outs)


