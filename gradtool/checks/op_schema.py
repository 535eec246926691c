"""op_schema: a custom op's schema says what its kernel does (input writes, aliasing outputs)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from ..numerics.problem import tensor_outputs
from ..results import CheckResult, Finding, Outcome
from ._ops import CUSTOM_OP_ALIAS, applies, clone_args, overload, python_name, registered_at, result

__all__ = ["applies", "run", "without_function_advice"]



def run(case: Any, context: Any) -> CheckResult:
    start = time.perf_counter()
    op, problem = overload(context), case.problem
    source = registered_at(context)
    args = clone_args(problem.args)
    before = clone_args(problem.args)
    try:
        with torch.no_grad():
            problem.calls["forward"] += 1
            outs = tensor_outputs(problem.fn(*args))
    except RuntimeError as exc:
        if CUSTOM_OP_ALIAS not in str(exc):
            raise
        return result("op_schema", [_alias_refused(op, source)], "", start, case, source)
    findings = _mutations(op, problem.names, args, before, source)
    findings += _aliases(op, problem.names, args, outs, source)
    mutable = [a.name for a in op._schema.arguments if _writes(a)]
    passed = ("schema holds: no undeclared write to an input, every output in its own memory"
              + (f"; declared mutable: {', '.join(mutable)}" if mutable else ""))
    return result("op_schema", findings, passed, start, case, source)


def _writes(arg: Any) -> bool:
    """The schema declares the argument written (Tensor(a!) x; custom_op's mutates_args)."""
    info = arg.alias_info
    return info is not None and info.is_write


def _schema_arg(op: Any, name: str) -> Any:
    """The schema argument a case leaf belongs to ('xs[0]' -> xs)."""
    base = name.split("[")[0].split(".")[0]
    return next((a for a in op._schema.arguments if a.name == base), None)


def _mutations(op: Any, names: list[str], args: list[Any], before: list[Any],
               source: str | None) -> list[Finding]:
    found = []
    for name, after, original in zip(names, args, before):
        if not isinstance(after, torch.Tensor) or _same(after, original):
            continue
        arg = _schema_arg(op, name)
        if arg is not None and _writes(arg):
            continue
        changed = int((~_equal_elements(after, original)).sum())
        fix = (f"declare it in mutates_args=({name!r},)" if _is_custom_op(op)
               else f"declare it in the schema as Tensor(a!) {name}")
        found.append(Finding(
            "op_schema.undeclared_mutation",
            f"{op._schema.name} writes into argument '{name}' ({changed} of {after.numel()} "
            f"elements changed) but its schema does not declare that: {fix} (an undeclared "
            "write breaks torch.compile's functionalization and autograd's saved values)",
            source=source))
    return found


def _aliases(op: Any, names: list[str], args: list[Any], outs: list[torch.Tensor],
             source: str | None) -> list[Finding]:
    found = []
    returns = op._schema.returns
    for k, out in enumerate(outs):
        declared = k < len(returns) and returns[k].alias_info is not None
        for name, arg in zip(names, args):
            if declared or not isinstance(arg, torch.Tensor) or not _shares(out, arg):
                continue
            what = "is" if out is arg else "shares memory with (a view of)"
            found.append(Finding(
                "op_schema.aliasing_output",
                f"{op._schema.name}'s output {k} {what} argument '{name}', but its schema "
                f"returns a new tensor: return {name}.clone() (or a fresh tensor) from the "
                "kernel; torch.compile assumes a custom op's outputs own their memory",
                source=source))
        for j in range(k):
            if _shares(out, outs[j]):
                found.append(Finding("op_schema.aliasing_output",
                                     f"{op._schema.name}'s outputs {j} and {k} share memory: "
                                     "return separate tensors (clone one)", source=source))
    return found


def _alias_refused(op: Any, source: str | None) -> Finding:
    return Finding("op_schema.aliasing_output",
                   f"{op._schema.name} returns one of its inputs (or a view of one), which "
                   f"torch refuses at every call: return a clone from {python_name(op)}'s "
                   "kernel (e.g. x.clone()) instead of the input or its view", source=source)


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.layout != torch.strided or b.layout != torch.strided:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.nbytes() > 0 and sa.data_ptr() == sb.data_ptr()


def _equal_elements(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.zeros(a.shape, dtype=torch.bool, device=a.device)
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= torch.isnan(a) & torch.isnan(b)
    return same


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(_equal_elements(a, b).all())


def _is_custom_op(op: Any) -> bool:
    from ..targets.ops import custom_op_def

    return custom_op_def(op) is not None


def without_function_advice(checked: CheckResult) -> CheckResult:
    """The contract's result on an op, less its writes-to-inputs advice for a Function
    (ctx.mark_dirty): an op declares writes in its schema, and op_schema says so in its words."""
    dropped = [f for f in checked.findings if f.rule == FUNCTION_ADVICE]
    if checked.outcome is not Outcome.FAILED or not dropped:
        return checked  # nothing of the kind was said
    kept = [f for f in checked.failures if f.rule != FUNCTION_ADVICE]
    findings = tuple(f for f in checked.findings if f.rule != FUNCTION_ADVICE)
    if not kept:
        return replace(checked, outcome=Outcome.PASSED, findings=findings,
                       summary="forward and backward keep autograd's rules (writes to inputs: "
                               "see op_schema)")
    return replace(checked, summary=kept[0].message, findings=findings)


# The contract's advice for a Function that writes its inputs (ctx.mark_dirty): an op declares
# such writes in its schema instead.
FUNCTION_ADVICE = "contract.unmarked_inplace"
