"""Re-run one custom Function application inside its own forward, so its closures stay true."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..numerics.problem import Problem
from ..tracebacks import calls_user_code
from .applyhook import Call, Hook, bypassed, hooked, same_definition


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
        # The application itself runs in the caller's modes (a value-only evaluation builds no
        # graph, a forward-mode one a dual): apply turns both off around forward, where the
        # hook runs.
        grad_mode, dual = torch.is_grad_enabled(), torch._C._is_fwd_grad_enabled()
        # The forward up to the application records a graph, as the real run's did.
        with hooked(_Intercept(cls, ordinal, substitute, grad_mode, dual)), torch.enable_grad():
            try:
                outer.fn(*outer.with_inputs(outer_values(args)))
            except _Replayed as done:
                return done.result
            finally:
                torch._C._set_fwd_grad_enabled(dual)
        raise NotReplayed(f"the forward did not apply {cls.__qualname__} again "
                          f"(application {ordinal + 1} of it expected)")

    def scope(args: Sequence[Any]) -> contextlib.AbstractContextManager[None]:
        # backward may call forward's closures again: the forward's parameters stay bound
        return outer.bind(outer.with_inputs(outer_values(args)))

    return fn, scope


class _Intercept(Hook):
    """The ordinal-th application of cls is made again with the substituted arguments, in
    the caller's modes, and its result ends the forward."""

    def __init__(self, cls: type, ordinal: int, substitute: dict[int, Any], grad_mode: bool,
                 dual: bool) -> None:
        self.cls, self.ordinal, self.substitute = cls, ordinal, substitute
        self.grad_mode, self.dual, self.seen = grad_mode, dual, 0

    def forward(self, call: Call) -> Any:
        if same_definition(call.cls, self.cls):
            count, self.seen = self.seen, self.seen + 1
            if count == self.ordinal:
                args = tuple(self.substitute.get(k, a) for k, a in enumerate(call.args))
                with bypassed(), torch.set_grad_enabled(self.grad_mode):
                    torch._C._set_fwd_grad_enabled(self.dual)
                    # this run's class: a factory's holds this run's closure
                    apply = call.cls.apply  # type: ignore[attr-defined]
                    raise _Replayed(apply(*args, **call.kwargs))
        return call.run()
