"""Custom ops as targets: CustomOpDef, OpOverload(Packet), 'ns::name'; schema-derived signatures."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import InputError, TargetError

# [location:]ns::name[.overload]; the location (a file or module) is imported first.
QUALIFIED = re.compile(r"^(?:(?P<location>.+):)?(?P<ns>[A-Za-z_]\w*)::(?P<name>[A-Za-z_]\w*)"
                       r"(?:\.(?P<overload>[A-Za-z_]\w*))?$")
BUILTIN_NAMESPACES = ("aten", "prim", "prims")
_NUMBERS = {"float": float, "int": int, "bool": bool, "SymInt": int}


def is_qualified(text: str) -> bool:
    """'ns::name' (optionally after 'file.py:' or 'module:'): an op by its registered name."""
    return "::" in text and QUALIFIED.match(text) is not None


def is_op(obj: Any) -> bool:
    """A custom op object: torch.library.custom_op's CustomOpDef or an OpOverload(Packet)."""
    import torch

    from torch._library.custom_ops import CustomOpDef

    return isinstance(obj, (CustomOpDef, torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def resolve(text: str, init: Any = None, imports: Sequence[str] = ()) -> list[Any]:
    """load.resolve, knowing ops: 'ns::name' (after 'file.py:' or --import) is an op by its
    registered name, a CustomOpDef or OpOverload is an op target, and a module or file alone
    yields the ops it defines too."""
    from ..errors import NothingToCheck
    from . import load

    if is_qualified(text):
        return [resolve_qualified(text, imports)]
    location, name = load.split_target(text)
    if name is not None:
        return [as_op(t) for t in load.resolve(text, init)]
    ops = discover_ops(load.load_module(location), location)
    try:
        return load.resolve(text, init) + ops
    except NothingToCheck:
        if ops:
            return ops
        raise NothingToCheck(f"{location} defines no torch.autograd.Function, nn.Module subclass "
                             f"or custom op (nothing to check); name a callable explicitly: "
                             f"{location}:NAME") from None


def make_target(obj: Any, name: str, init: Any = None) -> Any:
    """load.make_target, knowing ops (an op object is named 'file.py:ns::name' when its
    registration file is known, so the reproduce command runs as printed)."""
    from . import load

    if not is_op(obj):
        return load.make_target(obj, name, init)
    target = op_target(obj, name)
    where = target.extra["registered_at"]
    qualname = target.qualname
    target.name = f"{where.rpartition(':')[0]}:{qualname}" if where else qualname
    return target


def as_op(target: Any) -> Any:
    """A target load classified as a plain callable, made an op target when it is one."""
    return op_target(target.obj, target.name) if is_op(target.obj) else target


def resolve_qualified(text: str, imports: Sequence[str] = ()) -> Any:
    """The Target of 'ns::name' once the module registering it is imported (the location before
    the name, or --import); TargetError naming the fix when torch does not know it."""
    from .load import load_module

    match = QUALIFIED.match(text)
    if match is None:
        raise TargetError(f"{text!r} is not an op name",
                          "write it as ns::name or ns::name.overload")
    location = match["location"]
    for where in ([location] if location else []):
        load_module(where)
    overload = _find(match["ns"], match["name"], match["overload"], text, location, imports)
    name = text if location else _named(text, overload, imports)
    return op_target(overload, name)


def _find(ns: str, name: str, overload: str | None, text: str, location: str | None,
          imports: Sequence[str]) -> Any:
    import torch

    qualname = f"{ns}::{name}"
    try:
        packet = getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        where = f"importing {location}" if location else (
            f"importing {', '.join(imports)}" if imports else "nothing was imported")
        raise TargetError(f"no op {qualname} is registered ({where} did not define it)",
                          "import the module that registers it: --import ops.py (repeat), "
                          f"or name it as ops.py:{qualname}; in a spec, op: with import:"
                          ) from None
    return pick_overload(packet, text) if overload is None else _overload(packet, overload, text)


def _overload(packet: Any, overload: str, text: str) -> Any:
    if overload not in packet.overloads():
        raise TargetError(f"{text}: no overload {overload!r}",
                          f"available: {', '.join(packet.overloads()) or 'none'}")
    return getattr(packet, overload)


def pick_overload(packet: Any, text: str) -> Any:
    """An OpOverloadPacket's default overload, or its only one."""
    names = packet.overloads()
    if "default" in names:
        return packet.default
    if len(names) == 1:
        return getattr(packet, names[0])
    raise TargetError(f"{text} has overloads {', '.join(names)}; name one",
                      f"e.g. {packet._qualified_op_name}.{names[0]}")


def _named(text: str, overload: Any, imports: Sequence[str]) -> str:
    """'ops.py:ns::name' when one of the imports registered it: the name alone reproduces it."""
    from .load import display_path, source_of

    opdef = custom_op_def(overload)
    home = source_of(user_function(opdef)) if opdef is not None else None
    for location in imports:
        if home and location.endswith(".py") and \
                display_path(home.rpartition(":")[0]) == display_path(location):
            return f"{location}:{text}"
    builtin = overload.namespace in BUILTIN_NAMESPACES
    return f"{imports[0]}:{text}" if len(imports) == 1 and opdef is None and not builtin else text


def op_target(obj: Any, name: str) -> Any:
    """A Target of kind 'op' for a CustomOpDef, OpOverload or OpOverloadPacket."""
    import torch

    from .load import Target

    overload = obj
    if isinstance(obj, torch._ops.OpOverloadPacket):
        overload = pick_overload(obj, name)
    elif not isinstance(obj, torch._ops.OpOverload):
        overload = obj._opoverload  # a CustomOpDef
    qualname = overload._schema.name
    suffix = "" if overload._overloadname == "default" else f".{overload._overloadname}"
    signature = schema_signature(overload._schema)
    registered_at = registration_line(overload)  # op checks' "look at"; backward: gradients'
    return Target(
        name=name, kind="op", obj=overload, qualname=qualname + suffix,
        arg_names=tuple(p.name for p in signature.parameters.values()
                        if p.kind is p.POSITIONAL_OR_KEYWORD),
        signature=signature, source=backward_line(overload) or registered_at,
        forward_source=registered_at, extra={"op": overload, "registered_at": registered_at})


def bound(overload: Any) -> Any:
    """The op as a Problem's fn: gradtool's call site of user code (torch raising after the
    user's kernel returned, e.g. custom_op refusing an aliasing output, is the user's)."""
    from ..tracebacks import calls_user_code

    @calls_user_code
    def call(*args: Any, **kwargs: Any) -> Any:
        return overload(*args, **kwargs)

    return call


def user_function(opdef: Any) -> Any:
    """The Python function a CustomOpDef was made from (triton_op wraps it in torch's own)."""
    fn = inspect.unwrap(opdef._init_fn)
    if not getattr(fn, "__module__", "").startswith("torch."):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        inner = cell.cell_contents
        if inspect.isfunction(inner) and not inner.__module__.startswith("torch."):
            return inspect.unwrap(inner)
    return fn


def backward_line(overload: Any) -> str | None:
    """file:line of the backward given to register_autograd (custom_op), else None."""
    from .load import source_of

    opdef = custom_op_def(overload)
    backward = getattr(opdef, "_backward_fn", None) if opdef is not None else None
    return source_of(backward) if backward is not None else None


def is_triton_op(overload: Any) -> bool:
    """Made with torch.library.triton_op."""
    opdef = custom_op_def(overload)
    return opdef is not None and \
        getattr(inspect.unwrap(opdef._init_fn), "__module__", "") == "torch._library.triton"


def custom_op_def(overload: Any) -> Any:
    """The CustomOpDef behind an OpOverload (None for a torch.library.Library or C++ op)."""
    from torch._library.custom_ops import OPDEFS

    return OPDEFS.get(overload._schema.name)


def registration_line(overload: Any) -> str | None:
    """file:line where the op is registered: custom_op's decorator, or where the Library that
    defined it was made (torch's dispatcher records it)."""
    from .load import display_path

    opdef = custom_op_def(overload)
    if opdef is not None:
        try:
            fn = user_function(opdef)
            _, line = inspect.getsourcelines(fn)
            return f"{display_path(inspect.getsourcefile(fn) or '?')}:{line}"
        except (TypeError, OSError):
            return None
    import torch

    found = re.search(r"registered at (\S+):(\d+)", torch._C._dispatch_dump(overload._schema.name))
    return f"{display_path(found[1])}:{found[2]}" if found and found[1].endswith(".py") else None


def schema_signature(schema: Any) -> inspect.Signature:
    """A Python signature from the op's schema: annotations (Tensor, float, ...) and defaults,
    so the ordinary input inference applies."""
    import torch

    params = []
    for arg in schema.arguments:
        kind = (inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        text = str(arg.type)
        annotation: Any = torch.Tensor if text == "Tensor" else _NUMBERS.get(text, text)
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.name, kind, annotation=annotation, default=default))
    return inspect.Signature(params)


def require_inferable(target: Any) -> None:
    """InputError naming the arguments whose type the schema leaves open (no default)."""
    unknown = [f"{p.name}: {p.annotation}" for p in target.signature.parameters.values()
               if p.default is inspect.Parameter.empty and not _inferable(p.annotation)]
    if unknown:
        raise InputError(f"{target.name}: the schema of {target.qualname} does not say enough "
                         f"to infer inputs ({'; '.join(unknown)} without a default)",
                         "give every argument with -i, in order (e.g. -i 3x4 -i '[0, 1]'); "
                         "in a spec, inputs:")


def _inferable(annotation: Any) -> bool:
    import torch

    return annotation is torch.Tensor or annotation in (float, int, bool) or \
        annotation == "Tensor?"


def discover_ops(module: ModuleType, display: str) -> list[Any]:
    """Targets for the CustomOpDefs a module defines at top level (not those it imports)."""
    from torch._library.custom_ops import CustomOpDef

    found = []
    for attr, obj in vars(module).items():
        if isinstance(obj, CustomOpDef) and \
                getattr(user_function(obj), "__module__", None) == module.__name__:
            found.append(op_target(obj, f"{display}:{attr}"))
    return found + _library_ops(module, display)


def _library_ops(module: ModuleType, display: str) -> list[Any]:
    """Ops a module defines with torch.library.Library (their registration line is in it)."""
    import torch

    from torch._library.custom_ops import OPDEFS

    from .load import display_path

    home = getattr(module, "__file__", None)
    found = []
    for qualname in sorted(torch.library._defs):
        ns, _, name = qualname.partition("::")
        if ns in BUILTIN_NAMESPACES or qualname in OPDEFS or not home:
            continue
        try:
            overload = pick_overload(getattr(getattr(torch.ops, ns), name), qualname)
        except (AttributeError, RuntimeError, TargetError):
            continue
        line = registration_line(overload)
        if line and line.rpartition(":")[0] == display_path(home):
            found.append(op_target(overload, f"{display}:{qualname}"))
    return found


def import_all(locations: Sequence[str]) -> list[ModuleType]:
    """--import: each module or file, in order (so the ops they register exist)."""
    from .load import load_module

    return [load_module(location) for location in locations]


def silence_vmap_fallback(enabled: bool = False) -> None:
    """torch prints "There is a performance drop because we have not yet implemented the
    batching rule for ns::op" (from C++, once per op) when gradtool's own batched evaluations
    meet an op without a vmap rule: noise in a report, and not the user's vmap."""
    import torch

    torch._C._functorch._set_vmap_fallback_warning_enabled(enabled)
