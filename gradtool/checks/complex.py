"""complex: complex inputs or outputs, real and imaginary parts against finite differences."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..config.settings import CheckConfig
from ..diagnosis.block import Diagnosis
from ..numerics.jacobian import Verdict
from ..numerics.problem import Problem
from ..numerics.wirtinger import is_complex, parts_sign, realify
from ..results import Block, CheckResult
from ..targets.cases import Case
from ..targets.load import Target
from ._common import Context
from .gradient import diagnose_first_order, drift_result, jacobian_result

NAME = "complex"
PARTS = ("complex tensors are compared as real tensors of shape (..., 2): last index 0 is the "
         "real part, 1 the imaginary part")
CONJ = ("backward returns the conjugate of PyTorch's gradient: it forgets a .conj() (PyTorch's "
        "convention is the conjugate Wirtinger derivative: for holomorphic f, grad_input = "
        "grad_output * f'(z).conj())")
# the whole result conjugated (every imaginary part of grad_input negated), not only f'(z)
CONJ_RESULT = ("backward returns the conjugate of the gradient: every imaginary part of "
               "grad_input has the wrong sign (a .conj() too many on the result, or an adjoint "
               "written as a transpose)")


def applies(case: Case, context: Context) -> str | None:
    if not case.problem.diff:
        return "no differentiable inputs"
    if not is_complex(case.problem):
        return "no complex inputs or outputs"
    return None


def run(case: Case, context: Context) -> CheckResult:
    """The gradient check on the real map (Re z, Im z) -> (Re f, Im f); a mismatch that a
    conjugation explains is named as the missing .conj(); inside a model, a failure names the
    custom Function to blame, as the gradient check does."""
    result = check_complex(case, context.target, context.config)
    if context.annotate is not None and context.surrogate is None:
        result = context.annotate(result, case.problem, context.config)
    return result


def check_complex(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """The complex check of one case (the culprit search's, for a Function alone, too)."""
    problem = case.problem
    if problem.facts.drift:  # what the gradient check fails a real forward for
        return drift_result(NAME, problem, target, time.perf_counter())
    real = realify(problem)
    in_complex = [v.is_complex() for v in problem.inputs]
    out_complex = [o.is_complex() for o in problem.outputs(problem.inputs)]

    def diagnose(p: Problem, verdict: Verdict, block: Block, i: int, o: int,
                 config: CheckConfig) -> Diagnosis | None:
        return _diagnose(p, verdict, block, i, o, config, in_complex, out_complex)

    result = jacobian_result(NAME, real, target, config, case.seed, None, None, diagnose)
    problem.calls.update(real.calls)
    return replace(result, details=(*result.details, PARTS)) if result.blocks else result


def _diagnose(problem: Problem, verdict: Verdict, block: Block, i: int, o: int,
              config: CheckConfig, in_complex: list[bool], out_complex: list[bool]
              ) -> Diagnosis | None:
    if (i, o) in verdict.dense:
        analytical, numerical = verdict.dense[(i, o)]
        rows = out_complex[o] if o < len(out_complex) else False
        atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
        # z -> conj(f(conj z)) (f'(z) not conjugated), then grad_input conjugated as a whole
        patterns = [(rows, CONJ)] + ([(False, CONJ_RESULT)] if in_complex[i] and rows else [])
        for sign_rows, text in patterns:
            sign = parts_sign(sign_rows, in_complex[i], *analytical.shape,
                              analytical.device).to(analytical.dtype)
            if not _close(analytical, numerical, atol, rtol) and \
                    _close(analytical * sign, numerical, atol, rtol):
                return Diagnosis("conj", text)
    return diagnose_first_order(problem, verdict, block, i, o, config)


def _close(a: torch.Tensor, n: torch.Tensor, atol: float, rtol: float) -> bool:
    return bool(((a - n).abs() <= atol + rtol * n.abs()).all())
