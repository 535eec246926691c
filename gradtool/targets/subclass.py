"""Tensor subclasses that store their own values (pypose's LieTensor, a tagged tensor): gradtool
perturbs, clones and casts their plain values, and forward sees their class.

Such a subclass's own operators may mean something else than a tensor's (a LieTensor's `+` and
`add_` are a group retraction, its `clone` a `__torch_function__` wrap): gradtool's arithmetic
on one would move the point along the group, or raise. So gradtool holds `plain(t)`, perturbs
that as torch's gradcheck perturbs a tensor's storage, and hands forward `retyped(value, t)`:
the value as t's class with t's attributes (a LieTensor's `ltype`), still on the graph, so
forward calls the methods it calls in training. A wrapper subclass (its own
`__torch_dispatch__`, no storage) is values.py's `subclass_values` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def is_python_subclass(tensor: Any) -> bool:
    """A tensor subclass with its own __torch_dispatch__ (a wrapper: quantised, logging...):
    no storage of its own, so no .numpy(), .tolist() or deep copy the usual way."""
    import torch

    return isinstance(tensor, torch.Tensor) and torch._C._dispatch_keys(tensor).has(
        torch._C.DispatchKey.Python)


def keeps_class(tensor: Any) -> bool:
    """Whether tensor is of a Python subclass forward must see again: storage-backed, neither a
    plain tensor nor a plain nn.Parameter (forward reads those as plain tensors anyway)."""
    import torch

    return (isinstance(tensor, torch.Tensor)
            and type(tensor) not in (torch.Tensor, torch.nn.Parameter)
            and not is_python_subclass(tensor))


def plain(tensor: Any) -> Any:
    """tensor's values as a detached plain torch.Tensor sharing its storage (the subclass's
    own ops never run: its __torch_function__ is off for the conversion); any other tensor
    (a wrapper subclass too, which has no storage to share) detached as it is."""
    import torch

    if not keeps_class(tensor):
        return tensor.detach()
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(tensor.detach(), torch.Tensor)


def retyped(value: Any, like: Any) -> Any:
    """value (a plain tensor, on a graph or not) as like's class with like's instance
    attributes, still attached to value's graph; value itself where like keeps no class."""
    import torch

    if not keeps_class(like) or not isinstance(value, torch.Tensor) or type(value) is type(like):
        return value
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.Tensor.as_subclass(value, type(like))
    out.__dict__.update(getattr(like, "__dict__", {}))
    return out


def clone_keeping(tensor: Any) -> Any:
    """A detached clone of tensor of its class (its values cloned as a plain tensor's)."""
    if not keeps_class(tensor):
        return tensor.detach().clone()
    return retyped(plain(tensor).clone(), tensor)


def retyping(fn: Callable[..., Any], templates: Mapping[int, Any]) -> Callable[..., Any]:
    """fn taking plain values at templates' positions, called with each as its template's
    class (templates: flat position -> the tensor the user gave)."""
    if not templates:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*[retyped(a, templates[k]) if k in templates else a
                    for k, a in enumerate(args)], **kwargs)

    return call
