"""Conformance: gradtool agrees with PyTorch on its own differentiable ops (the OpInfo database).

Every autograd-capable OpInfo is checked at its first sample (float64, CPU, PyTorch's own
values) with gradtool's default checks. The expected verdicts are PyTorch's declarations:
a check must pass unless PyTorch skips or expects a failure of the matching gradient test
(then any verdict is accepted); where supports_gradgrad is False, double backward must be
skipped in torch's own words.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradtool.errors import InternalError
from opinfo_ops import autograd_ops, check_at_values, declared, is_empty, is_sparse, samples, \
    unavailable

REASON = unavailable()
OPS = sorted(autograd_ops()) if REASON is None else \
    [pytest.param("op_db", marks=pytest.mark.skip(reason=REASON))]

# Differences where gradtool is right and PyTorch's declarations say the test runs and passes.
# Each entry: op -> {check: (accepted outcome, why)}. Keep it short and explained.
ALLOWED: dict[str, dict[str, tuple[str, str]]] = {
    # A function calling these refuses (or reads differently) a non-contiguous input by the
    # op's own contract: the layout check tells a user wrapping them to copy or reshape first.
    "view": {"layout": ("failed", "view refuses a transposed input: reshape is the fix")},
    "view_as": {"layout": ("failed", "view_as refuses a transposed input: reshape is the fix")},
    "view_as_complex": {"layout": ("failed", "view_as_complex needs a last dimension of stride "
                                          "1")},
    "linalg.cond": {"layout": ("skipped", "a 0-d output, and no input layout tried")},
    "native_group_norm": {"layout": ("failed", "the native kernel requires contiguous input")},
    "as_strided.partial_views": {"layout": ("failed", "as_strided addresses the storage: its "
                                            "values depend on the input's layout")},
}


def _fft_refuses_expanded_tensors() -> bool:
    """Whether this torch's FFT raises on an expanded (stride-0) tensor, as torch 2.6's MKL FFT
    does ('DFTI ERROR: Inconsistent configuration parameters'); 2.4 and 2.13 do not."""
    x = torch.zeros(4, 6, dtype=torch.complex128, requires_grad=True)
    grad = torch.ones(1, 1, dtype=torch.complex128).expand(4, 6)
    try:
        torch.autograd.grad(torch.fft.fft(x), x, grad)
    except RuntimeError:
        return True
    return False


def _bessel_disagrees_with_itself() -> bool:
    """Whether this torch's bessel_j0 has a gradient (-j1) that its own forward's derivative
    misses by ~1e-6 relative, converged across steps 1e-3 to 1e-7 (its j0 and j1 are separate
    approximations; torch 2.15 differentiates them, 2.13 did not): a true finding gradcheck's
    rtol of 1e-3 does not see."""
    x = torch.tensor([-5.439777184204883], dtype=torch.float64, requires_grad=True)
    try:
        (grad,) = torch.autograd.grad(torch.special.bessel_j0(x).sum(), x)
    except RuntimeError:
        return False
    x = x.detach()
    slopes = [(torch.special.bessel_j0(x + h) - torch.special.bessel_j0(x - h)) / (2 * h)
              for h in (1e-3, 1e-5)]
    return all(abs((s - grad).item()) > 1e-7 for s in slopes) and \
        abs((slopes[0] - slopes[1]).item()) < 1e-7


# Where the installed torch itself is wrong: op-name prefix -> (check, outcome, the finding that
# must name it). Only a torch that has the bug (probed above) gets these.
TORCH_BUGS: dict[str, tuple[str, str, str]] = {
    **({"fft.": ("layout", "failed", "backward raises on an expanded (stride-0) grad_output")}
       if _fft_refuses_expanded_tensors() else {}),
    **({"special.bessel_": ("gradient", "failed", "disagrees with finite differences")}
       if _bessel_disagrees_with_itself() else {}),
}


def _torch_bug(name: str, check) -> bool:
    return any(name.startswith(prefix) and check.name == which and check.outcome.value == outcome
               and says in check.summary
               for prefix, (which, outcome, says) in TORCH_BUGS.items())


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", OPS)
def test_op_agrees_with_pytorch(name, record_property):
    op = autograd_ops()[name]
    expected = declared(op)
    for label, fn, values in samples(op):
        if is_sparse(values):  # under masked semantics, as PyTorch's sparse tests check them
            report = check_at_values(fn, values, name, masked=True)
            verdicts = {c.outcome.value for _, _, c in report.checks()}
            assert verdicts <= {"passed", "skipped"}, f"{name} ({label}): {verdicts}"
            continue
        empty = is_empty(fn, values)
        try:
            report = check_at_values(fn, values, name, nondet_tol=op.gradcheck_nondet_tol)
        except InternalError as exc:  # never accepted, whatever PyTorch declares
            raise AssertionError(f"{name} ({label}): {exc}") from exc
        checks = {c.name: c for c in report.targets[0].cases[0].checks}
        record_property(label, {k: c.outcome.value for k, c in checks.items()})
        wrong = [problem for check in checks.values()
                 if (problem := _disagreement(name, check, expected, empty))
                 and not _torch_test_fails(fn, values, op, check.name)]
        assert not wrong, f"{name} ({label}): " + "; ".join(wrong)


def _torch_test_fails(fn, values, op, check: str) -> bool:
    """Whether torch's own test of the same sample does not pass either — gradcheck for the
    first order, gradgradcheck for the second — though torch's OpInfo declares it passes:
    the installed torch's op, sample or declaration is at fault, not gradtool (torch 2.4's
    index_put sample; 2.15's bessel functions, ctc_loss, chunked linear_cross_entropy)."""
    test = {"contract": torch.autograd.gradcheck, "gradient": torch.autograd.gradcheck,
            "complex": torch.autograd.gradcheck,
            "double_backward": torch.autograd.gradgradcheck}.get(check)
    if test is None:
        return False
    inputs = [v.detach().requires_grad_(True) for v in values]
    try:
        return not test(fn, inputs, raise_exception=False, nondet_tol=op.gradcheck_nondet_tol)
    except Exception:  # noqa: BLE001 - torch's own test raises on it: it does not pass
        return True


def _disagreement(name: str, check, expected, empty: bool) -> str | None:
    """Why this check's outcome is not what PyTorch declares (None: it agrees)."""
    outcome = check.outcome.value
    allowed = ALLOWED.get(name, {}).get(check.name)
    if allowed and outcome == allowed[0] or _torch_bug(name, check):
        return None
    declared_as = expected.gradient if check.name in ("contract", "gradient", "complex",
                                                      "layout") \
        else expected.double_backward
    if check.name == "gradient" and outcome == "skipped" and "complex check" in check.summary:
        return None  # complex inputs or outputs: the complex check (judged on its own) covers it
    if declared_as in ("skip", "xfail"):
        return None  # PyTorch does not claim this test passes: any verdict is recorded
    if outcome == "skipped" and empty and "empty" in check.summary:
        return None
    if declared_as == "unsupported":
        if outcome == "skipped" and ("not implemented" in check.summary or empty):
            return None
        return f"double backward is {outcome} ({check.summary}); expected skipped: " \
               "PyTorch declares supports_gradgrad=False"
    if outcome == "passed":
        return None
    return f"{check.name} {outcome}: {check.summary}"


def test_without_expecttest_the_suite_says_why_it_skips():
    code = ("import sys; sys.modules['expecttest'] = None; import opinfo_ops; "
            "print(opinfo_ops.unavailable())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    assert "torch.testing._internal cannot be imported" in out.stdout, out.stderr
    assert "expecttest" in out.stdout
