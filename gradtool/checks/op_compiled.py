"""op_compiled (opt-in): the op's outputs and gradients under AOTDispatcher (torch.compile's
tracing, dynamic sizes) equal eager's; opcheck's test_aot_dispatch_dynamic, in gradtool's words."""

from __future__ import annotations

import time
import warnings
from typing import Any

from ..results import CheckResult, Finding
from ._common import skipped
from ._ops import applies, clone_args, interpreted_triton, overload, registered_at, result

__all__ = ["applies", "run"]

_TEST = "test_aot_dispatch_dynamic"


def run(case: Any, context: Any) -> CheckResult:
    import torch

    from .op_autograd import registered

    start = time.perf_counter()
    op, problem = overload(context), case.problem
    source = registered_at(context)
    if interpreted_triton(op):
        return skipped("op_compiled", f"not run: {interpreted_triton(op)}")
    args = clone_args(problem.args)
    grads = registered(op, context.config.device)
    for position in problem.diff if grads else ():
        args[position].requires_grad_(True)  # gradients compared too, as opcheck does
    problem.calls["forward"] += 1
    with warnings.catch_warnings():  # opcheck runs backward in anomaly mode: its notice is noise
        warnings.simplefilter("ignore", UserWarning)
        outcome = torch.library.opcheck(op, tuple(args), test_utils=(_TEST,),
                                        raise_exception=False)
    error = outcome.get(_TEST)
    if not isinstance(error, BaseException):
        what = "outputs and gradients" if grads and problem.diff else "outputs"
        return result("op_compiled", [], f"{what} under AOTDispatcher with dynamic sizes (what "
                      "torch.compile traces) equal eager's", start, case, source)
    return result("op_compiled", [_finding(op, error, source)], "", start, case, source)


def _finding(op: Any, error: BaseException, source: str | None) -> Finding:
    text = str(error)
    cause = error.__cause__
    detail = (str(cause).strip().splitlines() or [""])[0][:200] if cause else ""
    name = op._schema.name
    if text.startswith("Outputs of the operator are different"):
        return Finding("op_compiled.outputs",
                       f"{name}'s outputs under torch.compile differ from eager's"
                       + (f" ({detail})" if detail else "")
                       + ": the kernel is not traceable as registered (a fake kernel or "
                       "schema that does not match it?)", source=source)
    if text.startswith("Gradients of the operator are different"):
        return Finding("op_compiled.gradients",
                       f"{name}'s gradients under torch.compile differ from eager's"
                       + (f" ({detail})" if detail else "")
                       + ": its backward is not traceable as registered (does it read "
                       "ctx attributes that setup_context did not save?)", source=source)
    first = (text.strip().splitlines() or [""])[0][:240]
    return Finding("op_compiled.fails",
                   f"{name} fails under torch.compile's tracing (dynamic sizes): "
                   f"{type(error).__name__}: {first}", source=source)
