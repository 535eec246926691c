"""PyTorch's OpInfo gradient tests through the drop-in: each gradcheck/gradgradcheck call that
TestBwdGradients and TestFwdGradients make, made with torch's function and gradtool's on the
same values, their outcomes compared.

Shared by tests/test_opinfo_dropin.py and benchmarks/conformance.py --dropin. A call is built as
torch/testing/_internal/common_utils.py's TestGradients._check_helper builds it (read there, not
copied): the sample's tensors that require grad as the function's arguments, the rest fixed, the
op through its gradcheck_wrapper and output_process_fn_grad, an in-place variant on a clone of
its first argument; the keywords of its gradcheck wrapper (check_batched_grad, fast_mode) and of
the helper (check_grad_dtypes, nondet_tol, check_forward_ad, check_backward_ad,
check_undefined_grad, check_batched_forward_grad; gradgradcheck with and without non-contiguous
grad_outputs).
"""

from __future__ import annotations

import functools
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from opinfo_ops import _as_gradcheck_sees_it, _status, full_name

DTYPES = {"float64": torch.float64, "complex128": torch.complex128}
# kind: (PyTorch's test class and name, what it calls)
TESTS = {
    "grad": ("TestBwdGradients", "test_fn_grad"),
    "gradgrad": ("TestBwdGradients", "test_fn_gradgrad"),
    "fwgrad": ("TestFwdGradients", "test_forward_mode_AD"),
    "inplace": ("TestBwdGradients", "test_inplace_grad"),
}
GradcheckError = sys.modules["torch.autograd.gradcheck"].GradcheckError


@dataclass(frozen=True)
class Call:
    """One gradcheck or gradgradcheck call of PyTorch's test, ready to make with either tool."""

    label: str
    which: str                    # gradcheck or gradgradcheck
    fn: Callable[..., Any]
    args: tuple[torch.Tensor, ...]
    keywords: dict[str, Any]
    seed: int                     # torch's RNG before each tool's call (grad_outputs drawn alike)


@functools.cache
def ops(dtype: str) -> dict[str, Any]:
    """Every OpInfo with backward support at dtype on CPU, by its full name."""
    from torch.testing._internal.common_methods_invocations import op_db

    d = DTYPES[dtype]
    return {full_name(op): op for op in op_db
            if op.supports_autograd and op.supports_dtype(d, "cpu")
            and d in op.supported_backward_dtypes("cpu")}


def runs(op: Any, dtype: str, kind: str) -> str | None:
    """Why PyTorch's test of this kind does not run the op at dtype (None: it runs, or xfails)."""
    if kind == "gradgrad" and not op.supports_gradgrad:
        return "supports_gradgrad=False"
    if kind == "fwgrad" and not op.supports_forward_ad:
        return "supports_forward_ad=False"
    if kind == "inplace" and (op.inplace_variant is None or not op.supports_inplace_autograd):
        return "no in-place variant with autograd"
    status, why = _status(op, TESTS[kind], DTYPES[dtype])
    return why if status == "skip" else None


def expected_failure(op: Any, dtype: str, kind: str) -> bool:
    """Whether PyTorch marks its test of this kind an expected failure at dtype."""
    return _status(op, TESTS[kind], DTYPES[dtype])[0] == "xfail"


def calls(op: Any, dtype: str, kind: str, fast: bool, limit: int | None = None,
          elements: int | None = None) -> Iterator[Call]:
    """The calls PyTorch's test of this kind makes (its first `limit` samples' where given,
    those of at most `elements` input elements where given: slow mode's cost is their square)."""
    variant = op.get_op()
    if kind == "inplace":
        inplace = op.get_inplace()
        variant = functools.wraps(inplace)(lambda t, *a, **k: inplace(t.clone(), *a, **k))
    fast_mode = fast if op.gradcheck_fast_mode is None else op.gradcheck_fast_mode
    d = DTYPES[dtype]
    torch.manual_seed(0)
    conjugated = op.test_conjugated_samples and d.is_complex
    samples = op.sample_inputs("cpu", d, requires_grad=True,
                               include_conjugated_inputs=conjugated, small_inputs_only=not fast)
    for k, sample in enumerate(samples):
        if limit is not None and k >= limit:
            return
        if sample.broadcasts_input and kind == "inplace":
            continue
        fn, args = _as_called(op, sample, variant)
        if elements is not None and sum(a.numel() for a in args) > elements:
            continue
        common = {"check_grad_dtypes": True, "nondet_tol": op.gradcheck_nondet_tol,
                  "fast_mode": fast_mode}
        label = f"{full_name(op)} {dtype} {kind} sample {k}"
        if kind == "gradgrad":
            for non_contig in (False, True):
                yield Call(f"{label}{' non-contiguous' if non_contig else ''}", "gradgradcheck",
                           fn, args, {**common, "gen_non_contig_grad_outputs": non_contig,
                                      "check_batched_grad": op.check_batched_gradgrad}, k)
            continue
        forward = kind == "fwgrad"
        yield Call(label, "gradcheck", fn, args, {
            **common, "check_undefined_grad": True,
            "check_batched_grad": False if forward else op.check_batched_grad,
            "check_forward_ad": forward, "check_backward_ad": not forward,
            "check_batched_forward_grad": forward and op.check_batched_forward_grad}, k)


def _as_called(op: Any, sample: Any, variant: Callable[..., Any]
               ) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """(fn, the sample's tensors requiring grad): the function _check_helper hands gradcheck,
    its arguments the sample's own tensors (their storage, strides and offsets)."""
    fn, values = _as_gradcheck_sees_it(op, sample, variant=variant)
    return fn, tuple(v.requires_grad_() for v in values)  # detached views of the same storage


def outcome(call: Call, tool: str) -> tuple[str, float, str]:
    """(outcome, seconds, first line of the error): 'passed', 'failed' (False or
    GradcheckError), 'internal' (gradtool's InternalError), or the exception's type name."""
    import gradtool
    from gradtool.errors import InternalError

    function = getattr(torch.autograd if tool == "torch" else gradtool, call.which)
    torch.manual_seed(call.seed)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = "passed" if function(call.fn, call.args, **call.keywords) else "failed"
        error = ""
    except GradcheckError as exc:
        result, error = "failed", _first(exc)
    except InternalError as exc:
        result, error = "internal", _first(exc)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        result, error = type(exc).__name__, _first(exc)
    return result, time.perf_counter() - start, error


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def every_kth(names: list[str], k: int, offset: int = 0) -> list[str]:
    """Every k-th name by sorted order (from offset): a reproducible sample of the database."""
    return sorted(names)[offset::k]
