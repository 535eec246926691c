"""The drop-in's lean path: a plain float64 call's clean gradient pass without the pipeline.

gradtool.check costs a tenth of a millisecond per pipeline step (collection, case building,
the probe phase, dispatch, the Report) around a tiny call's few evaluations. Here the same
engine (numerics/probe.py's screen in fast mode, numerics/jacobian.py's check_full otherwise)
judges the call directly, on the forward the drop-in already made, and True means exactly the
gradient check's pass. Anything else -- a failing test, a non-finite value, a forward that
writes its inputs or differs from call to call, any argument or output beyond plain float64
tensors and scalars, an exception -- answers False, and the full pipeline judges and reports.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ..config.registry import GRADCHECK_BACKWARD
from ..config.settings import CheckConfig
from ..numerics.facts import output_facts
from ..numerics.jacobian import SMALL, check_full
from ..numerics.localise import Tests
from ..numerics.probe import _vectors
from ..numerics.problem import (Problem, _fresh, flat_cat, own_storage, split_flat,
                                tensor_outputs, vjp)
from ..numerics.steps import FINITE_MACHINE, directional, vjp_rows
from ..results import Outcome
from ..targets.cases import batchable_forward
from ..targets.probe import both_nan
from ..tracebacks import calls_user_code

SCALARS = (int, float, bool, str, type(None))  # arguments the pipeline passes as they are


@dataclass(frozen=True)
class Passed:
    """A lean pass, and one backward it made: the cotangent over all outputs and the gradient
    of each input (the reentrancy test runs backward again at the same cotangent)."""

    cotangent: list[torch.Tensor] | None = None  # None: full mode made no such backward
    gradients: list[torch.Tensor] | None = None


def passes(func: Callable[..., Any], args: tuple[Any, ...], out: Any,
           settings: dict[str, Any]) -> Passed | None:
    """The gradient check's certain pass of this call (its fast or full mode as settings say),
    judged without the pipeline; None: let the pipeline judge and report."""
    if GRADCHECK_BACKWARD != ("gradient",) or settings["masked"]:
        return None  # the pipeline runs more than this path judges
    twin = _batched_twin(func)
    outs = _outputs(out)
    if twin is None or outs is None or not _plain(args):
        return None
    diff = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    n_in, n_out = sum(args[k].numel() for k in diff), sum(o.numel() for o in outs)
    if settings["mode"] == "full" and n_in * n_out > SMALL:
        return None  # full mode's plan (grouping, batching, memory) is the pipeline's
    try:
        if not _pure(func, args, outs):
            return None
        config = CheckConfig(dtype="float64", device="cpu", checks=GRADCHECK_BACKWARD,
                             **settings)
        leaves = [args[k] for k in diff]
        if config.mode == "probe":
            return _screened(_Call(func, args, diff), config, leaves, outs)
        return _full(func, args, diff, twin, config, leaves, outs)
    except Exception:  # noqa: BLE001 - the pipeline runs it again and reports what it raises
        return None


def _batched_twin(func: Callable[..., Any]) -> Callable[..., Any] | None:
    """The vmap twin the pipeline binds (targets/kinds.py): a Function's batchable forward,
    a plain function itself; None for anything else (a module, an op, a callable object)."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        return batchable_forward(owner) if func == owner.apply else None
    return func if isinstance(func, types.FunctionType) else None


def _outputs(out: Any) -> list[torch.Tensor] | None:
    """The outputs, when every one is a finite float64 strided CPU tensor requiring grad (the
    pipeline then compares them all); None otherwise."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) and o.requires_grad and _plain_tensor(o)
                           for o in outs):
        return None
    if not all(bool(torch.isfinite(o).all()) for o in outs):
        return None
    return outs


def _plain(args: Sequence[Any]) -> bool:
    """Arguments the pipeline takes as they are: float64 strided CPU tensors (finite where they
    require grad) and plain scalars or strings."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if not _plain_tensor(a) or (a.requires_grad and not bool(torch.isfinite(a).all())):
                return False
        elif not isinstance(a, SCALARS):
            return False
    return True


def _plain_tensor(t: torch.Tensor) -> bool:
    return (type(t) is torch.Tensor and t.dtype == torch.float64 and t.layout == torch.strided
            and t.device.type == "cpu" and t.numel() > 0 and not t.is_conj() and not t.is_neg())


def _pure(func: Callable[..., Any], args: tuple[Any, ...], outs: list[torch.Tensor]) -> bool:
    """The probe phase's facts, from one more forward on copies without a graph: False where
    forward writes an input or its outputs differ from the drop-in's forward's (random, or
    another kernel without a graph: the pipeline tells which)."""
    copies = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        again = tensor_outputs(func(*copies))
    for a, c in zip(args, copies):  # every value float64 and strided: torch.equal compares it
        if isinstance(a, torch.Tensor) and not (torch.equal(a, c) or both_nan(a.detach(), c)):
            return False
    return len(again) == len(outs) and all(  # outputs finite: no NaN to tell apart
        type(a) is torch.Tensor and a.shape == o.shape and torch.equal(a, o)
        for a, o in zip(again, outs))


class _Call:
    """The drop-in's call as the probe's engine functions (numerics/probe.py's _vectors,
    numerics/steps.py's vjp_rows and directional) see a Problem: its inputs, forwards without a
    graph (fresh copies of the other tensors, as Problem.with_inputs gives), VJPs through the
    engine (fresh grad_outputs, as Problem.vjp gives), no vmap twin (a probe's few
    evaluations run as plain calls there too)."""

    __slots__ = ("fn", "args", "diff", "inputs")
    cache = SimpleNamespace(vmap_ok=False, batched_vjp_ok=False)
    batched_fn = None
    sparse: dict[int, Any] = {}

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], diff: list[int]) -> None:
        self.fn, self.args, self.diff = fn, args, diff
        self.inputs = [args[k].detach() for k in diff]

    @calls_user_code
    def outputs(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        given = dict(zip(self.diff, values))
        with torch.no_grad():
            result = self.fn(*[given[k] if k in given else
                               _fresh(a) if isinstance(a, torch.Tensor) else a
                               for k, a in enumerate(self.args)])
        return [o.detach() for o in tensor_outputs(result)]

    @calls_user_code
    def vjp(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return vjp(outs, leaves, own_storage(grads))


def _screened(call: _Call, config: CheckConfig, leaves: list[torch.Tensor],
              outs: list[torch.Tensor]) -> Passed | None:
    """numerics/probe.py's screen on the drop-in's graph, without its tallies (a pass has no
    report to fill): every (direction, cotangent) test passes, or None."""
    eps = config.tolerance("eps")
    u, v = _vectors(call, outs, config, config.seed)
    grads = vjp_rows(call, leaves, outs, v)
    f0 = flat_cat(outs).detach()
    diffs = directional(call, call.inputs, u, eps, f0)
    tests = Tests(v, diffs, f0, grads, torch.stack([flat_cat(d) for d in u]), eps,
                  FINITE_MACHINE[torch.float64], config.tolerance("atol"))
    if tests.fails.any():
        return None
    return Passed(split_flat(v[0], [o.shape for o in outs]),
                  split_flat(grads[0], [x.shape for x in leaves]))


def _full(func: Callable[..., Any], args: tuple[Any, ...], diff: list[int],
          twin: Callable[..., Any], config: CheckConfig, leaves: list[torch.Tensor],
          outs: list[torch.Tensor]) -> Passed | None:
    """numerics/jacobian.py's check_full on a Problem of the call (its vmap twin the
    pipeline's): its pass, or None."""
    problem = Problem(func, list(args), [f"arg{k}" for k in range(len(args))], diff,
                      batched_fn=twin)
    problem.learn(problem.facts.with_(learnt=True, **output_facts(outs, None, False, leaves)))
    verdict = check_full(problem, config, leaves, outs, None, REASON)
    return Passed() if verdict.outcome is Outcome.PASSED else None


REASON = "the drop-in's lean path: a small Jacobian"
