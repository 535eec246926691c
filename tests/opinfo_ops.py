"""PyTorch's OpInfo database as gradtool cases: each op's first sample, its declared verdicts."""

# Shared by tests/test_conformance.py and benchmarks/conformance.py. The one place that turns
# PyTorch's own values into a gradtool run is check_at_values (switch it to the public
# "user values" API once it exists).

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

DTYPE = torch.float64
GRAD_TEST = ("TestBwdGradients", "test_fn_grad")
GRADGRAD_TEST = ("TestBwdGradients", "test_fn_gradgrad")
FAIL_GRADGRAD_TEST = ("TestBwdGradients", "test_fn_fail_gradgrad")


def unavailable() -> str | None:
    """Why PyTorch's test database cannot be imported here (None: it can)."""
    try:
        import torch.testing._internal.common_methods_invocations  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means: skip, saying why
        return (f"torch.testing._internal cannot be imported ({type(exc).__name__}: {exc}); "
                "install expecttest (pip install -e '.[test]')")
    return None


def full_name(op: Any) -> str:
    """name.variant, as OpInfo.full_name says (torch 2.4's OpInfo lacks the attribute)."""
    return getattr(op, "full_name", None) or \
        (f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name)


@functools.cache
def autograd_ops() -> dict[str, Any]:
    """Every OpInfo with backward support in float64 on CPU, by its full name."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {full_name(op): op for op in op_db
            if op.supports_autograd and op.supports_dtype(DTYPE, "cpu")
            and DTYPE in op.supported_backward_dtypes("cpu")}


@dataclass(frozen=True)
class Declared:
    """What PyTorch's own gradient tests declare for one op at float64 on CPU."""

    gradient: str          # "run" (must pass), "skip" or "xfail" (any verdict is recorded)
    double_backward: str   # as gradient, or "unsupported" (supports_gradgrad=False)
    why: str = ""          # the declaring decorators, for the record


def declared(op: Any) -> Declared:
    """The verdicts PyTorch declares: its skips and expected failures on the gradient tests."""
    gradient, why_g = _status(op, GRAD_TEST)
    if op.supports_gradgrad:
        double, why_d = _status(op, GRADGRAD_TEST)
    else:
        double, why_d = _status(op, FAIL_GRADGRAD_TEST)
        double = "unsupported" if double == "run" else double
    return Declared(gradient, double, "; ".join(w for w in (why_g, why_d) if w))


def _status(op: Any, test: tuple[str, str], dtype: torch.dtype = DTYPE) -> tuple[str, str]:
    """'skip', 'xfail' or 'run' for one of PyTorch's tests, read off its active decorators."""
    for decorator in op.get_decorators(*test[:1], test[1], "cpu", dtype, {}):
        marked = _apply(decorator)
        if getattr(marked, "__unittest_skip__", False):
            return "skip", f"{test[1]}: skipped ({marked.__unittest_skip_why__})"
        if getattr(marked, "__unittest_expecting_failure__", False):
            return "xfail", f"{test[1]}: expected failure"
    return "run", ""


def _apply(decorator: Any) -> Any:
    """The decorator applied to a stand-in test: unittest's skip/xfail leave their marks on it."""
    def stand_in(self: Any) -> None:  # pragma: no cover - never called
        pass
    try:
        return decorator(stand_in)
    except Exception:  # noqa: BLE001 - a decorator that needs a real test is neither
        return stand_in


def samples(op: Any, seed: int = 0, rounded: torch.dtype | None = None
            ) -> list[tuple[str, Callable[..., Any], list[torch.Tensor]]]:
    """[(label, fn, values)]: the op's first sample; when that one has an empty differentiable
    tensor (PyTorch samples empty shapes on purpose), also its first sample without one.
    rounded: the values rounded to that dtype, and the sample's other floating tensors too,
    passed in the dtype of fn's first argument (fn runs in the low dtype on low-dtype values,
    in float64 on the same numbers in float64: the low-precision check's reference)."""
    torch.manual_seed(seed)
    found = []
    for k, sample in enumerate(op.sample_inputs("cpu", DTYPE, requires_grad=True)):
        fn, values = _as_gradcheck_sees_it(op, sample, rounded)
        empty = is_empty(fn, values)
        if not found or not empty:
            found.append((f"sample {k}", fn, values))
        if not empty:
            break
    return found


def is_empty(fn: Callable[..., Any], values: Sequence[torch.Tensor]) -> bool:
    """An empty differentiable input, or no output element at all: nothing to compare."""
    from gradtool.numerics.problem import tensor_outputs

    if any(v.numel() == 0 for v in values):
        return True
    with torch.no_grad():
        return not any(o.numel() for o in tensor_outputs(fn(*values)))


def _as_gradcheck_sees_it(op: Any, sample: Any, rounded: torch.dtype | None = None,
                          variant: Callable[..., Any] | None = None
                          ) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """(fn, values): fn of the sample's tensors that require grad, as PyTorch's gradcheck sees it.

    The recomposition mirrors torch's TestGradients._check_helper: tensors that require grad
    (in the input, a tensor list, the args or the kwargs) become fn's arguments; the rest stay
    fixed; the op runs through its gradcheck_wrapper and output_process_fn_grad.
    """
    parts = [sample.input, *sample.args, *sample.kwargs.values()]
    flat = [t for p in parts for t in (p if _tensor_list(p) else [p])]
    values = [x for x in flat if isinstance(x, torch.Tensor) and x.requires_grad]
    variant = variant or op.get_op()  # or another variant of the op (an in-place one)

    def fn(*inputs: torch.Tensor) -> Any:
        feed = iter(inputs)

        def fixed(value: Any) -> Any:
            if rounded is None or not isinstance(value, torch.Tensor) or \
                    not value.is_floating_point() or not inputs:
                return value
            return value.to(rounded).to(inputs[0].dtype)

        def put(value: Any) -> Any:
            if _tensor_list(value):
                return [next(feed) if v.requires_grad else fixed(v) for v in value]
            if isinstance(value, torch.Tensor) and value.requires_grad:
                return next(feed)
            return fixed(value)

        first = put(sample.input)
        args = [put(a) for a in sample.args]
        kwargs = {k: put(v) for k, v in sample.kwargs.items()}
        out = op.gradcheck_wrapper(variant, first, *args, **kwargs)
        return sample.output_process_fn_grad(out) if sample.output_process_fn_grad else out

    fn.__qualname__ = fn.__name__ = full_name(op).replace(".", "_")
    return fn, [v.detach() if rounded is None else v.detach().to(rounded) for v in values]


def _tensor_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, torch.Tensor) for v in value)


def check_at_values(fn: Callable[..., Any], values: Sequence[torch.Tensor], name: str,
                    **settings: Any) -> Any:
    """gradtool's default checks on fn at exactly these values, through the public API."""
    import gradtool

    fn.__qualname__ = name  # the report names the op
    return gradtool.check(fn, [v.detach().requires_grad_(True) for v in values], **settings)


def is_sparse(values: Sequence[torch.Tensor]) -> bool:
    """A sample with a sparse tensor (checked under gradcheck's masked semantics)."""
    return any(v.layout != torch.strided for v in values)
