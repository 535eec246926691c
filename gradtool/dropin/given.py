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
ones (several elements in one place) are perturbed as compact copies, as before. An argument
given as an nn.Parameter reaches the function as one (gradtool's leaf, its class swapped for the
call): an nn.Module built inside from it registers it, as it registers torch's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
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
    argument (its storage's other elements as given); where one is an nn.Parameter, func
    receives gradtool's value (a leaf) as an nn.Parameter too."""
    templates = {k: a.detach() for k, a in enumerate(args)
                 if isinstance(a, torch.Tensor) and not compact(a) and separate(a)}
    params = {k for k, a in enumerate(args) if isinstance(a, torch.nn.Parameter)}
    if not templates and not params:
        return func

    @functools.wraps(func)
    @calls_user_code  # what func raises is the user's (a _like of gradtool's raises below it)
    def on_given_layout(*values: Any) -> Any:
        values = tuple(_like(v, templates[k]) if k in templates and isinstance(v, torch.Tensor)
                       else v for k, v in enumerate(values))
        with _as_parameters([v for k, v in enumerate(values) if k in params]):
            return func(*values)

    on_given_layout.gradtool_no_vmap = True  # as_strided of a batched value: plain calls
    on_given_layout.gradtool_parameters = frozenset(params)  # lean.py's gate reads it
    return on_given_layout


@contextlib.contextmanager
def _as_parameters(values: list[Any]) -> Iterator[None]:
    """Within: each plain leaf tensor among values is an nn.Parameter, as the argument given
    was. Code that tells parameters apart (an nn.Module registers an attribute set to one, a
    library differentiates a module's parameters() only) then sees what torch's gradcheck shows
    it; the leaf is gradtool's own, its class given back after the call (nn.Parameter(leaf)
    would be another leaf, the gradient lost)."""
    swapped = [v for v in values if type(v) is torch.Tensor and v.is_leaf]
    for v in swapped:
        v.__class__ = torch.nn.Parameter
    try:
        yield
    finally:
        for v in swapped:
            v.__class__ = torch.Tensor


def _like(value: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """value, in a copy of template's storage viewed as template is (a graph to value kept)."""
    if value.shape != template.shape or value.dtype != template.dtype:
        return value  # not the argument's value (a batch, another dtype): passed as it is
    size, stride, offset = template.size(), template.stride(), template.storage_offset()
    whole = template.untyped_storage().nbytes() // template.element_size()
    storage = template.as_strided((whole,), (1,), 0).clone()
    return torch.as_strided_scatter(storage, value, size, stride, offset) \
        .as_strided(size, stride, offset)


def on_torch_terms(func: Callable[..., Any], args: tuple[Any, ...],
                   out: Any) -> Callable[..., Any]:
    """func, or where it computes otherwise without a graph, func called as torch's gradcheck
    calls it in every evaluation: grad mode on, each value requiring grad where the argument
    given does. gradtool evaluates its finite differences without a graph on values that do not
    require grad; code that reads either (a library that differentiates only the arguments
    requiring grad, a Hessian built inside the function) would then compute something else.
    Known from one forward without a graph on copies: it raises, or its outputs differ from
    the drop-in's forward's (a random function's do too: judged on torch's terms, slower)."""
    from ..numerics.handed import Handed, served
    from ..numerics.problem import tensor_outputs

    diff = Handed.of_call(func, args).diff
    again = served(func, diff, [args[k].detach() for k in diff])  # the lean path's, if it ran
    if again is None:
        again = _without_graph(func, args)
    given = tensor_outputs(out)
    if again is not None and len(again) == len(given) and all(
            a.shape == g.shape and a.dtype == g.dtype and torch.equal(a, g.detach())
            for a, g in zip(again, given)):
        return func
    wants = {k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad}

    @functools.wraps(func)
    @calls_user_code
    def as_torch_calls_it(*values: Any) -> Any:
        with torch.enable_grad():
            return func(*[_requiring(v) if k in wants else v for k, v in enumerate(values)])

    as_torch_calls_it.gradtool_no_vmap = True  # a batched value cannot require grad alone
    return as_torch_calls_it


def _without_graph(func: Callable[..., Any], args: tuple[Any, ...]) -> list[Any] | None:
    """func's tensor outputs without a graph on copies, torch's RNG left as it was; None where
    it raises."""
    from ..numerics.problem import tensor_outputs

    copies = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            return tensor_outputs(func(*copies))
    except Exception:  # noqa: BLE001 - it runs on torch's terms: what it raises there is shown
        return None
    finally:
        torch.random.set_rng_state(state)


def _requiring(v: Any) -> Any:
    """v requiring grad (a new tensor on v's storage where it did not: gradtool's value kept)."""
    if isinstance(v, torch.Tensor) and not v.requires_grad and (
            v.is_floating_point() or v.is_complex()):
        return v.detach().requires_grad_(True)
    return v
