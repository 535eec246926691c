"""Shared pieces of the checks: the context they run in, error results, call counts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.registry import BY_NAME
from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import CheckResult, Outcome
from ..targets.load import Target
from ..tracebacks import (gradtool_frame, innermost_user_frame, propagating, raised_in_gradtool,
                          trim)


def calls_since(problem: Problem, before: dict[str, int]) -> dict[str, int]:
    """Forward/backward calls made since `before` was taken from problem.calls."""
    return {k: v - before.get(k, 0) for k, v in problem.calls.items() if v - before.get(k, 0)}


def error_result(name: str, exc: BaseException, target: Target, start: float,
                 problem: Problem, before: dict[str, int]) -> CheckResult:
    """An exception raised inside the user's code is an `error` outcome, not a crash; one
    raised by gradtool's own code is an InternalError (exit 3), never blamed on the user."""
    if isinstance(exc, InternalError):
        raise exc
    if raised_in_gradtool(exc):
        raise InternalError(exc, gradtool_frame(exc)) from exc
    if propagating():  # the gradcheck drop-in: the user's exception is the caller's, unchanged
        raise exc
    where = innermost_user_frame(exc) or target.source
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return CheckResult(
        name, Outcome.ERROR, f"{type(exc).__name__} raised: {first}"[:300],
        _number_hints(exc, problem),
        source=where, traceback=trim(exc), exception=_qualname(type(exc)),
        calls=calls_since(problem, before),
        duration_s=time.perf_counter() - start)


@dataclass
class Context:
    """What a check may need beyond the case: the target, settings, a spec's surrogate."""

    target: Target
    config: CheckConfig
    reference: Callable[[Any], Any] | None = None   # rows of a declared surrogate's Jacobian
    surrogate: str | None = None                    # the surrogate, described
    annotate: Callable[..., CheckResult] | None = None  # names the culprit inside a model


def load(name: str) -> Any:
    """The module of a registered check (imported only when the check runs)."""
    from importlib import import_module

    return import_module(BY_NAME[name].import_path)


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, Outcome.SKIPPED, reason)


def no_output(problem: Problem) -> str:
    """Why a case has no output to check: forward raised (told under the first check), or it
    returns no tensor."""
    try:
        problem.outputs(problem.inputs)
    except Exception as exc:  # noqa: BLE001 - the user's forward failing is the answer
        return f"not run: forward raised {type(exc).__name__} (reported under the first check)"
    return "forward returns no tensor output"


def expect_evaluations(problem: Problem, config: CheckConfig, mode: str, leaves: Any,
                       outs: Any) -> None:
    """Tell the heartbeat how many evaluations the chosen mode makes: full mode its plan's
    forwards and backwards (else two forwards a column and a backward a row), probe mode its
    directions' forwards and its cotangents' backwards."""
    def count() -> int:
        plan = problem.cache.plan
        if mode != "full":
            return sum(probe_evaluations(config))
        if plan is not None:
            return plan.forwards + plan.backwards
        return 2 * sum(v.numel() for v in leaves) + sum(o.numel() for o in outs)
    declare(count)


def probe_evaluations(config: CheckConfig) -> tuple[int, int]:
    """Probe mode's (forwards, backwards) on correct code: its directions' forwards and its
    cotangents' backwards (the cost plan's count too, run/plan.py)."""
    return 4 * max(1, config.probes // 4), min(config.probes, 2)


def declare(evaluations: Callable[[], int]) -> None:
    """Tell the heartbeat how many more evaluations a check makes on correct code (the contract's
    and the layout's, counted from what they will call), so a stop says done/total and the time
    left is measured cost per evaluation times those left; counted only where a supervisor
    listens."""
    from .. import heartbeat

    if heartbeat.reporting():
        heartbeat.expect(evaluations())


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _number_hints(exc: BaseException, problem: Problem) -> tuple[str, ...]:
    """A bare number given where forward needs a tensor: point at the 1-d form."""
    if not isinstance(exc, TypeError) or "Tensor" not in str(exc):
        return ()
    return tuple(f"input '{name}' is the Python number {value!r}; for a 1-d tensor of {value} "
                 f"elements write -i '({value},)' (in a spec: {{{name}: '({value},)'}})"
                 for name, value in zip(problem.names, problem.args)
                 if isinstance(value, int) and not isinstance(value, bool))
