"""The device rule, checked without a GPU: every tensor factory gradtool calls names its device.

Two readings of one rule. `violations` reads the source (every path, taken or not);
`FactoryGuard` watches a run (a TorchFunctionMode works on the CPU) and records each factory
call made from gradtool's own frames without device=, which a source reading misses when the
call is spelled another way (an alias, getattr). On a CPU-only machine a tensor made on the
CPU for a CUDA target is invisible; the rule makes every such tensor a conscious choice.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import torch

import gradtool
from torch.overrides import TorchFunctionMode

PACKAGE = Path(gradtool.__file__).resolve().parent  # the gradtool that runs
# torch functions that make a tensor from nothing (or from Python/numpy data): without device=
# they make it on the CPU, wrong for a CUDA target. *_like and Tensor.new_* inherit a device.
FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
    "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided",
    "tril_indices", "triu_indices", "sparse_coo_tensor", "sparse_csr_tensor",
    "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor", "sparse_compressed_tensor",
})
# torch.from_numpy takes no device and escapes a TorchFunctionMode: as_tensor(..., device=).
BANNED = frozenset({"from_numpy"})


def violations(source: str, filename: str = "<source>") -> list[str]:
    """'file:line torch.name(...)' for each factory call without device= (and each banned call)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            continue
        name = node.func.attr
        keywords = {k.arg for k in node.keywords}
        if name in BANNED or (name in FACTORIES and "device" not in keywords
                              and None not in keywords):  # **kwargs may carry it
            found.append(f"{filename}:{node.lineno} torch.{name}(...)")
    return found


def package_violations() -> list[str]:
    return [v for path in sorted(PACKAGE.rglob("*.py"))
            for v in violations(path.read_text(), str(path.relative_to(PACKAGE.parent)))]


_FACTORY_FUNCTIONS = {getattr(torch, name) for name in FACTORIES}
_TORCH = str(Path(torch.__file__).resolve().parent)


class FactoryGuard(TorchFunctionMode):
    """Records 'file:line torch.name' for each factory called from gradtool without device=."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORY_FUNCTIONS and "device" not in kwargs and not _from_tensor(func, args):
            caller = _caller()
            if caller is not None:
                self.found.append(f"{caller} torch.{func.__name__}")
        return func(*args, **kwargs)


def _from_tensor(func, args) -> bool:
    """as_tensor/tensor of a tensor keeps its device: not a factory call."""
    return func in (torch.as_tensor, torch.tensor) and bool(args) and \
        isinstance(args[0], torch.Tensor)


def _caller() -> str | None:
    """'gradtool/x.py:line' when the innermost frame outside torch and this file is gradtool's."""
    frame = sys._getframe(2)
    while frame is not None:
        path = str(Path(frame.f_code.co_filename).resolve())
        if not path.startswith(_TORCH) and path != __file__:
            if path.startswith(str(PACKAGE)):
                return f"{Path(path).relative_to(PACKAGE.parent)}:{frame.f_lineno}"
            return None
        frame = frame.f_back
    return None
