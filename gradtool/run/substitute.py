"""Evidence specific to one Function inside a composite: the composite's gradient re-checked
with that Function's backward replaced by autograd through its forward."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Callable

import torch
from torch.autograd.function import FunctionCtx, _is_setup_context_defined

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import Outcome
from .replay import hooked_apply


class _PlainCtx(FunctionCtx):
    """What forward may use of ctx, outside autograd's Function machinery."""

    def __init__(self, args: Sequence[Any]) -> None:
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad
                                      for a in args)


def _by_forward(classes: Collection[type]) -> Callable[..., Any]:
    """A handler for replay.hooked_apply: these classes' applications run their forward as
    plain autograd ops (the VJP autograd derives from forward); every other Function as usual."""
    def handler(c: type, run: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        if c not in classes:
            return run(*args, **kwargs)
        if _is_setup_context_defined(c.setup_context):
            return c.forward(*args, **kwargs)
        return c.forward(_PlainCtx(args), *args, **kwargs)
    return handler


def fixed_by_forward(problem: Problem, config: CheckConfig, classes: Collection[type]) -> bool:
    """Whether the composite's gradient is right once these classes' backwards are replaced by
    autograd through their forwards (False too when that cannot be done: a forward under no_grad, with
    in-place writes or non-differentiable ops gives no such VJP)."""
    from ..checks.gradient import precision_config, reverse_mode  # lazy, like culprit's
    from ..numerics.jacobian import prime

    def fn(*args: Any) -> Any:
        with hooked_apply(_by_forward(classes)):
            return problem.fn(*args)

    swapped = Problem(fn, list(problem.args), list(problem.names), list(problem.diff),
                      facts=problem.facts, scope=problem.scope)
    try:
        leaves, outs = prime(swapped)
        if not outs:
            return False
        verdict = reverse_mode(swapped, precision_config(config, swapped), leaves, outs,
                               config.seed, None)
    except InternalError:
        raise
    except Exception:  # noqa: BLE001 - no VJP from this forward: no evidence either way
        return False
    finally:
        problem.calls.update(swapped.calls)
    return verdict.outcome is Outcome.PASSED
