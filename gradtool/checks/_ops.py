"""Shared pieces of the op checks: applicability, the op and its registrations, result building."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..numerics.problem import tensor_outputs
from ..results import CheckResult, Finding, Outcome, Severity
from ..targets.load import source_of
from ..targets.ops import custom_op_def


# torch.library.custom_op refuses an output that is (a view of) an input with this message
# ("... or other returns" on torch 2.4, "... to this custom operator" later).
CUSTOM_OP_ALIAS = "may not alias any inputs"


def applies(case: Any, context: Any) -> str | None:
    """None for a custom op target; the reason otherwise (the registry's `kinds`)."""
    from ..config.registry import BY_NAME

    return context.target.kind.applies(BY_NAME["op_schema"])


def interpreted_triton(op: Any) -> str | None:
    """Why a fake-tensor test cannot run: a triton_op under triton's CPU interpreter."""
    import os

    from ..targets.ops import is_triton_op

    if os.environ.get("TRITON_INTERPRET") == "1" and is_triton_op(op):
        return ("a triton_op under TRITON_INTERPRET=1: the interpreter reads tensor data, which "
                "fake tensors have none of (check it without the interpreter, on a GPU)")
    return None


def registered_at(context: Any) -> str | None:
    """file:line of the op's registration: what an op check's finding says to look at."""
    return context.target.extra.get("registered_at")


def overload(context: Any) -> Any:
    return context.target.extra["op"]


def python_name(op: Any) -> str:
    """How the user's code names the op: the CustomOpDef's function name, else torch.ops.ns.x."""
    opdef = custom_op_def(op)
    if opdef is not None:
        from ..targets.ops import user_function

        return getattr(user_function(opdef), "__name__", op._schema.name.split("::")[1])
    ns, name = op._schema.name.split("::")
    return f"torch.ops.{ns}.{name}"


def fake_kernel(op: Any) -> Any:
    """The registered fake (meta) kernel function, or None."""
    opdef = custom_op_def(op)
    if opdef is not None:  # custom_op installs a fake that raises until register_fake
        return getattr(opdef, "_abstract_fn", None)
    from torch._library.simple_registry import singleton

    entry = singleton.find(op._schema.name)
    # torch 2.4 names it abstract_impl (register_fake was impl_abstract there)
    holder = getattr(entry, "fake_impl", None) or entry.abstract_impl
    kernel = holder.kernel
    return getattr(kernel, "func", kernel) if kernel is not None else None


def has_fake(op: Any) -> bool:
    """A fake kernel exists: registered with register_fake, a Meta kernel, or a composite one."""
    if fake_kernel(op) is not None:
        return True
    if custom_op_def(op) is not None:
        return False
    name = op._schema.name
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
               for key in ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd"))


def fake_source(op: Any) -> str | None:
    kernel = fake_kernel(op)
    return source_of(kernel) if kernel is not None else None


def clone_args(args: Sequence[Any]) -> list[Any]:
    """The case's values, each in fresh memory: the op may write into them."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def real_outputs(case: Any, args: Sequence[Any] | None = None) -> list[torch.Tensor]:
    """The op's tensor outputs on (copies of) the case's values, without a graph."""
    problem = case.problem
    with torch.no_grad():
        problem.calls["forward"] += 1
        return tensor_outputs(problem.fn(*clone_args(args if args is not None else problem.args)))


def result(name: str, findings: Sequence[Finding], passed: str, start: float, case: Any,
           source: str | None, details: Sequence[str] = ()) -> CheckResult:
    """FAILED with the findings (first as summary), or PASSED with `passed` as summary."""
    failures = [f for f in findings if f.severity is Severity.FAILURE]
    calls = {k: v for k, v in case.problem.calls.items() if v}
    if not failures:
        return CheckResult(name, Outcome.PASSED, passed, tuple(details), source=source,
                           findings=tuple(findings), duration_s=time.perf_counter() - start)
    return CheckResult(name, Outcome.FAILED, failures[0].message, tuple(details),
                       source=failures[0].source or source, findings=tuple(findings),
                       calls=calls, duration_s=time.perf_counter() - start)


def shape_text(shape: Sequence[Any]) -> str:
    return "x".join(str(s) for s in shape) or "()"

