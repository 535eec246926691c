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
from ..errors import GradtoolError, InputError, InternalError, TargetError, did_you_mean
from ..numerics.facts import Facts
from ..numerics.handed import stands_for
from ..numerics.problem import Problem
from ..numerics.rng import seed_all
from ..numerics.sparse import Encoding, is_sparse, rebuilding
from ..results import InputInfo
from ..tracebacks import calls_user_code, gradtool_frame, raised_in_gradtool
from .inputs import InputSpec, LiteralSpec, TensorSpec, sample
from .load import Target
from .subclass import keeps_class, plain, retyped, retyping
from .values import (Keyword, ValueSpec, is_python_subclass, is_structured, leaves,
                     structured, subclass_values, unwrap)


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
    # fn -> fn taking the engine's flat values (structure rebuilt, sparse inputs rebuilt, sym
    # inputs projected), as the case's own fn was wrapped: a float64 reference needs the same
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda fn: fn
    n_positional: int = 0  # forward's positional arguments, as bind() counts them
    # scope -> the scope taking the engine's flat values, as the case's own scope was wrapped
    wrap_scope: Callable[[Any], Any] = lambda scope: scope
    # inferred inputs only: 0-d ones that ran forward and backward where these did not, kept
    # off so that backward's error on larger ones is the report (the runner says how to pin)
    alternative: list[InputSpec] | None = None

    @property
    def facts(self) -> Facts:
        """What the probe phase learnt about this case (targets/probe.py)."""
        return self.problem.facts


def _flat_scope(scope: Callable[[Sequence[Any]], Any], n_args: int, n_leaves: int
                ) -> Callable[[Sequence[Any]], Any]:
    """A module's scope taking the engine's flat arguments (a nested or keyword argument is
    several leaves there): the parameters after the leaves, where it looks after n_args."""
    return lambda args: scope([*args[:n_args], *args[n_leaves:]])


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


def build_case(target: Target, specs: Sequence[Any], config: CheckConfig, seed: int,
               label: str = "case 0", inferred: bool = False) -> Case:
    """Sample the arguments and bind the target (an nn.Module's parameters become inputs).

    Nested and keyword arguments are flattened here: each leaf is one Problem argument named by
    its path (state[0], mask), and the bound fn rebuilds the structure before calling."""
    positional = [s for s in specs if not isinstance(s, Keyword)]
    keywords = [s for s in specs if isinstance(s, Keyword)]
    _check_arity(target, len(positional), [k.name for k in keywords])
    generator = torch.Generator().manual_seed(seed)
    args, infos, diff = [], [], []
    symmetric: list[int] = []  # flat positions perturbed and compared as symmetric matrices
    encodings: dict[int, Encoding] = {}  # flat positions of sparse inputs, held dense
    subclassed: list[str] = []  # notes: wrapper-subclass values, held as plain tensors
    templates: dict[int, Any] = {}  # flat positions of storage subclasses: forward sees them so
    named = [(spec_name(s) or arg_name(target, i), s) for i, s in enumerate(positional)]
    for base, top in named + [(k.name, k.spec) for k in keywords]:
        top = unwrap(top)
        for path, spec in leaves(top):
            name = base + path
            if spec is None or not isinstance(spec, (TensorSpec, LiteralSpec, ValueSpec)):
                spec = LiteralSpec(spec)  # a plain value inside a container
            args.append(_leaf_value(spec, generator, config))
            if isinstance(spec, ValueSpec) and keeps_class(spec.value):
                templates[len(args) - 1] = spec.value
            if isinstance(spec, ValueSpec) and is_python_subclass(spec.value):
                subclassed.append(f"{name}: a tensor subclass ({type(spec.value).__name__}) "
                                  "given; checked on its values, passed to the target as a "
                                  "plain tensor")
            if spec.differentiable(config.dtype):
                if is_sparse(args[-1]):
                    encodings[len(args) - 1] = Encoding.of(args[-1], config.masked)
                    args[-1] = encodings[len(args) - 1].value()
                diff.append(len(args) - 1)
                if isinstance(spec, TensorSpec) and spec.projection() == "sym":
                    symmetric.append(len(args) - 1)
            infos.append(InputInfo(name, spec.describe(config.dtype), len(args) - 1 in diff))
    names = [info.name for info in infos]
    n_leaves = len(args)
    fn, batched_fn, params, scope = bind(target, len(positional), config, seed)
    nested = is_structured(list(specs))
    if nested:
        fn = structured(fn, positional, keywords, n_leaves)
        batched_fn = structured(batched_fn, positional, keywords, n_leaves) \
            if batched_fn is not None and (target.kind.batched_keywords or not keywords) else None
    if templates:  # vmap's batched values are no subclass's: plain calls only
        fn, batched_fn = retyping(fn, templates), None
    notes = subclassed
    if encodings:  # vmap batches no sparse tensor
        fn, batched_fn = rebuilding(fn, encodings), None
        notes.extend(f"{names[p]}: {e.describe()} compared" for p, e in encodings.items())
    for pname, value in params:
        diff.append(len(args))
        args.append(value)
        names.append(pname)
        infos.append(InputInfo(pname, f"parameter {'x'.join(map(str, value.shape)) or '()'}",
                               True, parameter=True))
    if config.autocast:
        fn, batched_fn = autocast(fn, config.autocast, config.device), None
    if symmetric:
        from ..numerics.tangent import projecting

        fn = projecting(fn, symmetric)
        batched_fn = projecting(batched_fn, symmetric) if batched_fn is not None else None
        notes.append(f"{', '.join(names[p] for p in symmetric)}: perturbed along symmetric "
                     "directions, both gradients symmetrised (the tangent space of sym/spd)")

    def wrap_scope(scope: Any) -> Any:
        """A bound scope (the case's, a float64 reference's) taking the engine's flat values:
        the Problem binds parameters after every leaf, the module's scope after its
        positional arguments."""
        return _flat_scope(scope, len(positional), n_leaves) if nested and scope else scope

    problem = Problem(fn, args, names, diff, batched_fn=batched_fn, scope=wrap_scope(scope),
                      sparse=encodings)

    def wrap(bound: Callable[..., Any]) -> Callable[..., Any]:
        """Another bound fn (the float64 reference's) wrapped as fn was, autocast aside."""
        if nested:
            bound = structured(bound, positional, keywords, n_leaves)
        bound = retyping(bound, templates)
        if encodings:
            bound = rebuilding(bound, encodings)
        if symmetric:
            from ..numerics.tangent import projecting

            bound = projecting(bound, symmetric)
        return bound

    return Case(label, seed, list(specs), problem, infos, inferred, notes, wrap, len(positional),
                wrap_scope)


def autocast(fn: Callable[..., Any], dtype: str, device: str) -> Callable[..., Any]:
    """fn with its forward inside a torch.autocast region (--autocast)."""
    device_type = torch.device(device).type

    def run(*args: Any) -> Any:
        with torch.autocast(device_type, dtype=getattr(torch, dtype)):
            return fn(*args)

    return run


def spec_name(spec: Any) -> str | None:
    return getattr(spec, "name", None) if not isinstance(spec, (tuple, list, dict)) else None


def _leaf_value(spec: Any, generator: Any, config: CheckConfig) -> Any:
    if isinstance(spec, TensorSpec):
        return sample(spec, generator, config.dtype, config.device)
    if isinstance(spec, ValueSpec) and isinstance(spec.value, torch.Tensor):
        if is_python_subclass(spec.value):  # a wrapper subclass: gradtool perturbs its values
            return subclass_values(spec.value)
        if keeps_class(spec.value):  # perturbed as a plain tensor, forward sees its class
            return plain(spec.value).clone()
        return spec.value.detach().clone()  # the user's tensor is never touched (nor given .grad)
    return spec.value


def _check_arity(target: Target, n_positional: int, keywords: list[str]) -> None:
    signature = target.signature
    if signature is None:
        return
    try:
        signature.bind(*range(n_positional), **dict.fromkeys(keywords, 0))
    except TypeError as exc:
        names = ", ".join(target.arg_names) or "no arguments"
        known = list(signature.parameters)
        typo = next((did_you_mean(k, known) for k in keywords if k not in known), None)
        raise InputError(f"{target.name}: {n_positional} positional input(s)"
                         + (f" and keyword(s) {', '.join(keywords)}" if keywords else "")
                         + f" given, but forward takes ({names}): {exc}",
                         (f"{typo}; " if typo else "") +
                         "pass one --input per forward argument, in order; a keyword argument "
                         "as -i NAME=SPEC, a tuple argument as -i '(2x4, 2x4)'") from None


def arg_name(target: Target, position: int) -> str:
    """forward's name for a position; past its named ones, the *args parameter's, indexed
    (adjoint_params[0]), else argN."""
    names = target.arg_names
    if position < len(names):
        return names[position]
    params = target.signature.parameters.values() if target.signature else ()
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    return f"{star}[{position - len(names)}]" if star else f"arg{position}"


Scope = Callable[[Sequence[Any]], contextlib.AbstractContextManager[None]]
Bound = tuple[Callable[..., Any], Callable[..., Any] | None, list[tuple[str, torch.Tensor]],
              Scope | None]


def bind(target: Target, n_args: int, config: CheckConfig, seed: int) -> Bound:
    """(fn, a vmap-friendly twin of fn or None, [(parameter name, value)], scope or None).

    scope(args) is a context in which the target's parameters are args' values: Problem enters
    it around every backward too, so a backward that re-runs forward sees the same values.
    """
    return target.kind.bind(target, n_args, config, seed)


def batchable_forward(cls: type) -> Callable[..., Any]:
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


def bind_module(target: Target, n_args: int, config: CheckConfig, seed: int) -> Bound:
    from torch.nn.utils.stateless import _reparametrize_module

    module, owned = private_copy(target, seed)
    dtype, device = getattr(torch, config.dtype), config.device
    # a copy of the user's instance that no cast below changes computes what the instance does
    same = owned and not inspect.isclass(target.obj) and all(
        t.dtype == cast_dtype(t, dtype) and t.device == torch.device(device)
        for t in [*module.parameters(), *module.buffers()])
    # a copy is cast in place; the user's own instance (no copy possible) never is: its
    # parameters and buffers are swapped for cast clones around every call instead
    state = {} if owned else private_state(module, dtype, device)
    if owned:  # module.to(dtype) would cast complex buffers to real ones: cast each instead
        module._apply(lambda t: t.to(device=device, dtype=cast_dtype(t, dtype)))
    # the engine's values are plain tensors; forward sees each as its parameter's class
    like = dict(module.named_parameters())
    params = [(name, plain(state[name]) if name in state else plain(p).clone())
              for name, p in like.items()
              if p.requires_grad and p.is_floating_point() and config.module_parameters]
    names = [n for n, _ in params]
    kept = {n: like[n] for n in names if keeps_class(like[n])}  # forward sees their class

    @contextlib.contextmanager
    def scope(args: Sequence[Any]) -> Iterator[None]:
        if not state and not names:  # gradtool's own copy, no parameter checked: nothing to
            yield                    # swap (reparametrizing costs ~30 us a call for nothing)
            return
        # Swapped into the module (tied weights kept tied); nested scopes restore in turn.
        swapped = dict(zip(names, args[n_args:]))
        for name, template in kept.items():
            swapped[name] = retyped(swapped[name], template)
        with _reparametrize_module(module, {**state, **swapped}, tie_weights=True):
            yield

    @calls_user_code
    def call(*args: Any, **kwargs: Any) -> Any:
        with scope(args):
            return module(*args[:n_args], **kwargs)

    if same and not names:  # call(*args) is the user's instance's forward on the same values
        stands_for(call, target.obj)  # the drop-in's recorded outputs serve it (handed.py)
    # vmap's batched values are no subclass's: a subclass parameter is called plainly
    return call, None if kept else call, params, scope


def private_copy(target: Target, seed: int) -> tuple[torch.nn.Module, bool]:
    """A module of gradtool's own: built from the class, or a deep copy of the user's instance
    (so nothing of theirs changes: values, .grad, requires_grad, hooks, training flag), and
    True; or, where no deep copy is possible (a tensor subclass whose clone is another type,
    as quantised weights are), the user's instance itself and False: it is then only called
    with its parameters and buffers swapped for clones (private_state)."""
    module = instantiate(target, seed)
    if inspect.isclass(target.obj):
        return module, True
    try:
        return copy.deepcopy(module), True
    except Exception:  # noqa: BLE001 - any reason: the instance is used through clones instead
        return module, False


def private_state(module: torch.nn.Module, dtype: torch.dtype, device: str
                  ) -> dict[str, torch.Tensor]:
    """Clones of a module's parameters and buffers, cast as bind_module casts its own copy:
    what a call of the user's own instance reads and writes instead of theirs. A tensor that
    cannot be cloned (a subclass without a copy) is left out: forward reads the user's,
    unwritten."""
    state = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        try:
            state[name] = retyped(plain(t).to(device=device, copy=True,
                                              dtype=cast_dtype(t, dtype)), t)
        except Exception:  # noqa: BLE001 - read as it is
            continue
    return state


# A complex parameter or buffer follows the check's precision as a floating one does, and stays
# complex: module.to(torch.float64) casts it to a real tensor, dropping its imaginary part (an
# NUFFT's complex interpolation tables), so forward would run on values the user never has.
_COMPLEX_OF = {torch.float64: torch.complex128, torch.float32: torch.complex64}


def cast_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype a module's parameter or buffer is checked in: `dtype` for a floating one, its
    complex counterpart for a complex one (its own where there is none), else its own."""
    if t.is_floating_point():
        return dtype
    if t.is_complex():
        return _COMPLEX_OF.get(dtype, t.dtype)
    return t.dtype


def instantiate(target: Target, seed: int) -> torch.nn.Module:
    """The module instance: the user's, or one built from the class under a seeded RNG."""
    if not inspect.isclass(target.obj):
        return target.obj
    init = target.init
    # manual_seed seeds every device: the CUDA generators already in use are forked too
    devices = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        seed_all(seed)
        try:
            if isinstance(init, dict):
                return target.obj(**init)
            if isinstance(init, (list, tuple)):
                return target.obj(*init)
            return target.obj()
        except Exception as exc:
            hint = ("give constructor arguments with --init NAME=VALUE (repeat) or a YAML "
                    "spec's init: key, or check an instance (module:instance_name)")
            raise TargetError(f"cannot construct {target.qualname}({_init_text(init)}): "
                              f"{type(exc).__name__}: {exc}", hint) from exc


def _init_text(init: Any) -> str:
    if isinstance(init, dict):
        return ", ".join(f"{k}={v!r}" for k, v in init.items())
    if isinstance(init, (list, tuple)):
        return ", ".join(map(repr, init))
    return ""


@contextlib.contextmanager
def setup_errors() -> Iterator[None]:
    """Building a case from its inputs: gradtool's own exception is an InternalError (exit 3),
    never a raw one; the user's code raising (a module's constructor) stays the user's."""
    try:
        yield
    except (GradtoolError, InternalError):
        raise
    except Exception as exc:
        if raised_in_gradtool(exc):
            raise InternalError(exc, gradtool_frame(exc)) from exc
        raise
