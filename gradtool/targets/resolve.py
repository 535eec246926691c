"""Resolve "pkg.mod:Name" / "path/file.py:Name" / "ns::name" / a module alone into Targets."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import NothingToCheck, TargetError
from .kinds import CLASSIFY, FUNCTION, op_target
from .load import Target, load_module, lookup, split_target
from .ops import QUALIFIED, find_op, is_qualified, qualified_name, registered_ops, user_function


def resolve(text: str, init: Any = None, imports: Sequence[str] = ()) -> list[Target]:
    """Turn a target string into targets: 'ns::name' (after 'file.py:' or --import) is an op by
    its registered name; a module or file alone yields every Function, nn.Module and custom op
    it defines."""
    if is_qualified(text):
        return [resolve_qualified(text, imports)]
    location, name = split_target(text)
    module = load_module(location)
    if name is not None:
        return [classify(lookup(module, name, location), f"{location}:{name}", init)]
    found = discover(module, location) + discover_ops(module, location)
    if not found:
        raise NothingToCheck(f"{location} defines no torch.autograd.Function, nn.Module subclass "
                             f"or custom op (nothing to check); name a callable explicitly: "
                             f"{location}:NAME")
    return found


def classify(obj: Any, name: str, init: Any = None) -> Target:
    """The Target of an object, by the first kind that claims it (an op before a callable;
    LinearFunction.apply is its Function class)."""
    owner = getattr(obj, "__self__", None)
    if FUNCTION.claims(owner):
        obj = owner
    for kind in CLASSIFY:
        if kind.claims(obj):
            return kind.make(obj, name, init)
    raise TargetError(f"{name} is a {type(obj).__name__}, not something gradtool can check",
                      "a target is a torch.autograd.Function subclass, an nn.Module "
                      "(class or instance) or a callable taking tensors")


def make_target(obj: Any, name: str, init: Any = None) -> Target:
    """classify(), naming an op object 'file.py:ns::name' when its registration file is known
    (so the reproduce command runs as printed)."""
    target = classify(obj, name, init)
    if target.kind.op:
        where = target.extra["registered_at"]
        target.name = f"{where.rpartition(':')[0]}:{target.qualname}" if where \
            else target.qualname
    return target


def discover(module: ModuleType, display: str) -> list[Target]:
    """Every Function and nn.Module subclass defined in the module itself (not imported ones)."""
    import torch

    found = []
    for attr, obj in vars(module).items():
        if not inspect.isclass(obj) or obj.__module__ != module.__name__:
            continue
        if issubclass(obj, torch.autograd.Function) or issubclass(obj, torch.nn.Module):
            found.append(classify(obj, f"{display}:{attr}"))
    return found


def discover_ops(module: ModuleType, display: str) -> list[Target]:
    """Targets for the ops a module defines at top level (not those it imports): CustomOpDefs,
    then torch.library.Library definitions registered from its file."""
    from torch._library.custom_ops import CustomOpDef

    found = []
    for attr, obj in vars(module).items():
        if isinstance(obj, CustomOpDef) and \
                getattr(user_function(obj), "__module__", None) == module.__name__:
            found.append(op_target(obj, f"{display}:{attr}"))
    return found + [op_target(overload, f"{display}:{qualname}")
                    for qualname, overload in registered_ops(module)]


def resolve_qualified(text: str, imports: Sequence[str] = ()) -> Target:
    """The Target of 'ns::name' once the module registering it is imported (the location before
    the name, or --import); TargetError naming the fix when torch does not know it."""
    match = QUALIFIED.match(text)
    if match is None:
        raise TargetError(f"{text!r} is not an op name",
                          "write it as ns::name or ns::name.overload")
    location = match["location"]
    for where in ([location] if location else []):
        load_module(where)
    overload = find_op(match["ns"], match["name"], match["overload"], text, location, imports)
    name = text if location else qualified_name(text, overload, imports)
    return op_target(overload, name)
