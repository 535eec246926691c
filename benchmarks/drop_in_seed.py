"""pytest plugin for drop_in.py --seed-bug: a real bug planted in a project's own backward.

Loaded with `-p drop_in_seed` (benchmarks/ on PYTHONPATH) when GRADTOOL_DROPIN_SEED names the
targets, `module:Class` separated by commas: each is a torch.autograd.Function of the installed
project whose `backward` is replaced, at pytest's configure time (before the test modules
import it), by one that returns every gradient it computed times GRADTOOL_DROPIN_SEED_SCALE
(1.01 unless set): a wrong constant in the vector-Jacobian product, the kind of bug gradcheck
exists to find. With GRADTOOL_DROPIN_SEED_KIND=double the gradients keep their values and only
their own derivative is scaled (`g.detach() + (g - g.detach()) * scale`, as a backward that
detaches part of its graph): gradcheck passes, gradgradcheck fails. The installed files are never edited; the class attribute is swapped in this
process only and put back at the end of the session.

Each target also counts its calls: `apply` (the forward, from the user's code or from the
project's own backward) and `backward` (the vector-Jacobian products), so that drop_in_probe.py
can say how many evaluations each tool made on a call (`counts()`).
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any, Callable

_COUNTS: dict[str, list[int]] = {}  # target -> [applies, backwards]
_UNDO: list[Callable[[], None]] = []
KINDS = ("first", "double")


def counts() -> dict[str, list[int]]:
    """A copy of every target's [applies, backwards] so far in this process."""
    return {name: list(pair) for name, pair in _COUNTS.items()}


def scaled(gradients: Any, scale: float, kind: str = "first") -> Any:
    """backward's return value with every tensor in it times `scale` (None and others kept);
    kind "double": the values kept, their derivative (the graph of create_graph) scaled."""
    import torch

    def wrong(g: Any) -> Any:
        if not isinstance(g, torch.Tensor):
            return g
        return g * scale if kind == "first" else g.detach() + (g - g.detach()) * scale

    if isinstance(gradients, tuple):
        return tuple(wrong(g) for g in gradients)
    return wrong(gradients)


def _swap(cls: type, attribute: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
          ) -> Callable[[], None]:
    """cls.attribute replaced by make(the original's function), kept as the same kind of method
    (static, class or plain); returns what puts the original back."""
    found = inspect.getattr_static(cls, attribute)
    if isinstance(found, (staticmethod, classmethod)):
        replacement = type(found)(make(found.__func__))
    else:
        replacement = make(found)
    own = attribute in vars(cls)
    setattr(cls, attribute, replacement)

    def undo() -> None:
        if own:
            setattr(cls, attribute, found)
        else:
            delattr(cls, attribute)
    return undo


def plant(cls: type, scale: float, name: str | None = None, kind: str = "first",
          ) -> Callable[[], None]:
    """The bug in cls.backward, the counters on cls.apply and cls.backward; returns the undo."""
    if kind not in KINDS:
        raise ValueError(f"seed kind {kind!r}: one of {', '.join(KINDS)}")
    name = name or f"{cls.__module__}:{cls.__qualname__}"
    tally = _COUNTS.setdefault(name, [0, 0])
    if not isinstance(inspect.getattr_static(cls, "backward"), (staticmethod, classmethod)):
        raise TypeError(f"{name}.backward is neither a staticmethod nor a classmethod: "
                        "name a torch.autograd.Function subclass that defines backward")

    def wrong_backward(original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(*args: Any) -> Any:
            tally[1] += 1
            return scaled(original(*args), scale, kind)
        return backward

    def counted_apply(original: Callable[..., Any]) -> Callable[..., Any]:
        def apply(*args: Any, **kwargs: Any) -> Any:
            tally[0] += 1
            return original(*args, **kwargs)
        return apply

    undo_backward = _swap(cls, "backward", wrong_backward)
    undo_apply = _swap(cls, "apply", counted_apply)

    def undo() -> None:
        undo_apply()
        undo_backward()
    return undo


def resolve(target: str) -> type:
    """`module:Class` (the class may be dotted: `module:Outer.Inner`) imported."""
    module_name, sep, qualname = target.partition(":")
    if not sep or not qualname:
        raise ValueError(f"seed target {target!r}: write it as module:Class, "
                         "e.g. entmax.losses:_GenericLossFunction")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def pytest_configure(config: Any) -> None:
    targets = [t for t in os.environ.get("GRADTOOL_DROPIN_SEED", "").split(",") if t]
    scale = float(os.environ.get("GRADTOOL_DROPIN_SEED_SCALE", "1.01"))
    kind = os.environ.get("GRADTOOL_DROPIN_SEED_KIND", "first")
    for target in targets:
        _UNDO.append(plant(resolve(target), scale, target, kind))


def pytest_unconfigure(config: Any) -> None:
    while _UNDO:
        _UNDO.pop()()
