"""Given values (gradcheck's convention) and structure: nested and keyword arguments."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .inputs import Keyword, LiteralSpec, TensorSpec
from .subclass import is_python_subclass, plain

__all__ = ["Keyword", "Nested", "ValueSpec", "given_specs", "leaves", "rebuild", "structured"]

CONTAINERS = (tuple, list, dict)


@dataclass(frozen=True, eq=False)
class ValueSpec:
    """A value the user gave (a tensor or anything else), used as is: never sampled."""

    value: Any
    requires_grad: bool = False
    name: str | None = None

    def describe(self, default_dtype: str = "float64") -> str:
        import torch

        v = self.value
        if not isinstance(v, torch.Tensor):
            text = repr(v)  # a module's repr spans lines: its type on the one inputs line
            return text if "\n" not in text else f"{type(v).__qualname__}(...)"
        shape = "x".join(map(str, v.shape)) if v.dim() else "()"
        if v.dim() == 1:
            shape = f"({v.shape[0]},)"
        text = f"given {shape}:{str(v.dtype).removeprefix('torch.')}"
        if v.layout != torch.strided:
            text += f":{str(v.layout).removeprefix('torch.')}"
        if v.device.type != "cpu":
            text += f":{v.device}"
        return text + ("" if self.requires_grad else ":nograd") + f" #{content_hash(v)}"

    def differentiable(self, default_dtype: str = "float64") -> bool:
        return self.requires_grad


@dataclass(frozen=True)
class Nested:
    """A named positional argument that is a tuple, list or dict of specs (from a spec file)."""

    name: str
    spec: Any


def unwrap(spec: Any) -> Any:
    """The structure under a Keyword or Nested wrapper (anything else as is)."""
    return spec.spec if isinstance(spec, (Keyword, Nested)) else spec


def subclass_values(tensor: Any) -> Any:
    """A subclass's values as a plain tensor of its dtype, shape and device (the subclass's own
    ops read them: its detach where that is plain, else element by element), never written."""
    import torch

    flat = tensor.detach()
    if not is_python_subclass(flat):
        return flat.clone()
    flat = flat.reshape(-1)
    values = [flat[k].item() for k in range(flat.numel())]
    return torch.tensor(values, dtype=tensor.dtype, device=tensor.device).reshape(tensor.shape)


def content_hash(tensor: Any) -> str:
    """A short hash of a tensor's values (8 hex digits), to tell two given inputs apart."""
    import torch

    flat = (subclass_values(tensor) if is_python_subclass(tensor) else plain(tensor)).to("cpu")
    if flat.layout != torch.strided:  # sparse: the values it stands for
        flat = flat.to_dense()
    # A fresh dense copy: .contiguous() keeps a view whose size-1 dimension has any stride
    # (stride 4 for q[:, 0] of a batch of one), which view(uint8) refuses; conj/neg bits resolved.
    flat = flat.resolve_conj().resolve_neg().reshape(-1).clone(
        memory_format=torch.contiguous_format)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:8]


def is_structured(specs: list[Any]) -> bool:
    """Whether any argument is a keyword or a container (else the binding stays flat)."""
    return any(isinstance(s, (Keyword, Nested, *CONTAINERS)) for s in specs)


def leaves(spec: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf spec) in order: 'state[0]', "cfg['w']"; a leaf yields ('', spec)."""
    if isinstance(spec, dict):
        for key, item in spec.items():
            yield from leaves(item, f"{path}[{key!r}]")
    elif isinstance(spec, (tuple, list)):
        for k, item in enumerate(spec):
            yield from leaves(item, f"{path}[{k}]")
    else:
        yield path, spec


def rebuild(spec: Any, values: Iterator[Any]) -> Any:
    """The structure of `spec` with its leaves taken from `values`, in leaves() order."""
    if isinstance(spec, dict):
        return {key: rebuild(item, values) for key, item in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(rebuild(item, values) for item in spec)
    return next(values)


def structured(inner: Callable[..., Any], positional: list[Any], keywords: list[Keyword],
               n_leaves: int) -> Callable[..., Any]:
    """fn(*leaves, *extra) -> inner(*args, *extra, **kwargs): the engine stays flat."""
    def call(*flat: Any) -> Any:
        values = iter(flat[:n_leaves])
        args = [rebuild(unwrap(s), values) for s in positional]
        kwargs = {k.name: rebuild(k.spec, values) for k in keywords}
        return inner(*args, *flat[n_leaves:], **kwargs)

    return call


def given_specs(args: Any, kwargs: dict[str, Any] | None = None,
                parse: Callable[[str], Any] | None = None) -> list[Any]:
    """User values -> specs, choosing the checked tensors as gradcheck does.

    If any given tensor requires grad, exactly those are checked; if none does, every floating
    (or complex) tensor is. Strings are --input strings when `parse` is given and no tensor is:
    beside a real tensor a string is a value (a padding mode, a solver name), passed as is;
    an input sampled beside real tensors is explicit (an InputSpec: gradtool.sample('3x4'))."""
    import torch

    from ..numerics.sparse import is_sparse

    given = [v for v in _values(args, kwargs) if isinstance(v, torch.Tensor)]
    for tensor in given:
        if tensor.layout != torch.strided and not is_sparse(tensor):
            raise InputError(f"a given tensor has layout {tensor.layout}: gradtool checks "
                             "strided and sparse tensors", "pass tensor.to_dense()")
    any_grad = any(t.requires_grad for t in given)
    parse = None if given else parse

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            grad = value.requires_grad if any_grad else \
                (value.is_floating_point() or value.is_complex())
            return ValueSpec(value, grad)
        if isinstance(value, str) and parse is not None:
            return parse(value)
        if parse is None and isinstance(value, (dict, tuple, list)) and not any(
                isinstance(v, torch.Tensor) or _is_spec(v) for _, v in leaves([value])):
            # an options dict, a tuple of sizes: one argument passed as is, as forward takes
            # it (flattened, its items read as arguments of their own: a backward returning
            # one gradient per argument was counted short)
            return ValueSpec(value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (tuple, list)):
            return type(value)(convert(v) for v in value)
        return value if _is_spec(value) else ValueSpec(value)

    specs = [convert(v) for v in args]
    return specs + [Keyword(k, convert(v)) for k, v in (kwargs or {}).items()]


def _values(args: Any, kwargs: dict[str, Any] | None) -> Iterator[Any]:
    for _, leaf in leaves(list(args) + list((kwargs or {}).values())):
        yield leaf


def _is_spec(value: Any) -> bool:
    return isinstance(value, (TensorSpec, LiteralSpec, ValueSpec, Keyword, Nested))


def plain_values(specs: list[Any], leaves_values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) rebuilt from flat leaf values, e.g. to save them with torch.save."""
    values = iter(leaves_values)
    args = [rebuild(unwrap(s), values) for s in specs if not isinstance(s, Keyword)]
    kwargs = {s.name: rebuild(s.spec, values) for s in specs if isinstance(s, Keyword)}
    return args, kwargs
