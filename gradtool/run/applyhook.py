"""Every custom Function application seen from inside, the same on every torch version: the
class's forward, setup_context and backward, as apply and the engine look them up, wrapped.

torch <= 2.13's `Function.apply` is Python, 2.14's is C; both look `cls.forward` (and
`cls.setup_context`, and the engine `cls.backward`) up on the class at every call. A property
of that name set on the metaclass `FunctionMeta` is a data descriptor of the metatype, so it
wins over the class's own `__dict__` for every lookup: `Cls.apply(...)`, an alias
`my_op = Cls.apply` captured at import, a subclass or a class made while hooked alike. The
properties live only while a hook is active, and are always deleted after.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.autograd.function import FunctionMeta, _SingleLevelFunction

HOOK_FILE = "<gradtool hook of "  # the made forward's file name: gradtool's frame (sites.py)

_NAMES = ("forward", "setup_context", "backward", "vjp")  # vjp: backward's other name
_local = threading.local()  # .bypass: nested applications run the real methods


@dataclass(eq=False)
class Call:
    """One application, as its forward runs: its class, what apply gave forward, and the node
    (ctx) once known — at once for a forward taking ctx, from setup_context otherwise."""

    cls: type
    args: tuple[Any, ...]      # forward's arguments, without ctx
    kwargs: dict[str, Any]
    forward: Callable[..., Any] = field(repr=False)  # the class's own, unwrapped
    ctx: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # what a hook keeps for its backward

    def run(self, args: tuple[Any, ...] | None = None, ctx: Any = None) -> Any:
        """The real forward, on apply's arguments (or others), given apply's ctx (or another)
        where it takes one."""
        args = self.args if args is None else args
        if takes_ctx(self.cls):
            return self.forward(self.ctx if ctx is None else ctx, *args, **self.kwargs)
        return self.forward(*args, **self.kwargs)


class Hook:
    """Overridden by each use: what happens at an application's forward and at its backward."""

    def forward(self, call: Call) -> Any:
        return call.run()

    def backward(self, call: Call, backward: Callable[..., Any], ctx: Any,
                 grads: tuple[Any, ...]) -> Any:
        return backward(ctx, *grads)


_hooks: list[Hook] = []
# id(ctx) -> its Call, only where the hook kept something (call.extra) for its backward
_calls_by_ctx: dict[int, Call] = {}


def takes_ctx(cls: type) -> bool:
    """Whether forward gets ctx first (no setup_context of its own)."""
    return _raw(cls, "setup_context") is _SingleLevelFunction.__dict__["setup_context"].__func__


def same_definition(a: type, b: type) -> bool:
    """Whether two Function classes are one definition: the same class, or two that a factory
    made from one class statement (qpth's QPFunction(...) makes a new class at every call, so
    a re-run of the forward applies a class the first run never saw)."""
    if a is b:
        return True
    if (a.__module__, a.__qualname__) != (b.__module__, b.__qualname__):
        return False
    codes = [(_code(a, name), _code(b, name)) for name in ("forward", "backward",
                                                            "setup_context")]
    return codes[0][0] is not None and all(x is y for x, y in codes)


def definition_key(cls: type) -> Any:
    """A hashable key of one definition: the class itself, or for a class made inside a
    function (a new one at every call of its factory), its name and its methods' code, the
    same for every class same_definition holds between."""
    if "<locals>" not in cls.__qualname__:
        return cls
    return (cls.__module__, cls.__qualname__,
            *(_code(cls, name) for name in ("forward", "backward", "setup_context")))


def _code(cls: type, name: str) -> Any:
    """The code object of cls.name as defined (the hook's properties aside), or None."""
    try:
        raw = _raw(cls, name)
    except StopIteration:
        return None
    return getattr(raw, "__code__", None)


def _owner(cls: type, name: str) -> type:
    return next(klass for klass in cls.__mro__ if name in klass.__dict__)


def _raw(cls: type, name: str) -> Any:
    """cls.name as Python would give it, the properties aside."""
    return _owner(cls, name).__dict__[name].__get__(None, cls)


def _is_torch(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "torch"


def _wrapped(cls: type, name: str) -> Any:
    real = _raw(cls, name)
    # torch's own classes (checkpointing, custom ops' Functions) and torch's defaults pass
    # through untouched: apply compares setup_context and backward with the defaults.
    if not _hooks or getattr(_local, "bypass", False) or _is_torch(cls) \
            or _is_torch(_owner(cls, name)):
        return real
    return _MAKERS[name](cls, real)


def _forward(cls: type, real: Callable[..., Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "bypass", False) or not _hooks:
            return real(*args, **kwargs)
        ctx, user = (args[0], args[1:]) if takes_ctx(cls) else (None, args)
        call = Call(cls, tuple(user), dict(kwargs), real, ctx)
        _local.last = call
        result = _hooks[-1].forward(call)
        # a Function applied inside this forward (pypose's Exp inside its Act) set `last` to
        # its own call meanwhile, and its setup_context took it: this class's comes next
        _local.last = call
        if ctx is not None and call.extra:
            _calls_by_ctx[id(ctx)] = call  # kept only where the hook has a backward to run
        return result
    return _shaped_like(real, forward)


_UNSET = object()  # a keyword-only argument apply did not pass
_SHAPED: dict[Any, Callable[..., Any]] = {}  # real forward -> its compiled trampoline maker


def _shaped_like(real: Callable[..., Any], body: Callable[..., Any]) -> Callable[..., Any]:
    """body, behind a function with real's own parameters: torch's C apply maps keyword
    arguments to positions by the code object of the forward it finds, and apply binds
    defaults by its signature."""
    make = _SHAPED.get(real)
    if make is None:
        make = _SHAPED[real] = _trampoline(real)
    shaped = make(body)
    functools.update_wrapper(shaped, real)
    return shaped


def _trampoline(real: Callable[..., Any]) -> Callable[..., Any]:
    try:
        parameters = list(inspect.signature(real).parameters.values())
    except (TypeError, ValueError):  # no signature to copy: a plain pass-through
        return lambda body: (lambda *args, **kwargs: body(*args, **kwargs))
    head, call, optional, star = [], [], [], False
    for p in parameters:
        default = f"=__defaults[{p.name!r}]" if p.default is not p.empty else ""
        if p.kind is p.VAR_POSITIONAL:
            head.append(f"*{p.name}")
            call.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            head.append(f"**{p.name}")
            call.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                head.append("*")
                star = True
            if default:  # passed on only when given: forward applies its own default
                head.append(f"{p.name}=__unset")
                optional.append(f"({p.name!r}, {p.name})")
            else:
                head.append(p.name)
                call.append(f"{p.name}={p.name}")
        else:
            head.append(p.name + default)
            call.append(p.name)
            if p.kind is p.POSITIONAL_ONLY and (p is parameters[-1] or
                                                parameters[parameters.index(p) + 1].kind
                                                is not p.POSITIONAL_ONLY):
                head.append("/")
    if optional:
        call.append(f"**{{k: v for k, v in ({', '.join(optional)},) if v is not __unset}}")
    source = (f"def __make(__body):\n    def forward({', '.join(head)}):\n"
              f"        return __body({', '.join(call)})\n    return forward\n")
    scope: dict[str, Any] = {"__defaults": {p.name: p.default for p in parameters
                                            if p.default is not p.empty}, "__unset": _UNSET}
    exec(compile(source, f"{HOOK_FILE}{getattr(real, '__qualname__', 'forward')}>",
                 "exec"), scope)  # noqa: S102 - source built from parameter names only
    return scope["__make"]


def _setup_context(cls: type, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def setup_context(ctx: Any, inputs: Any, output: Any) -> Any:
        call, _local.last = getattr(_local, "last", None), None
        if call is not None and call.cls is cls and call.ctx is None:
            call.ctx = ctx  # runs right after this class's forward, in the same apply
            if call.extra:
                _calls_by_ctx[id(ctx)] = call
        return real(ctx, inputs, output)
    return setup_context


def _backward(cls: type, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def backward(ctx: Any, *grads: Any) -> Any:
        call = _calls_by_ctx.get(id(ctx))
        if call is None or call.ctx is not ctx:
            return real(ctx, *grads)
        return _hooks[-1].backward(call, real, ctx, grads)
    return backward


_MAKERS = {"forward": _forward, "setup_context": _setup_context, "backward": _backward,
           "vjp": _backward}


def _property(name: str) -> property:
    def get(cls: type) -> Any:
        return _wrapped(cls, name)

    def put(cls: type, value: Any) -> None:  # torch's own code assigns cls.forward sometimes
        delattr(FunctionMeta, name)
        try:
            setattr(cls, name, value)
        finally:
            setattr(FunctionMeta, name, _PROPERTIES[name])
    return property(get, put)


_PROPERTIES = {name: _property(name) for name in _NAMES}


@contextlib.contextmanager
def hooked(hook: Hook) -> Iterator[None]:
    """Every user Function application goes through hook for the duration (a hook entered
    inside another one takes over until it exits); the metaclass is restored after, even on
    error."""
    if not _hooks:
        for name, prop in _PROPERTIES.items():
            setattr(FunctionMeta, name, prop)
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)
        if not _hooks:
            for name in _NAMES:
                delattr(FunctionMeta, name)
            _calls_by_ctx.clear()
            _local.last = None


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Applications made here (by a hook) run the real methods, unseen by every hook."""
    before = getattr(_local, "bypass", False)
    _local.bypass = True
    try:
        yield
    finally:
        _local.bypass = before
