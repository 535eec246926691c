"""The drop-in's function run on tensors laid out as the ones given.

torch's gradcheck calls the function on the very tensors it is given (it perturbs their
`.data` in place); gradtool evaluates it on copies it owns (a perturbed point, a fresh value per
call), compact ones. An op that addresses the storage itself -- `as_strided` over a partial
view, a kernel reading a view's offset or strides -- then sees another tensor than the user
passed. Where a tensor argument is not compact (an offset, a storage larger than its elements,
strides other than contiguous ones), the function gradtool judges receives each value laid out
as the given tensor: a copy of the given storage with the value written where the given view
sits, differentiably (as_strided_scatter), viewed with the given size, strides and offset.
Compact arguments, the usual case, cost nothing: the function is judged as it is; overlapping
ones (several elements in one place) are perturbed as compact copies, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..tracebacks import calls_user_code


def compact(t: torch.Tensor) -> bool:
    """Whether t alone fills its storage from offset 0, contiguous: a copy gradtool makes
    (clone in contiguous format) reads exactly as t does."""
    if t.layout != torch.strided or t.device.type == "meta":
        return True
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def separate(t: torch.Tensor) -> bool:
    """Whether t's elements sit at distinct places of its storage (its dimensions, by stride,
    each past the extent of the ones below): a copy laid out as t holds independent values. An
    overlapping view's elements share memory (as_strided with a small stride): gradtool keeps
    perturbing compact copies of it, where torch's finite differences move several at once."""
    extent = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.size()) if sz > 1):
        if stride < extent:
            return False
        extent = stride * size
    return True


def laid_out(func: Callable[..., Any], args: tuple[Any, ...]) -> Callable[..., Any]:
    """func, or where an argument is not compact, func called on each value laid out as that
    argument (its storage's other elements as given)."""
    templates = {k: a.detach() for k, a in enumerate(args)
                 if isinstance(a, torch.Tensor) and not compact(a) and separate(a)}
    if not templates:
        return func

    @functools.wraps(func)
    @calls_user_code  # what func raises is the user's (a _like of gradtool's raises below it)
    def on_given_layout(*values: Any) -> Any:
        return func(*[_like(v, templates[k]) if k in templates and isinstance(v, torch.Tensor)
                      else v for k, v in enumerate(values)])

    on_given_layout.gradtool_no_vmap = True  # as_strided of a batched value: plain calls
    return on_given_layout


def _like(value: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """value, in a copy of template's storage viewed as template is (a graph to value kept)."""
    if value.shape != template.shape or value.dtype != template.dtype:
        return value  # not the argument's value (a batch, another dtype): passed as it is
    size, stride, offset = template.size(), template.stride(), template.storage_offset()
    whole = template.untyped_storage().nbytes() // template.element_size()
    storage = template.as_strided((whole,), (1,), 0).clone()
    return torch.as_strided_scatter(storage, value, size, stride, offset) \
        .as_strided(size, stride, offset)
