"""Evidence specific to one Function inside a composite: the composite's gradient re-checked
with that Function's backward replaced by autograd through its forward."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Callable

import torch
from torch.autograd.function import FunctionCtx

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem
from ..results import Outcome
from .applyhook import Call, Hook, hooked, same_definition


class _PlainCtx(FunctionCtx):
    """What forward may use of ctx, outside autograd's Function machinery."""

    def __init__(self, args: Sequence[Any]) -> None:
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad
                                      for a in args)


class _ByForward(Hook):
    """These classes' backwards become autograd's VJP of their forwards: each application's
    forward also runs with a graph, on copies of its inputs, and its backward differentiates
    that graph; every other Function runs as usual."""

    def __init__(self, classes: Collection[type]) -> None:
        self.classes, self.grad_mode = classes, True

    def forward(self, call: Call) -> Any:
        positions = [k for k, a in enumerate(call.args)
                     if isinstance(a, torch.Tensor) and a.requires_grad]
        if not any(same_definition(call.cls, c) for c in self.classes) or not self.grad_mode \
                or not positions:
            return call.run()  # a value-only evaluation: the forward's values are the same
        with torch.enable_grad():
            leaves = {k: call.args[k].detach().requires_grad_() for k in positions}
            args = tuple(leaves.get(k, a) for k, a in enumerate(call.args))
            out = call.run(args, ctx=_PlainCtx(args))
        outputs = list(out) if isinstance(out, tuple) else [out]
        call.extra["derived"] = (list(leaves.values()), positions, outputs)
        detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
        return tuple(detached) if isinstance(out, tuple) else detached[0]

    def backward(self, call: Call, backward: Callable[..., Any], ctx: Any,
                 grads: tuple[Any, ...]) -> Any:
        if "derived" not in call.extra:
            return backward(ctx, *grads)
        leaves, positions, outputs = call.extra["derived"]
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, torch.Tensor)
                 and o.requires_grad and g is not None]
        found: Sequence[Any] = [None] * len(leaves)
        if pairs and leaves:
            found = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                        retain_graph=True, allow_unused=True,
                                        create_graph=torch.is_grad_enabled())
        result: list[Any] = [None] * len(call.args)
        for position, grad in zip(positions, found):
            result[position] = grad
        return tuple(result) if len(result) != 1 else result[0]


def fixed_by_forward(problem: Problem, config: CheckConfig, classes: Collection[type]) -> bool:
    """Whether the composite's gradient is right once these classes' backwards are replaced by
    autograd through their forwards (False too when that cannot be done: a forward under
    no_grad, with in-place writes or non-differentiable ops gives no such VJP)."""
    from ..checks.gradient import precision_config, reverse_mode  # lazy, like culprit's
    from ..numerics.jacobian import prime

    hook = _ByForward(classes)

    def fn(*args: Any) -> Any:
        hook.grad_mode = torch.is_grad_enabled()
        return problem.fn(*args)

    swapped = Problem(fn, list(problem.args), list(problem.names), list(problem.diff),
                      facts=problem.facts, scope=problem.scope, sparse=problem.sparse)
    try:  # hooked throughout: the substituted backwards run in the checks' backward passes
        with hooked(hook):
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
