"""Declared surrogate gradients: the intended backward of a deliberate non-gradient (STE, GRL)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError, did_you_mean
from ..tracebacks import interprets_user_code
from .values import resolve_reference

SURROGATE_KINDS = ("identity", "scale", "clipped_identity", "oracle")
_KEYS = {
    "identity": ("kind", "inputs"),
    "scale": ("kind", "factor", "inputs"),
    "clipped_identity": ("kind", "range", "inputs"),
    "oracle": ("kind", "oracle"),
}

ORACLE_CONVENTION = """\
An oracle is called as oracle(*inputs, *grad_outputs): the forward arguments in order (tensors and
literals, exactly as forward got them), then one grad_output per forward output. It returns the
intended gradient of every forward argument: a tuple with one entry per argument (None for
non-tensor or non-differentiable ones), or a single tensor when forward takes one argument."""


class Surrogate:
    """The intended gradient of a Function whose backward is deliberately not its derivative."""

    kind: str = ""

    def describe(self) -> str:
        raise NotImplementedError

    def vjp(self, inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        """The intended gradient of every forward argument (None = no gradient, i.e. zero)."""
        raise NotImplementedError


@dataclass(frozen=True)
class _PassThrough(Surrogate):
    """Shared logic: grad_output 0, transformed, flows to the selected tensor inputs."""

    inputs: tuple[int, ...] = ()  # positions; empty means "the first floating-point tensor"
    labels: tuple[str, ...] = field(default=(), compare=False)  # the spec's names, for describe()

    @interprets_user_code
    def vjp(self, inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        if not grad_outputs:
            raise ValueError(f"{self.describe()}: no grad_output given")
        selected = self._selected(inputs)
        grad = grad_outputs[0]
        return [self._grad(inputs[i], grad) if i in selected else None for i in range(len(inputs))]

    def _selected(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        if self.inputs:
            bad = [i for i in self.inputs if i >= len(inputs) or not _is_float_tensor(inputs[i])]
            if bad:
                raise ValueError(f"{self.describe()}: argument {bad[0]} is not a floating-point "
                                 f"tensor (forward got {len(inputs)} arguments)")
            return self.inputs
        first = next((i for i, x in enumerate(inputs) if _is_float_tensor(x)), None)
        if first is None:
            raise ValueError(f"{self.describe()}: forward got no floating-point tensor argument")
        return (first,)

    def _grad(self, x: Any, grad: Any) -> Any:
        grad = self._transform(x, grad)
        # Broadcasting in forward sums the gradient back to the input's shape, as autograd does.
        return grad.sum_to_size(x.shape) if tuple(grad.shape) != tuple(x.shape) else grad

    def _transform(self, x: Any, grad: Any) -> Any:
        return grad

    def _on(self) -> str:
        if not self.inputs:
            return ""
        return f" for {', '.join(self.labels or (f'argument {i}' for i in self.inputs))}"


@dataclass(frozen=True)
class IdentitySurrogate(_PassThrough):
    """Straight-through: grad_input = grad_output."""

    kind: str = "identity"

    def describe(self) -> str:
        return f"straight-through identity{self._on()}"


@dataclass(frozen=True)
class ScaleSurrogate(_PassThrough):
    """grad_input = factor * grad_output (gradient reversal: factor = -lambda)."""

    factor: float = 1.0
    kind: str = "scale"

    def describe(self) -> str:
        note = " (gradient reversal)" if self.factor < 0 else ""
        return f"scale {self.factor:g}{note}{self._on()}"

    def _transform(self, x: Any, grad: Any) -> Any:
        return grad * self.factor


@dataclass(frozen=True)
class ClippedIdentitySurrogate(_PassThrough):
    """grad_output where lo <= x <= hi, else 0 (the clipped straight-through estimator)."""

    lo: float = -1.0
    hi: float = 1.0
    kind: str = "clipped_identity"

    def describe(self) -> str:
        return f"clipped identity on [{self.lo:g}, {self.hi:g}]{self._on()}"

    def _transform(self, x: Any, grad: Any) -> Any:
        import torch

        inside = (x >= self.lo) & (x <= self.hi)
        # where, not multiply: a NaN/inf grad outside the range must still become 0.
        return torch.where(inside, grad, torch.zeros_like(grad))


@dataclass(frozen=True)
class OracleSurrogate(Surrogate):
    """A user callable returning the intended gradients; see ORACLE_CONVENTION."""

    reference: str = ""           # as resolved: "/abs/path/file.py:name" or "module:name"
    kind: str = "oracle"

    def describe(self) -> str:
        return f"oracle {_display(self.reference)}"

    @interprets_user_code
    def vjp(self, inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any]:
        result = load_callable(self.reference)(*inputs, *grad_outputs)
        if _is_tensor(result) or result is None:
            result = (result,)
        if not isinstance(result, (tuple, list)) or len(result) != len(inputs):
            got = len(result) if isinstance(result, (tuple, list)) else type(result).__name__
            raise TypeError(f"{self.describe()} returned {got}; expected one gradient per forward "
                            f"argument ({len(inputs)}), None for non-tensors")
        return list(result)


def make_surrogate(data: dict[str, Any] | str, *, base_dir: Path,
                   input_names: Sequence[str | None] | None = None) -> Surrogate:
    """A Surrogate from a spec's `surrogate:` value; SpecError(key='surrogate.FIELD') if bad."""
    if isinstance(data, str):
        data = {"kind": data}
    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping with kind: ({', '.join(SURROGATE_KINDS)}), "
                        f"got {data!r}", key="surrogate")
    kind = data.get("kind")
    if kind not in SURROGATE_KINDS:
        raise SpecError(f"expected one of {', '.join(SURROGATE_KINDS)}, got {kind!r}",
                        key="surrogate.kind", hint=did_you_mean(str(kind), SURROGATE_KINDS))
    for key in data:
        if key not in _KEYS[kind]:
            raise SpecError(f"unknown key for a {kind} surrogate; allowed: "
                            f"{', '.join(_KEYS[kind])}", key=f"surrogate.{key}",
                            hint=did_you_mean(str(key), _KEYS[kind]))
    if kind == "oracle":
        return OracleSurrogate(reference=_oracle_reference(data.get("oracle"), base_dir))
    positions = _positions(data.get("inputs"), input_names)
    labels = tuple(_label(p, input_names) for p in positions)
    if kind == "identity":
        return IdentitySurrogate(inputs=positions, labels=labels)
    if kind == "scale":
        return ScaleSurrogate(inputs=positions, labels=labels, factor=_number(data, "factor"))
    lo, hi = _range(data.get("range"))
    return ClippedIdentitySurrogate(inputs=positions, labels=labels, lo=lo, hi=hi)


def _label(position: int, names: Sequence[str | None] | None) -> str:
    name = names[position] if names and position < len(names) else None
    return repr(name) if name else f"argument {position}"


def _number(data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")):
        raise SpecError(f"expected a finite number, got {value!r}", key=f"surrogate.{key}")
    return float(value)


def _range(value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise SpecError(f"expected [lo, hi], got {value!r}", key="surrogate.range")
    lo, hi = (_number({"range": v}, "range") for v in value)
    if not lo < hi:
        raise SpecError(f"expected lo < hi, got {value!r}", key="surrogate.range")
    return lo, hi


def _positions(value: Any, names: Sequence[str | None] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    positions = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            positions.append(item)
        elif isinstance(item, str) and names and item in names:
            positions.append(list(names).index(item))
        else:
            known = [n for n in names or () if n]
            allowed = f"input names ({', '.join(known)}) or" if known else ""
            raise SpecError(f"expected {allowed} argument positions 0, 1, ..., got {item!r}",
                            key="surrogate.inputs", hint=did_you_mean(str(item), known))
    return tuple(positions)


def _oracle_reference(value: Any, base_dir: Path) -> str:
    if value is None:
        raise SpecError("an oracle surrogate needs oracle: 'file.py:name' or 'module:name'",
                        key="surrogate.oracle", hint=ORACLE_CONVENTION.splitlines()[0])
    try:
        return resolve_reference(value, base_dir)
    except SpecError as exc:
        raise SpecError(exc.message, key="surrogate.oracle", hint=exc.hint) from None


def load_callable(reference: str) -> Any:
    """Import a resolved 'file.py:name' / 'module:name' reference and return the named object."""
    left, _, name = reference.rpartition(":")
    if left.endswith(".py"):
        module = _import_file(Path(left))
    else:
        module = importlib.import_module(left)
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{_display(reference)} is not callable")
    return obj


def _import_file(path: Path) -> Any:
    # A name of its own per file, so an oracle file never shadows an installed module.
    module_name = f"_gradtool_oracle_{abs(hash(str(path))):x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _display(reference: str) -> str:
    left, _, name = reference.rpartition(":")
    if left.endswith(".py"):
        try:
            left = str(Path(left).relative_to(Path.cwd()))
        except ValueError:
            pass
    return f"{left}:{name}"


def _is_tensor(value: Any) -> bool:
    import torch  # vjp runs inside a check, where torch is loaded already

    return isinstance(value, torch.Tensor)


def _is_float_tensor(value: Any) -> bool:
    return _is_tensor(value) and (value.is_floating_point() or value.is_complex())
