"""Target kinds: one adapter per kind (function, module, callable, op) owning what differs."""

# Everything gradtool does differently for a kind of target is asked of its adapter: which
# object it claims and how it is made a Target (resolving), how it is bound to arguments
# (building cases), whether a command line reproduces it by name, and which checks apply to it
# (gating). No module outside this one compares a kind's name; the report keeps the name
# (`str(kind)`). Adding a kind is one adapter here plus its place in KINDS.
# No torch at module level: load.py imports this on the CLI's path.

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from ..errors import TargetError
from .load import Target, is_once_differentiable, source_of

if TYPE_CHECKING:
    from ..config.registry import CheckInfo
    from ..config.settings import CheckConfig


class Kind:
    """One kind of target; str() is its name, the report's `kind`."""

    name = ""
    article = ""               # "a custom op (torch.library)": said when a check is not for it
    function_class = False     # an autograd.Function class: its own backward node is reachable
    parameters = False         # an nn.Module: its parameters are inputs; --init builds the class
    composite = False          # user code that may call custom Functions and ops inside
    op = False                 # a torch.library op: the op_* checks apply
    trusted_anywhere = False   # a spec may name it from an installed package without opt-in
    named_reproducibly = False  # its Target name always loads back (file.py:ns::name)
    batched_keywords = True    # its vmap twin takes keyword arguments rebuilt from leaves

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<target kind {self.name}>"

    def __reduce__(self) -> Any:  # pickled by name: workers send Targets back as the same adapter
        return (named, (self.name,))

    def claims(self, obj: Any) -> bool:
        """This kind's object (after an autograd.Function's apply is unwrapped)."""
        raise NotImplementedError

    def make(self, obj: Any, name: str, init: Any = None) -> Target:
        """The Target of an object this kind claims."""
        raise NotImplementedError

    def bind(self, target: Target, n_args: int, config: CheckConfig, seed: int) -> Any:
        """(fn, vmap twin or None, [(parameter name, value)], scope or None): targets/cases.py."""
        return target.obj, target.obj, [], None

    def plain_call(self, target: Target) -> Callable[..., Any]:
        """The target as a function of its arguments (a --reference, a recorded call)."""
        return target.obj

    def applies(self, info: CheckInfo) -> str | None:
        """Why a registered check is not for this kind (the registry's `targets`), or None."""
        if self.name in info.targets:
            return None
        return "not " + " or ".join(named(k).article for k in info.targets)

    def blocked(self, info: CheckInfo, case: Any, context: Any) -> str | None:
        """Why a check that applies cannot run on this case (reported skipped), or None."""
        return None

    def own_checks(self) -> tuple[str, ...]:
        """The default checks registered for this kind alone (the op checks, for ops)."""
        from ..config.registry import REGISTRY

        return tuple(i.name for i in REGISTRY if i.default and i.targets == (self.name,))


class FunctionKind(Kind):
    name, article = "function", "a torch.autograd.Function"
    function_class = trusted_anywhere = True
    batched_keywords = False

    def claims(self, obj: Any) -> bool:
        import torch

        return inspect.isclass(obj) and issubclass(obj, torch.autograd.Function)

    def make(self, obj: Any, name: str, init: Any = None) -> Target:
        from torch.autograd import Function

        if obj.forward is Function.forward or obj.backward is Function.backward:
            raise TargetError(f"{name}: Function subclass must define both forward and backward "
                              "as static methods")
        # forward(ctx, ...) unless the class defines setup_context (the PyTorch 2 style)
        combined = getattr(obj, "setup_context", Function.setup_context) is Function.setup_context
        signature = inspect.signature(obj.forward)
        params = list(signature.parameters.values())[1 if combined else 0:]
        return Target(
            name=name, kind=self, obj=obj, qualname=obj.__qualname__,
            arg_names=_positional(params), signature=signature.replace(parameters=params),
            function_cls=obj, source=source_of(obj.backward),
            forward_source=source_of(obj.forward),
            once_differentiable=is_once_differentiable(obj.backward))

    def bind(self, target: Target, n_args: int, config: CheckConfig, seed: int) -> Any:
        from .cases import batchable_forward

        return target.obj.apply, batchable_forward(target.obj), [], None

    def plain_call(self, target: Target) -> Callable[..., Any]:
        return target.obj.apply


class ModuleKind(Kind):
    name, article = "module", "an nn.Module"
    parameters = composite = trusted_anywhere = True

    def claims(self, obj: Any) -> bool:
        import torch

        return isinstance(obj, torch.nn.Module) or \
            (inspect.isclass(obj) and issubclass(obj, torch.nn.Module))

    def make(self, obj: Any, name: str, init: Any = None) -> Target:
        cls = obj if inspect.isclass(obj) else type(obj)
        signature = inspect.signature(cls.forward)
        params = list(signature.parameters.values())[1:]  # drop self
        return Target(
            name=name, kind=self, obj=obj, qualname=cls.__qualname__,
            arg_names=_positional(params), signature=signature.replace(parameters=params),
            init=init, source=source_of(cls.forward), forward_source=source_of(cls.forward))

    def bind(self, target: Target, n_args: int, config: CheckConfig, seed: int) -> Any:
        from .cases import bind_module

        return bind_module(target, n_args, config, seed)


class CallableKind(Kind):
    name, article = "callable", "a callable"
    composite = True

    def claims(self, obj: Any) -> bool:
        return callable(obj) and not inspect.isclass(obj)

    def make(self, obj: Any, name: str, init: Any = None) -> Target:
        try:
            signature: inspect.Signature | None = inspect.signature(obj)
        except (TypeError, ValueError):
            signature = None
        return Target(
            name=name, kind=self, obj=obj, qualname=getattr(obj, "__qualname__", name),
            arg_names=_positional(signature.parameters.values() if signature else ()),
            signature=signature, source=source_of(obj), forward_source=source_of(obj))


class OpKind(Kind):
    name, article = "op", "a custom op (torch.library)"
    op = named_reproducibly = True

    def claims(self, obj: Any) -> bool:
        from .ops import is_op

        return is_op(obj)

    def make(self, obj: Any, name: str, init: Any = None) -> Target:
        """A CustomOpDef, OpOverload or OpOverloadPacket, with a signature from its schema."""
        import torch

        from .ops import backward_line, pick_overload, registration_line, schema_signature

        overload = obj
        if isinstance(obj, torch._ops.OpOverloadPacket):
            overload = pick_overload(obj, name)
        elif not isinstance(obj, torch._ops.OpOverload):
            overload = obj._opoverload  # a CustomOpDef
        suffix = "" if overload._overloadname == "default" else f".{overload._overloadname}"
        signature = schema_signature(overload._schema)
        registered_at = registration_line(overload)  # op checks' "look at"; backward: gradients'
        return Target(
            name=name, kind=self, obj=overload, qualname=overload._schema.name + suffix,
            arg_names=tuple(p.name for p in signature.parameters.values()
                            if p.kind is p.POSITIONAL_OR_KEYWORD),
            signature=signature, source=backward_line(overload) or registered_at,
            forward_source=registered_at,
            extra={"op": overload, "registered_at": registered_at})

    def bind(self, target: Target, n_args: int, config: CheckConfig, seed: int) -> Any:
        from .ops import bound

        return bound(target.obj), bound(target.obj), [], None

    def blocked(self, info: CheckInfo, case: Any, context: Any) -> str | None:
        """A check running backward on an op with no autograd formula: one finding
        (op_autograd's), not one error per check."""
        if not info.needs_backward:
            return None
        from .ops import no_autograd

        return no_autograd(context.target.obj, bool(case.problem.diff), context.config.device)


FUNCTION, MODULE, CALLABLE, OP = FunctionKind(), ModuleKind(), CallableKind(), OpKind()
KINDS: tuple[Kind, ...] = (FUNCTION, MODULE, CALLABLE, OP)
# The order targets/resolve.py asks in: an op is callable too, a Function class is a class.
CLASSIFY: tuple[Kind, ...] = (OP, FUNCTION, MODULE, CALLABLE)
_BY_NAME = {kind.name: kind for kind in KINDS}
NAMES = tuple(_BY_NAME)


def op_target(obj: Any, name: str) -> Target:
    """The Target of an op object (one found by its registered name or in a module)."""
    return OP.make(obj, name)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _positional(params: Any) -> tuple[str, ...]:
    """forward's positional argument names (no ctx, no self)."""
    return tuple(p.name for p in params if p.kind in _POSITIONAL)


def named(name: str) -> Kind:
    """The adapter of a kind's name (a recorded call's, a pickled Target's)."""
    return _BY_NAME[name]
