"""Spec trust: what a spec may run from outside its own folder (an allow-list, not a deny-list)."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import SpecError
from ..targets.load import Target

# Modules whose plain functions are tensor operators (torch.sin, F.gelu, torch.linalg.solve).
OPERATOR_MODULES = frozenset({
    "torch", "torch.functional", "torch.nn.functional", "torch.special", "torch.linalg",
    "torch.fft", "torch._C._VariableFunctions", "torch._C._nn", "torch._C._linalg",
    "torch._C._special", "torch._C._fft",
})
OPT_IN = ("a callable from an installed package runs with your permissions; trust it with "
          "trust_callable: true in the spec AND --trust-callables on the command line")


def check_trusted(target: Target, spec: Any, run_trusts: bool) -> None:
    """Refuse a spec target from outside the spec's folder unless it is a Function subclass, an
    nn.Module or a torch operator, or both the spec and the run opt in to trusting it."""
    reference = spec.target
    if reference.partition(":")[0].endswith(".py"):  # a file in the spec's own folder
        return
    if target.kind.trusted_anywhere or is_torch_operator(target.obj):
        return
    if spec.trust_callable and run_trusts:
        return
    missing = ("--trust-callables was not given" if spec.trust_callable
               else "the spec does not say trust_callable: true")
    raise SpecError(f"{reference!r} is a {_kind(target.obj)} from an installed package, not a "
                    f"torch.autograd.Function, nn.Module or torch operator, and {missing}",
                    path=spec.path, line=spec.line, key="target", hint=OPT_IN)


def is_torch_operator(obj: Any) -> bool:
    """A torch function of tensors (not a class: constructing one may open files)."""
    import torch

    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    return not inspect.isclass(obj) and getattr(obj, "__module__", None) in OPERATOR_MODULES


def _kind(obj: Any) -> str:
    return "class" if inspect.isclass(obj) else "callable"
