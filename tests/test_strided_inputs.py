"""A checked input's strides never cause an internal error: the element-wise re-evaluations of
the failing path (kink test, forward-mode columns) index a clone that keeps a transposed layout."""

from __future__ import annotations

import pytest
import torch

import gradtool
from gradtool.numerics.forward import jvp_column
from gradtool.numerics.steps import element, one_sided
from conftest import load_fixture, outcomes

_F = load_fixture("strided")
KinkExact, KinkScaled, transposed = _F.KinkExact, _F.KinkScaled, _F.transposed


def test_element_is_row_major_whatever_the_strides():
    x = torch.arange(6.).reshape(2, 3).t()
    assert [x[element(x.shape, k)].item() for k in range(6)] == x.reshape(-1).tolist()


def test_seeded_bug_on_a_transposed_input_fails_without_internal_error():
    report = gradtool.check(KinkScaled.apply, (transposed().requires_grad_(),),
                            checks=["gradient"])
    assert outcomes(report) == {"gradient": "failed"}


def test_correct_twin_on_a_transposed_input_is_not_failed():
    report = gradtool.check(KinkExact.apply, (transposed().requires_grad_(),),
                            checks=["gradient"])
    assert outcomes(report)["gradient"] in ("passed", "inconclusive")


def test_one_sided_and_jvp_column_on_a_transposed_value():
    from gradtool.numerics.problem import Problem

    x = transposed()
    problem = Problem(lambda v: v * 2, [x], ["x"], [0])
    assert float(one_sided(problem, [x], 0, 3, 1e-6)["central"][3]) == pytest.approx(2.0)
    assert jvp_column(problem, [x], 0, 3)[3].item() == 2.0
