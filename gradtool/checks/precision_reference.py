"""The float64 reference of a low-precision run: reference= a callable (kept in the config's
extra) or 'module:fn' / 'file.py:fn'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config.settings import CheckConfig


def reference_of(config: CheckConfig) -> Callable[..., Any] | None:
    """The run's reference callable, or None: a callable given to gradtool.check (its name in
    config.reference, the object in config.extra), else the named one loaded."""
    if "reference" in config.extra:
        return given_reference(config.extra["reference"])
    return load_reference(config.reference) if config.reference else None


def given_reference(obj: Any) -> Callable[..., Any]:
    """reference= given as an object: a Function class runs as its apply, anything else as is."""
    import torch

    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return obj.apply
    return obj


def load_reference(text: str) -> Callable[..., Any]:
    """'module:fn' or 'file.py:fn' -> the callable (a Function class -> its apply)."""
    from ..errors import TargetError
    from ..targets.resolve import resolve

    targets = resolve(text)
    if len(targets) != 1:
        raise TargetError(f"--reference {text!r} must name one callable, found {len(targets)}",
                          "give module:function or file.py:function")
    found = targets[0]
    if found.kind.parameters:
        raise TargetError(f"--reference {text!r} is an nn.Module; give a function of the "
                          "target's arguments (inputs, then parameters)", "wrap it in a function")
    return found.kind.plain_call(found)
