"""The drop-in's lean path: a plain float64 call's clean gradient pass without the pipeline.

gradtool.check costs a tenth of a millisecond per pipeline step (collection, case building,
the probe phase, dispatch, the Report) around a tiny call's few evaluations. Here the same
engine (numerics/probe.py's screen in fast mode, numerics/jacobian.py's check_full otherwise)
judges the call directly, on the graph the drop-in's forward already built, and a Passed means
exactly the gradient check's pass. Anything else -- a failing test, a non-finite value, a
forward that writes its inputs or differs from call to call, a module with buffers, any
argument or output beyond plain float64 tensors and scalars (integer outputs beside, and ones
autograd does not differentiate, are left out as the pipeline leaves them; in reverse mode an
argument given as an nn.Parameter, which given.py's wrapper hands the function as one, as the
pipeline does), an exception -- answers None, and the pipeline judges and reports. The gate (`_gate`) is forward mode's too
(lean_forward.py). A pass on one output hands the probe's backwards to the reentrancy and
batched-gradient tests (Passed).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..config.registry import BY_NAME, GRADCHECK_BACKWARD, GRADCHECK_FORWARD
from ..config.settings import CheckConfig
from ..numerics.coarse import RESIDUE, SIMPLE
from ..numerics.draws import probe_vectors
from ..numerics.facts import output_facts
from ..numerics.handed import record, record_vjp
from ..numerics.problem import (Problem, _fresh, flat_cat, own_storage, select_outputs,
                                tensor_outputs, vjp)
from ..numerics.steps import vjp_rows
from ..results import Outcome
from ..targets.subclass import clone_keeping
from ..tracebacks import calls_user_code

# The full and probe engines (numerics/jacobian.py, localise.py, probe.py), the pipeline's
# targets and the registry's check modules are imported where this path needs them (full mode,
# a probe the central difference alone does not settle): a passing fast call, a suite's first
# included, imports none of them.

SCALARS = (int, float, bool, str, type(None))  # arguments the pipeline passes as they are
MODULE_SIZE = 1 << 16  # parameters' elements: a module this small is snapshotted for _pure


@dataclass(frozen=True)
class Passed:
    """A lean pass, and the backwards it made: the probe's cotangents over the only output,
    one a row, and the gradients each gave, flat over the inputs (the reentrancy test runs
    backward again at the first; the batched-gradient test batches the first two)."""

    cotangents: torch.Tensor | None = None  # None: no such backwards to share
    gradients: torch.Tensor | None = None


def passes(func: Callable[..., Any], args: tuple[Any, ...], out: Any,
           settings: dict[str, Any]) -> Passed | None:
    """The gradient check's certain pass of this call (its fast or full mode as settings say),
    judged without the pipeline; None: let the pipeline judge and report."""
    gated = _gate(func, args, out, settings, GRADCHECK_BACKWARD)
    if gated is None:
        return None
    diff, leaves, outs, config = gated
    if not (_numel(leaves) and _numel(outs)):
        return Passed()  # the gradient check's no elements to compare: skipped, no failure
    try:
        if config.mode == "probe":
            return _screened(_Call(func, args, diff, _mask(out)), config, leaves, outs)
        from ..numerics.jacobian import SMALL

        if _numel(leaves) * _numel(outs) > SMALL:
            return None  # full mode's plan (grouping, batching, memory) is the pipeline's
        return _full(func, args, diff, config, leaves, out)
    except Exception:  # noqa: BLE001 - the pipeline runs it again and reports what it raises
        return None


def _gate(func: Callable[..., Any], args: tuple[Any, ...], out: Any, settings: dict[str, Any],
          checks: tuple[str, ...]
          ) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor], CheckConfig] | None:
    """(the differentiable arguments' places, their tensors, the outputs, the configuration)
    of a call this path judges: plain float64 values, a pure forward, the check alone; None
    where the pipeline must."""
    if settings["masked"] or not _alone(checks):
        return None  # the pipeline runs more than this path judges
    outs = _outputs(out)
    # an nn.Parameter given reaches func (given.py's laid_out) as one, in every evaluation
    if outs is None or not _plain_callable(func) or not _plain(
            args, parameters=checks == GRADCHECK_BACKWARD and _as_given(func)):
        return None
    diff = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    leaves = [args[k] for k in diff]
    flat = _flat(outs)
    scale, largest = _largest(leaves), _largest([flat])
    if not (np.isfinite(scale) and np.isfinite(largest)):
        return None  # the pipeline says which value, and where
    if _numel(leaves) and flat.size and _maybe_coarse(flat, scale):
        return None  # maybe a coarse forward: the pipeline's coarse.py decides and judges it
    try:
        if not _pure(func, args, tensor_outputs(out)):
            return None
    except Exception:  # noqa: BLE001 - the pipeline runs it again and reports what it raises
        return None
    return diff, leaves, outs, _config(settings, checks)


def _numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


@functools.cache
def _alone(checks: tuple[str, ...]) -> bool:
    """Whether the drop-in's checks of this mode are the one check this path runs the engine
    of (gradient, forward_ad), no registry hook on its result: what this path judges (a check
    added there is the pipeline's to run)."""
    module = {GRADCHECK_BACKWARD: "gradient", GRADCHECK_FORWARD: "forward_ad"}.get(checks)
    infos = [BY_NAME[name] for name in checks]
    return module is not None and len(infos) == 1 and not infos[0].hooks and \
        infos[0].import_path == f"{__package__.rpartition('.')[0]}.checks.{module}"


_CONFIGS: dict[tuple[Any, ...], CheckConfig] = {}  # a suite's calls share a few keyword sets


def _config(settings: dict[str, Any], checks: tuple[str, ...]) -> CheckConfig:
    """gradtool.check's configuration for the drop-in's settings (float64 on the CPU)."""
    key = (checks, *sorted(settings.items()))
    config = _CONFIGS.get(key)
    if config is None:
        config = CheckConfig(dtype="float64", device="cpu", checks=checks,
                             forward_any=checks == GRADCHECK_FORWARD, **settings)
        if len(_CONFIGS) < 64:
            _CONFIGS[key] = config
    return config


def _batched_twin(func: Callable[..., Any]) -> Callable[..., Any]:
    """The vmap twin the pipeline binds (targets/kinds.py): a Function's batchable forward,
    a plain function itself."""
    from ..targets.cases import batchable_forward

    owner = getattr(func, "__self__", None)
    return batchable_forward(owner) if isinstance(owner, type) else func


def _plain_callable(func: Callable[..., Any]) -> bool:
    """A Function's apply, a plain function, or a small module without buffers (the drop-in
    checks none of its parameters, and torch's gradcheck calls it as it is too; _pure shows
    that forward writes none of them): what the pipeline calls as it is given (it copies a
    module only so that nothing of the user's changes; an op it binds)."""
    if isinstance(func, types.FunctionType):
        return True
    if isinstance(func, torch.nn.Module):
        return next(func.buffers(), None) is None and \
            sum(p.numel() for p in func.parameters()) <= MODULE_SIZE
    owner = getattr(func, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and \
        func == owner.apply


def _outputs(out: Any) -> list[torch.Tensor] | None:
    """The outputs compared, when every one that requires grad is a float64 strided CPU tensor
    and the others (if any) integer or bool tensors (indices, an info code) or float64 ones
    autograd does not differentiate (a layer norm's mean and rstd): never compared, as the
    pipeline's output facts leave them out; None otherwise."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in items):
        return None
    outs = [o for o in items if o.requires_grad]
    if not outs or not all(_plain_tensor(o) for o in outs) or not all(
            _plain_index(o) or _plain_tensor(o) for o in items if not o.requires_grad):
        return None
    return outs


def _mask(out: Any) -> tuple[bool, ...] | None:
    """Which of the outputs (_outputs took) are compared: None where every one is."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    mask = tuple(o.requires_grad for o in items)
    return None if all(mask) else mask


def _plain(args: Sequence[Any], parameters: bool = False) -> bool:
    """Arguments the pipeline takes as they are: float64 strided CPU tensors (nn.Parameters
    too where `parameters`), integer or bool ones beside them (labels, indices: never
    checked), and plain scalars or strings."""
    return all(_plain_tensor(a, parameters) or _plain_index(a) if isinstance(a, torch.Tensor)
               else isinstance(a, SCALARS) for a in args)


def _as_given(func: Callable[..., Any]) -> bool:
    """Whether func is given.py's laid_out wrapper, which hands each value of an argument
    given as an nn.Parameter to the function as one (an nn.Module built inside registers it,
    as under torch's gradcheck), where this path evaluates at plain tensors."""
    return bool(getattr(func, "gradtool_parameters", ()))


def _plain_index(t: torch.Tensor) -> bool:
    return (type(t) is torch.Tensor and not t.is_floating_point() and not t.is_complex()
            and t.layout == torch.strided and t.device.type == "cpu")


def _largest(values: Sequence[torch.Tensor | np.ndarray]) -> float:
    """The largest |value| (0 where there is none): NaN or inf where a value is not finite."""
    # numpy reads the same memory (plain CPU float64 tensors) for a tenth of torch's dispatch
    arrays = [v if isinstance(v, np.ndarray) else v.detach().numpy() for v in values]
    return max([float(np.abs(a).max()) for a in arrays if a.size], default=0.0)


def _flat(outs: Sequence[torch.Tensor]) -> np.ndarray:
    flat = [o.detach().numpy().reshape(-1) for o in outs]
    return flat[0] if len(flat) == 1 else np.concatenate(flat)


def _maybe_coarse(flat: np.ndarray, scale: float) -> bool:
    """Whether the outputs (flat) are what numerics/coarse.py:forward_dtype examines further
    (at a moved point) as the sign of a forward computing coarser than float64: every one
    beyond float64's residue of a cancellation (RESIDUE of the inputs' scale, at least 1) a
    float32 number (float16's and bfloat16's are float32's too), not all of them simple
    (integers, halves: numbers of any dtype, which prove nothing). This path does not judge
    those; every other call the pipeline judges at float64, as this path does."""
    floor = RESIDUE * max(1.0, scale)
    exact = flat.astype(np.float32).astype(np.float64) == flat
    if not exact.any():  # the usual answer: no value is a float32 number
        return False
    if not exact.all() and bool((np.abs(flat[~exact]) > floor).any()):
        return False  # a value no float32 number, beyond the residue
    kept = flat[np.abs(flat) > floor]
    return bool(kept.size) and not bool((np.round(kept / SIMPLE) * SIMPLE == kept).all())


def _plain_tensor(t: torch.Tensor, parameters: bool = False) -> bool:
    kind = type(t)
    return ((kind is torch.Tensor or parameters and kind is torch.nn.Parameter)
            and t.dtype == torch.float64 and t.layout == torch.strided
            and t.device.type == "cpu" and not t.is_conj() and not t.is_neg())


def _pure(func: Callable[..., Any], args: tuple[Any, ...], outs: list[torch.Tensor]) -> bool:
    """The probe phase's facts, from one more forward on copies without a graph: False where
    forward writes an input or a module's parameter, draws from torch's RNG, or its outputs
    differ from the drop-in's forward's (random, or another kernel without a graph: the
    pipeline tells which)."""
    copies = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    state = torch.default_generator.get_state()  # every value on the CPU: its one generator
    if isinstance(func, torch.nn.Module):  # called on clones of its parameters: never the
        # user's written (their graph, already built, would break), a write shown on clones
        clones, result = _on_clones(func, copies)
        again = tensor_outputs(result)
        if not all(torch.equal(c, p) or _both_nan(c, p.detach()) for p, c in clones):
            return False  # forward writes its own parameters: the pipeline calls a copy
    else:
        with torch.no_grad():
            again = tensor_outputs(func(*copies))
    if not torch.equal(torch.default_generator.get_state(), state):
        return False  # it draws from torch's RNG, even where this draw gave the same outputs
    for a, c in zip(args, copies):  # every value float64 and strided: torch.equal compares it
        if isinstance(a, torch.Tensor) and not (torch.equal(a, c) or _both_nan(a.detach(), c)):
            return False
    pure = len(again) == len(outs) and all(  # outputs finite: no NaN to tell apart
        type(a) is torch.Tensor and a.shape == o.shape and a.dtype == o.dtype
        and torch.equal(a, o)
        for a, o in zip(again, outs))
    if pure:  # f(x), for a failing call's report (numerics/handed.py)
        diff = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        record(func, diff, [args[k].detach() for k in diff], again)
    return pure


def _both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    from ..targets.probe import both_nan  # only where torch.equal found a difference

    return both_nan(a, b)


def _on_clones(module: torch.nn.Module, args: Sequence[Any]
               ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Any]:
    """module(*args) without a graph, each parameter swapped for a clone of its own around the
    call (a tied one for the same clone wherever it sits); the (parameter, clone) pairs and
    the result. torch.func.functional_call does this in ~4x the time of a tiny forward."""
    slots = [(owner._parameters, name, p) for owner in module.modules()
             for name, p in owner._parameters.items() if p is not None]
    clones = {id(p): clone_keeping(p) for _, _, p in slots}  # a subclass's class kept
    try:
        for held, name, p in slots:
            held[name] = clones[id(p)]
        with torch.no_grad():
            result = module(*args)
    finally:
        for held, name, p in slots:
            held[name] = p
    return [(p, clones[id(p)]) for p in {id(p): p for _, _, p in slots}.values()], result


def _forward(fn: Callable[..., Any], args: Sequence[Any], diff: Sequence[int],
             values: Sequence[torch.Tensor], mask: Sequence[bool] | None
             ) -> list[torch.Tensor]:
    """Problem.outputs for a plain deterministic CPU call (no recording, RNG frame, device
    check or output mask): forward without a graph at `values`, given as fresh copies (forward
    may keep or return them, and the engine writes its buffers again); the other tensors as
    they were given, as torch's gradcheck gives them (_pure showed forward writes none)."""
    given = dict(zip(diff, values))
    with torch.no_grad():
        result = fn(*[_fresh(given[k]) if k in given else a for k, a in enumerate(args)])
    outs = [o.detach() for o in tensor_outputs(result)]
    record(fn, diff, values, outs)  # every output: a failing call's report reads it (handed.py)
    return outs if mask is None else [o for o, keep in zip(outs, mask) if keep]


class _Call:
    """The drop-in's call as the probe's engine functions (numerics/probe.py's probe_vectors,
    numerics/steps.py's vjp_rows and directional) see a Problem: its inputs, _forward, VJPs
    through the engine (fresh grad_outputs, as Problem.vjp gives), no vmap twin (a probe's few
    evaluations run as plain calls there too)."""

    __slots__ = ("fn", "args", "diff", "inputs", "cache", "mask")
    batched_fn = None
    sparse: dict[int, Any] = {}

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], diff: list[int],
                 mask: tuple[bool, ...] | None) -> None:
        self.fn, self.args, self.diff, self.mask = fn, args, diff, mask
        self.inputs = [args[k].detach() for k in diff]
        self.cache = SimpleNamespace(vmap_ok=False, batched_vjp_ok=False)  # plain calls only

    @calls_user_code
    def outputs(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return _forward(self.fn, self.args, self.diff, values, self.mask)

    @calls_user_code
    def vjp(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        gradients = vjp(outs, leaves, own_storage(grads))
        record_vjp(leaves, outs, grads, gradients)  # a failing call's report reads it
        return gradients


class _Given(Problem):
    """A Problem of the drop-in's call for full mode's engine, evaluating as _Call does."""

    @calls_user_code
    def outputs(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.calls["forward"] += 1
        return _forward(self.fn, self.args, self.diff, values, self.output_mask)

    @calls_user_code
    def vjp(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            grads: Sequence[torch.Tensor], create_graph: bool = False) -> list[torch.Tensor]:
        self.calls["backward"] += 1
        gradients = vjp(outs, leaves, own_storage(grads), create_graph=create_graph)
        record_vjp(leaves, outs, grads, gradients)  # a failing call's report reads it
        return gradients


def _screened(call: _Call, config: CheckConfig, leaves: list[torch.Tensor],
              outs: list[torch.Tensor]) -> Passed | None:
    """numerics/probe.py's screen on the drop-in's graph, without its tallies (a pass has no
    report to fill): every (direction, cotangent) test passes, or None."""
    eps = config.tolerance("eps")
    u, v = probe_vectors(call, outs, config, config.seed)
    grads = vjp_rows(call, leaves, outs, v)
    sides = [flat_cat(call.outputs([torch.add(x, d, alpha=f) for x, d in zip(call.inputs, u[0])]))
             for f in (eps, -eps)]
    if len(u) == 1 and _agrees(sides, eps, u[0], v, grads, config.tolerance("atol")):
        return Passed(v, grads) if len(outs) == 1 else Passed()
    from ..numerics.localise import Tests
    from ..numerics.probe import ceiling
    from ..numerics.steps import FINITE_MACHINE, directional

    f0 = flat_cat(outs).detach()
    diffs = directional(call, call.inputs, u, eps, f0, known=[sides])
    tests = Tests(v, diffs, f0, grads, torch.stack([flat_cat(d) for d in u]), eps,
                  FINITE_MACHINE[torch.float64], config.tolerance("atol"), ceiling(config))
    if tests.fails.any() or tests.noisy.any():
        return None
    return Passed(v, grads) if len(outs) == 1 else Passed()


def _agrees(sides: list[torch.Tensor], eps: float, u: list[torch.Tensor], v: torch.Tensor,
            grads: torch.Tensor, atol: float) -> bool:
    """Whether the central difference at h alone agrees with backward along every cotangent
    within the probe's atol allowance and no error allowance: the whole probe test then passes
    whatever its third point (x + 2h u) measures (its Richardson correction is a third of the
    gap that point measures, its tolerance three times that gap and more), and so does torch's
    fast mode's looser criterion on the same projection. A noisy probe (localise.Tests.noisy)
    agrees this closely only by a coincidence of its noise with a wrong backward."""
    # numpy on the same CPU float64 memory: a tenth of torch's dispatch for these few values
    plus, minus, v_, g_, u_ = (t.numpy() for t in (*sides, v, grads, flat_cat(u)))
    with np.errstate(all="ignore"):  # NaN or inf: no agreement, the whole test judges it
        gap = abs(v_ @ ((plus - minus) / (2 * eps)) - g_ @ u_)
        return bool((gap <= 2.25 * atol).all())


def _full(func: Callable[..., Any], args: tuple[Any, ...], diff: list[int],
          config: CheckConfig, leaves: list[torch.Tensor], out: Any) -> Passed | None:
    """numerics/jacobian.py's check_full on a Problem of the call: its pass, or None."""
    from ..numerics.jacobian import check_full

    problem = _problem(func, args, diff, leaves, out)
    problem.cache.pass_only = True  # a failing comparison ends it: the pipeline reports it
    outs = select_outputs(out, problem.output_mask)
    # analytical rows output by output, as the comparison reaches them (numerics/stopping.py):
    # a failing call's first failing comparison comes before the other outputs' backwards
    verdict = check_full(problem, config, leaves, outs, None, REASON, stop=REASON)
    return Passed() if verdict.outcome is Outcome.PASSED else None


def _problem(func: Callable[..., Any], args: tuple[Any, ...], diff: list[int],
             leaves: list[torch.Tensor], out: Any) -> _Given:
    """A Problem of the call for full mode's and forward mode's engines (its vmap twin the
    pipeline's, where vmap pays), its output facts (which are compared) learnt from the
    drop-in's forward."""
    every = tensor_outputs(out)
    # vmap's fixed cost (and its check against plain calls, per Problem) exceeds a few plain
    # evaluations: so few run as plain calls, which the engine also falls back to
    columns = 2 * _numel(leaves)
    problem = _Given(func, list(args), [f"arg{k}" for k in range(len(args))], diff,
                     batched_fn=None if columns <= FEW else _batched_twin(func))
    if columns <= FEW:
        problem.cache.vmap_ok = False
    if sum(o.numel() for o in every if o.requires_grad) <= FEW // 2:
        problem.cache.batched_vjp_ok = False
    problem.learn(problem.facts.with_(learnt=True, **output_facts(every, None, False, leaves)))
    return problem


FEW = 32  # evaluations (VJP rows: half as many) run as plain calls
REASON = "the drop-in's lean path: a small Jacobian"
