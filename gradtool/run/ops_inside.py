"""Custom ops called inside a model: captured with a TorchFunctionMode, each checked alone."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..config.settings import DEFAULT_TOLERANCES, CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from ..targets.load import Target
from ..targets.kinds import OP, op_target
from ..targets.ops import registration_line
from .sites import installed, user_site

# Namespaces of torch's own operators: not the user's to check.
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "_quantized", "profiler",
                              "_c10d_functional", "c10d", "inductor", "higher_order",
                              "debugprims", "mkldnn", "_quantized_decomposed", "torchvision"})
OP_CHECKS = OP.own_checks()  # the op kind's default checks (the registry's `kinds`)


@dataclass
class OpCall:
    """One call of a custom op in the forward: the overload, argument copies, the call site."""

    op: Any
    args: list[Any]
    kwargs: dict[str, Any]
    created_at: str | None


class _Capture(TorchFunctionMode):
    """Records every call of a user's custom op (above autograd: requires_grad is still seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[OpCall] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        op = _user_op(func)
        if op is not None:
            self.calls.append(OpCall(op, [_snapshot(a) for a in args],
                                     {k: _snapshot(v) for k, v in kwargs.items()},
                                     user_site(sys._getframe(1))))
        return func(*args, **kwargs)


def _user_op(func: Any) -> Any:
    """The OpOverload of a user's op (a packet: its default overload), None for anything else."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        if "default" not in func.overloads():
            return None
        func = func.default
    if not isinstance(func, torch._ops.OpOverload) or func.namespace in TORCH_NAMESPACES:
        return None
    return func if _users(func._schema.name, func) else None


_USERS: dict[str, bool] = {}


def _users(name: str, op: Any) -> bool:
    """Registered in the user's own Python code (not an installed package's, not C++ whose
    source gradtool cannot point at): the ops a report can blame. Cached per op."""
    if name not in _USERS:
        line = registration_line(op)
        _USERS[name] = line is not None and not installed(line)
    return _USERS[name]


def _snapshot(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


_SEEN: dict[str, Any] = {"size": -1, "found": False}


def user_ops_exist() -> bool:
    """Whether any op of the user's is registered in this process (else no forward is recorded
    to look for one); torch registers a hundred of its own. Recomputed when the set grows."""
    from torch._library.custom_ops import OPDEFS

    names = set(OPDEFS) | set(torch.library._defs)
    if len(names) != _SEEN["size"]:
        _SEEN.update(size=len(names), found=any(_user_name(name) for name in names))
    return bool(_SEEN["found"])


def _user_name(qualname: str) -> bool:
    ns, _, name = qualname.partition("::")
    if ns in TORCH_NAMESPACES:
        return False
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        op = packet.default if "default" in packet.overloads() else None
    except (AttributeError, RuntimeError):
        return False
    return op is not None and _users(qualname, op)


def record_ops(problem: Problem) -> list[OpCall]:
    """One forward of the problem, every custom op call in it (first per op and call site)."""
    capture = _Capture()
    with capture:
        problem.graph()
    first: dict[tuple[str, str | None], OpCall] = {}
    for call in capture.calls:
        first.setdefault((str(call.op), call.created_at), call)
    return list(first.values())


def _captured(call: OpCall, config: CheckConfig) -> tuple[Target, Any, CheckConfig]:
    """The op as a target, with a case of the values it received (checked: those that required
    grad, as gradcheck chooses); the dtype of those values sets the tolerances."""
    from ..targets.cases import build_case
    from ..targets.values import given_specs

    target = op_target(call.op, call.op._schema.name)
    own = config
    for value in call.args:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            dtype = str(value.dtype).removeprefix("torch.")
            own = config.with_(dtype=dtype) if dtype in DEFAULT_TOLERANCES else config
            break
    specs = given_specs(list(call.args), call.kwargs or None)
    return target, build_case(target, specs, own, own.seed, label="captured"), own


def locate_ops(problem: Problem, config: CheckConfig) -> list[dict[str, Any]]:
    """The culprit search's verdict on each custom op inside, as culprit.FunctionFinding's
    fields (named ns::name, with the call site); never raises."""
    if not user_ops_exist():
        return []
    try:
        calls = record_ops(problem)
    except Exception:  # noqa: BLE001 - locating is a diagnosis; it must not break the report
        return []
    return [_gradient_of(call, config) for call in calls]


def _gradient_of(call: OpCall, config: CheckConfig) -> dict[str, Any]:
    from ..checks.gradient import check_gradient

    source = None
    try:
        target, case, own = _captured(call, config)
        source = target.source
        checked = check_gradient(case, target, own)
    except InternalError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the op without an autograd formula
        checked = CheckResult("gradient", Outcome.ERROR, f"{type(exc).__name__}: {exc}"[:200])
    name, where = call.op._schema.name, call.created_at or "an unknown line"
    wrong: tuple[str, ...] = ()
    if checked.outcome is Outcome.FAILED:
        wrong = tuple(dict.fromkeys(b.input for b in checked.blocks if b.mismatched))
        causes = [b.diagnosis for b in checked.blocks if b.mismatched and b.diagnosis]
        text = (f"{name} at {where} is wrong w.r.t. {', '.join(wrong) or '?'}"
                + (f" (backward at {source})" if source else "")
                + f": {causes[0] if causes else checked.summary}")
    elif checked.outcome is Outcome.PASSED:
        text = f"{name} at {where} passes"
    else:
        text = f"{name} at {where} could not be checked alone: {checked.summary}"
    return {"qualname": name, "source": source, "created_at": call.created_at,
            "outcome": checked.outcome, "wrong_inputs": wrong, "summary": text}


def with_op_contracts(result: CheckResult, problem: Problem, config: CheckConfig,
                      target: Target) -> CheckResult:
    """The contract result in op terms: an op target's, less the Function advice; a model's,
    with each inner custom op's schema, fake and autograd findings added."""
    if target.kind.op:
        from ..checks.op_schema import without_function_advice

        return without_function_advice(result)
    if not target.kind.composite or not user_ops_exist():
        return result
    try:
        calls = record_ops(problem)
    except Exception:  # noqa: BLE001 - the composite's own result already says what failed
        return result
    lines: list[str] = []
    source = None
    for call in calls:
        found, where = _contract_of(call, config)
        lines += found
        source = source or where
    if not lines:
        return result
    if result.outcome is Outcome.PASSED:
        return replace(result, outcome=Outcome.FAILED, summary=lines[0],
                       details=(*lines[1:], *result.details), source=source)
    return replace(result, details=(*result.details, *lines))


def _contract_of(call: OpCall, config: CheckConfig) -> tuple[list[str], str | None]:
    """("ns::name at file:line: finding" lines, the first finding's file:line) for one call."""
    from ..checks._common import Context, load

    try:
        target, case, own = _captured(call, config)
    except Exception as exc:  # noqa: BLE001 - arguments that no longer bind, say
        return [f"{call.op._schema.name} could not be checked alone: {exc}"], None
    context = Context(target, own)
    where = f" at {call.created_at}" if call.created_at else ""
    lines, source = [], None
    for name in OP_CHECKS:
        check = load(name)
        try:
            if check.applies(case, context):
                continue
            checked = check.run(case, context)
        except InternalError:
            raise
        except Exception as exc:  # noqa: BLE001 - the op raising on its captured inputs
            lines.append(f"{target.qualname}{where}: {name} raised {type(exc).__name__}: {exc}")
            continue
        if checked.outcome is Outcome.FAILED:
            lines += [f"{target.qualname}{where}: {f.message}" for f in checked.findings
                      if f.severity.value == "failure"]
            source = source or checked.source
    return lines, source

