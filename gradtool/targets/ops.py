"""Custom ops: CustomOpDef, OpOverload(Packet), 'ns::name'; schemas, registrations, autograd."""

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


def find_op(ns: str, name: str, overload: str | None, text: str, location: str | None,
          imports: Sequence[str]) -> Any:
    import torch

    qualname = f"{ns}::{name}"
    try:
        packet = getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        where = (f"importing {location} did not define it" if location else
                 f"importing {', '.join(imports)} did not define it" if imports else
                 "nothing was imported to define it")
        raise TargetError(f"no op {qualname} is registered ({where})",
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


def qualified_name(text: str, overload: Any, imports: Sequence[str]) -> str:
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


NO_RETURNS = "the op returns nothing (it writes in place): no output to differentiate"


def autograd_registered(op: Any, device: str = "cpu") -> bool:
    """An autograd kernel exists: custom_op's register_autograd, or a kernel at an Autograd key
    (torch.library.register_autograd, C++) or a composite one (autograd through its parts)."""
    import torch

    opdef = custom_op_def(op)
    if opdef is not None:  # custom_op always installs a kernel; it raises without a formula
        return getattr(opdef, "_backward_fn", None) is not None
    key = {"cuda": "AutogradCUDA", "xpu": "AutogradXPU"}.get(torch.device(device).type,
                                                             "AutogradCPU")
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(op._schema.name, k)
               for k in (key, "Autograd", "CompositeImplicitAutograd"))


def no_autograd(op: Any, differentiable: bool, device: str) -> str | None:
    """Why a check that runs backward is skipped on this op (None: it runs): nothing to
    differentiate, or no autograd formula (op_autograd's finding says so once)."""
    if not differentiable:
        return None
    if not op._schema.returns:
        return NO_RETURNS
    if autograd_registered(op, device):
        return None
    return f"not run: {op._schema.name} has no autograd formula (see op_autograd)"


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


def registered_ops(module: ModuleType) -> list[tuple[str, Any]]:
    """(qualname, overload) of the ops a module defines with torch.library.Library (their
    registration line is in its file)."""
    import torch

    from torch._library.custom_ops import OPDEFS

    from .load import display_path

    home = getattr(module, "__file__", None)
    # torch before 2.7 records a Python registration at /dev/null: the module's own Library
    # objects name the ops it defines there.
    held = {qualname for obj in vars(module).values() if isinstance(obj, torch.library.Library)
            for qualname in getattr(obj, "_op_defs", ())}
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
        if qualname in held or line and line.rpartition(":")[0] == display_path(home):
            found.append((qualname, overload))
    return found


def import_all(locations: Sequence[str]) -> list[ModuleType]:
    """--import: each module or file, in order (so the ops they register exist)."""
    from .load import load_module

    return [load_module(location) for location in locations]
