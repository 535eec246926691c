"""Cases: bind a target to sampled arguments (seeded tensors, literals, module parameters)."""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..errors import InputError, TargetError
from ..numerics.problem import Problem
from ..results import InputInfo
from .inputs import InputSpec, LiteralSpec, sample
from .load import Target


@dataclass
class Case:
    """One set of sampled inputs for a target, ready to check."""

    label: str
    seed: int
    specs: list[InputSpec]
    problem: Problem
    infos: list[InputInfo]
    inferred: bool = False
    notes: list[str] = field(default_factory=list)


def check_device(device: str) -> None:
    """A device torch knows and can use here; ConfigError (exit 2) naming the fix otherwise."""
    from ..errors import ConfigError

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device {device!r} is not a torch device",
                          "use cpu, cuda, cuda:1 or mps") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device!r}: this torch build has no usable CUDA "
                          "(torch.cuda.is_available() is False)",
                          "use --device cpu, or install a CUDA build of torch")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device!r}: MPS is not available here", "use --device cpu")


def build_case(target: Target, specs: Sequence[InputSpec], config: CheckConfig, seed: int,
               label: str = "case 0", inferred: bool = False) -> Case:
    """Sample the arguments and bind the target (an nn.Module's parameters become inputs)."""
    _check_arity(target, specs)
    generator = torch.Generator().manual_seed(seed)
    args, infos, diff = [], [], []
    for position, spec in enumerate(specs):
        name = spec.name or _arg_name(target, position)
        if isinstance(spec, LiteralSpec):
            args.append(spec.value)
        else:
            args.append(sample(spec, generator, config.dtype, config.device))
            if spec.differentiable(config.dtype):
                diff.append(position)
        infos.append(InputInfo(name, spec.describe(config.dtype), position in diff))
    names = [info.name for info in infos]
    fn, batched_fn, params, scope = bind(target, len(specs), config, seed)
    for pname, value in params:
        diff.append(len(args))
        args.append(value)
        names.append(pname)
        infos.append(InputInfo(pname, f"parameter {'x'.join(map(str, value.shape)) or '()'}",
                               True))
    problem = Problem(fn, args, names, diff, batched_fn=batched_fn, scope=scope)
    return Case(label, seed, list(specs), problem, infos, inferred)


def _check_arity(target: Target, specs: Sequence[InputSpec]) -> None:
    signature = target.signature
    if signature is None:
        return
    try:
        signature.bind(*range(len(specs)))
    except TypeError as exc:
        names = ", ".join(target.arg_names) or "no arguments"
        raise InputError(f"{target.name}: {len(specs)} input(s) given, but forward takes "
                         f"({names}): {exc}", "pass one --input per forward argument, in order")


def _arg_name(target: Target, position: int) -> str:
    names = target.arg_names
    return names[position] if position < len(names) else f"arg{position}"


Scope = Callable[[Sequence[Any]], contextlib.AbstractContextManager[None]]
Bound = tuple[Callable[..., Any], Callable[..., Any] | None, list[tuple[str, torch.Tensor]],
              Scope | None]


def bind(target: Target, n_args: int, config: CheckConfig, seed: int) -> Bound:
    """(fn, a vmap-friendly twin of fn or None, [(parameter name, value)], scope or None).

    scope(args) is a context in which the target's parameters are args' values: Problem enters
    it around every backward too, so a backward that re-runs forward sees the same values.
    """
    if target.kind == "function":
        return target.obj.apply, _batchable_forward(target.obj), [], None
    if target.kind == "module":
        return _bind_module(target, n_args, config, seed)
    return target.obj, target.obj, [], None


def _batchable_forward(cls: type) -> Callable[..., Any]:
    """The Function's forward alone: vmap can batch it even without a vmap rule."""
    from torch.autograd import Function

    if getattr(cls, "generate_vmap_rule", False) or cls.vmap is not Function.vmap:
        return cls.apply
    if getattr(cls, "setup_context", Function.setup_context) is not Function.setup_context:
        return cls.forward
    return lambda *args: cls.forward(_ValueCtx(len(args)), *args)


class _ValueCtx:
    """A stand-in ctx for computing forward values only: saving and marking do nothing."""

    def __init__(self, n: int) -> None:
        self.needs_input_grad = (True,) * n
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    save_for_forward = mark_dirty = mark_non_differentiable = save_for_backward

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _bind_module(target: Target, n_args: int, config: CheckConfig, seed: int) -> Bound:
    from torch.nn.utils.stateless import _reparametrize_module

    module = private_copy(target, seed)
    dtype, device = getattr(torch, config.dtype), config.device
    module.to(device=device, dtype=dtype)  # casts floating parameters and buffers only
    params = [(name, p.detach().clone()) for name, p in module.named_parameters()
              if p.requires_grad and p.is_floating_point()]
    names = [n for n, _ in params]

    @contextlib.contextmanager
    def scope(args: Sequence[Any]) -> Iterator[None]:
        # Swapped into the private copy (tied weights kept tied); nested scopes restore in turn.
        with _reparametrize_module(module, dict(zip(names, args[n_args:])), tie_weights=True):
            yield

    def call(*args: Any) -> Any:
        with scope(args):
            return module(*args[:n_args])

    return call, call, params, scope


def private_copy(target: Target, seed: int) -> torch.nn.Module:
    """A module of gradtool's own: built from the class, or a deep copy of the user's instance
    (so nothing of theirs changes: values, .grad, requires_grad, hooks, training flag)."""
    module = instantiate(target, seed)
    if inspect.isclass(target.obj):
        return module
    try:
        return copy.deepcopy(module)
    except Exception as exc:
        raise TargetError(f"{target.name}: cannot copy the module ({type(exc).__name__}: {exc}); "
                          "gradtool checks a copy so that yours is never modified",
                          "make it deep-copyable, or check its class with a spec's init: "
                          "key") from exc


def instantiate(target: Target, seed: int) -> torch.nn.Module:
    """The module instance: the user's, or one built from the class under a seeded RNG."""
    if not inspect.isclass(target.obj):
        return target.obj
    init = target.init
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            if isinstance(init, dict):
                return target.obj(**init)
            if isinstance(init, (list, tuple)):
                return target.obj(*init)
            return target.obj()
        except Exception as exc:
            hint = ("give constructor arguments with a YAML spec's init: key, or check an "
                    "instance (module:instance_name)")
            raise TargetError(f"cannot construct {target.qualname}({_init_text(init)}): "
                              f"{type(exc).__name__}: {exc}", hint) from exc


def _init_text(init: Any) -> str:
    if isinstance(init, dict):
        return ", ".join(f"{k}={v!r}" for k, v in init.items())
    if isinstance(init, (list, tuple)):
        return ", ".join(map(repr, init))
    return ""

