"""Re-run one custom Function application inside its own forward, so its closures stay true."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.autograd.function import _SingleLevelFunction

from ..numerics.problem import Problem
from ..tracebacks import calls_user_code

# Function.apply ends in super().apply(...): the class after Function in every Function's MRO
# (Python, so a classmethod set there for a while is found first), then the engine's own apply.
# Hooking there catches cls.apply(...) and an alias captured at import (my_op = Cls.apply) alike.
_HOOKED = _SingleLevelFunction
_ENGINE_APPLY = torch._C._FunctionBase.__dict__["apply"]


class NotReplayed(RuntimeError):
    """The forward ran to its end without applying the Function again: no re-run possible."""


class _Replayed(BaseException):
    """Carries the intercepted application's result out of the rest of the forward (a
    BaseException: user code's `except Exception` must not swallow it)."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result


def anchors_of(args: Sequence[Any], leaves: Sequence[torch.Tensor]) -> dict[int, int]:
    """{argument position: index of the forward's leaf} for the arguments that ARE a leaf of
    the forward (a parameter, an input): objects a closure in the Function may hold too."""
    found: dict[int, int] = {}
    for position, value in enumerate(args):
        if not isinstance(value, torch.Tensor):
            continue
        index = next((k for k, leaf in enumerate(leaves) if leaf is value), None)
        if index is not None:
            found[position] = index
    # One leaf at two positions cannot be moved one position at a time: no replay.
    return found if len(set(found.values())) == len(found) else {}


def replaying(outer: Problem, cls: type, ordinal: int, anchors: dict[int, int]
              ) -> tuple[Callable[..., Any], Callable[[Sequence[Any]], Any]]:
    """(fn, scope) for a Problem over the Function's arguments that re-runs the whole forward
    of `outer` each time: anchored arguments move the forward's own leaves (so a closure built
    by forward over them sees the same values), the others replace the application's
    arguments; the ordinal-th application of cls returns, and the rest of forward is skipped."""
    base = [v.detach() for v in outer.inputs]

    def outer_values(args: Sequence[Any]) -> list[Any]:
        # The real run's leaves require grad, so code before the application that asks
        # (a solver dropping parameters that need no gradient) takes the same path.
        values: list[Any] = [v.detach().requires_grad_(True) if v.is_floating_point()
                             or v.is_complex() else v for v in base]
        for position, index in anchors.items():
            values[index] = args[position]
        return values

    @calls_user_code
    def fn(*args: Any) -> Any:
        substitute = {k: a for k, a in enumerate(args)
                      if k not in anchors and isinstance(a, torch.Tensor)}
        grad_mode = torch.is_grad_enabled()
        # The forward up to the application records a graph, as the real run's did; the
        # application itself runs in the caller's mode (a value-only evaluation builds none).
        with _intercept(cls, ordinal, substitute, grad_mode), torch.enable_grad():
            try:
                outer.fn(*outer.with_inputs(outer_values(args)))
            except _Replayed as done:
                return done.result
        raise NotReplayed(f"the forward did not apply {cls.__qualname__} again "
                          f"(application {ordinal + 1} of it expected)")

    def scope(args: Sequence[Any]) -> contextlib.AbstractContextManager[None]:
        # backward may call forward's closures again: the forward's parameters stay bound
        return outer.bind(outer.with_inputs(outer_values(args)))

    return fn, scope


@contextlib.contextmanager
def _intercept(cls: type, ordinal: int, substitute: dict[int, Any], grad_mode: bool
               ) -> Iterator[None]:
    """For the duration: the ordinal-th application of cls gets the substituted arguments,
    runs in grad_mode, and its result ends the forward."""
    seen = [0]

    def apply(c: type, run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> Any:
        if c is cls:
            count, seen[0] = seen[0], seen[0] + 1
            if count == ordinal:
                args = tuple(substitute.get(k, a) for k, a in enumerate(args))
                with torch.set_grad_enabled(grad_mode):
                    raise _Replayed(run(*args, **kwargs))
        return run(*args, **kwargs)

    with hooked_apply(apply):
        yield


Handler = Callable[[type, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


@contextlib.contextmanager
def hooked_apply(handler: Handler) -> Iterator[None]:
    """Every Function application goes through handler(cls, run, args, kwargs) for the
    duration (run: the engine's own apply for cls); restored after, even on error."""
    def apply(c: type, *args: Any, **kwargs: Any) -> Any:
        return handler(c, _ENGINE_APPLY.__get__(None, c), args, kwargs)

    _HOOKED.apply = classmethod(apply)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del _HOOKED.apply  # type: ignore[attr-defined]
