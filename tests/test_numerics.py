"""The engine's maths: finite differences, grouped VJPs, colourings, and full mode's verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.autograd import Function

from gradtool.targets.cases import build_case
from gradtool.numerics.sparsity import analytical_jacobian, colour_columns, find_strides, row_strides
from gradtool.config.settings import CheckConfig
from gradtool.targets.inputs import parse_input
from gradtool.numerics.jacobian import check_full, prime
from gradtool.numerics.steps import analytical_rows, central, directional, numerical_columns
from gradtool.targets.resolve import make_target

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import bugs  # noqa: E402


def case_of(cls: type, inputs: list[str], seed: int = 0, **settings: object):
    config = CheckConfig(checks=("gradient",), **settings)
    target = make_target(cls, f"bugs:{cls.__name__}")
    return target, build_case(target, [parse_input(s) for s in inputs], config, seed), config


def primed(cls: type, inputs: list[str], seed: int = 0, **settings: object):
    _, case, config = case_of(cls, inputs, seed, **settings)
    leaves, outs = prime(case.problem)
    return case.problem, leaves, outs, config


def full(cls: type, inputs: list[str], seed: int = 0, **settings: object):
    problem, leaves, outs, config = primed(cls, inputs, seed, **settings)
    return check_full(problem, config, leaves, outs, None, "test"), problem


LINEAR = ["6x4", "5x4", "(5,)"]


def test_numerical_columns_match_the_analytical_jacobian_of_a_correct_function():
    problem, leaves, outs, _ = primed(bugs.Linear, LINEAR)
    dense = analytical_rows(problem, leaves, outs, torch.arange(30))
    offset = 0
    for i, leaf in enumerate(leaves):
        cols = torch.arange(leaf.numel())
        numerical = numerical_columns(problem, problem.inputs, i, cols, 1e-6)
        assert torch.allclose(numerical, dense[:, offset:offset + leaf.numel()], atol=1e-7)
        offset += leaf.numel()


def test_with_inputs_passes_the_values_given_and_copies_only_the_other_tensors():
    from gradtool.numerics.problem import Problem

    x, w = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    problem = Problem(lambda x, w: x * w, [x, w], ["x", "w"], [0])
    value = torch.randn(3, dtype=torch.float64)
    args = problem.with_inputs([value])
    assert args[0] is value  # the engine's own fresh value, passed as it is
    assert args[1] is not w and args[1].data_ptr() != w.data_ptr() and torch.equal(args[1], w)


def test_batched_and_looped_differences_agree():
    problem, _, _, _ = primed(bugs.Cube, ["(50,)"])
    dirs = torch.randn(20, 50, dtype=torch.float64)
    batched = central(problem, problem.inputs, 0, dirs, 1e-6)
    assert problem.cache.vmap_ok is True
    problem.cache.vmap_ok = False
    looped = central(problem, problem.inputs, 0, dirs, 1e-6)
    assert torch.allclose(batched, looped, atol=1e-8)


class _FirstOfBatch(Function):
    """x * y whose vmap rule is wrong for a batched y: every element gets y's first (torch's
    own _cdist_backward under vmap, for a batched grad_output, did this)."""

    @staticmethod
    def forward(x, y):
        return x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, x, y):
        x_dim, y_dim = in_dims
        if y_dim is not None:
            y = y.movedim(y_dim, 0)[:1].expand(info.batch_size, *y.shape[1:]).movedim(0, y_dim)
        x = x if x_dim is not None else x.unsqueeze(0).expand(info.batch_size, *x.shape)
        y = y.movedim(y_dim, 0) if y_dim is not None else y
        return _FirstOfBatch.apply(x.movedim(x_dim, 0) if x_dim is not None else x, y), 0


def test_batches_are_checked_for_every_input_not_only_the_first():
    from gradtool.numerics.problem import Problem

    x, y = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    problem = Problem(lambda a, b: a * b, [x, y], ["x", "y"], [0, 1],
                      batched_fn=_FirstOfBatch.apply)
    dirs = torch.randn(40, 6, dtype=torch.float64)  # enough to be batched
    central(problem, problem.inputs, 0, dirs, 1e-6)
    assert problem.cache.vmap_ok is True  # right for a batched x
    got = central(problem, problem.inputs, 1, dirs, 1e-6)  # wrong for a batched y: caught
    assert problem.cache.vmap_ok is False
    assert torch.allclose(got, dirs * x, atol=1e-8)


def test_directional_second_estimate_has_the_2h_error_with_three_evaluations():
    problem, _, outs, _ = primed(bugs.Cube, ["(40,)"])
    x = problem.inputs[0]
    u = [[torch.ones_like(x)]]
    f0 = outs[0].detach().reshape(-1)
    before = problem.calls["forward"]
    three = directional(problem, problem.inputs, u, 1e-3, f0)
    assert problem.calls["forward"] - before == 3
    four = directional(problem, problem.inputs, u, 1e-3)
    exact = 3 * x.reshape(-1) ** 2
    # both second rows carry the 2h truncation error (4 h^2 f'''/6 = 4e-6 here)
    assert torch.allclose(three[1, 0] - exact, four[1, 0] - exact, atol=1e-8)
    assert torch.allclose(three[0, 0], four[0, 0])


@pytest.mark.parametrize("cls, inputs", [
    (bugs.Linear, ["20x8", "30x8", "(30,)"]),
    (bugs.Cube, ["(500,)"]),
    (bugs.CubeScaled, ["(300,)"]),
])
def test_grouped_vjps_recover_the_one_hot_jacobian_exactly(cls, inputs):
    problem, leaves, outs, _ = primed(cls, inputs)
    n_out = sum(o.numel() for o in outs)
    strides, _ = find_strides(problem, leaves, outs)
    assert any(strides)
    jac = analytical_jacobian(problem, leaves, outs, strides)
    assert jac.sparse and jac.vjps < n_out
    dense = analytical_rows(problem, leaves, outs, torch.arange(n_out))
    cols = torch.arange(dense.shape[1])
    assert torch.equal(jac.columns(cols, dense.dtype), dense)  # bit for bit


class Dense(Function):
    """y = A x with a dense A: every row meets every column, no grouping can decode."""

    @staticmethod
    def forward(ctx, x):
        a = torch.linspace(-1, 1, x.numel() ** 2, dtype=x.dtype).view(x.numel(), x.numel())
        ctx.save_for_backward(a)
        return a @ x

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return a.t() @ grad


class SquaredGrad(Function):
    """A backward that is not linear in grad_output (a bug): grouped VJPs must not decode it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad * grad.abs()


def test_dense_rows_fall_back_to_one_hot_and_nonlinear_backwards_never_decode():
    problem, leaves, outs, _ = primed(Dense, ["(80,)"])
    assert find_strides(problem, leaves, outs)[0] == [None]
    problem, leaves, outs, _ = primed(SquaredGrad, ["(80,)"])
    jac = analytical_jacobian(problem, leaves, outs, [1])  # force a grouping: must collide
    dense = analytical_rows(problem, leaves, outs, torch.arange(80))
    assert torch.equal(jac.columns(torch.arange(80), dense.dtype), dense)
    assert jac.vjps == 2 + 80


def test_row_strides_try_diagonals_of_the_output_shape_early():
    strides = row_strides(64 * 64, (64, 64))
    assert strides[0] == 1 and strides.index(65) < strides.index(129)
    assert all(1 <= m <= 64 * 64 // 8 for m in strides)


def test_colourings_are_proper_and_few():
    problem, leaves, outs, _ = primed(bugs.Linear, ["16x8", "12x8", "(12,)"])
    jac = analytical_jacobian(problem, leaves, outs)
    offset = 0
    for leaf, expected in zip(leaves, (8, 8, 1)):
        rows, cols, _ = jac.entries(offset, offset + leaf.numel())
        colour = colour_columns(rows, cols, jac.n_out, tuple(leaf.shape))
        assert colour is not None and int(colour.max()) + 1 == expected
        keys = rows * 1000 + colour[cols]
        assert len(torch.unique(keys)) == len(keys)  # no row meets one colour twice
        offset += leaf.numel()


@pytest.mark.parametrize("bug, cls", list(bugs.CUBE_BUGS.items()))
@pytest.mark.parametrize("n", [10, 2000])
def test_full_mode_catches_every_seeded_elementwise_bug(bug, cls, n):
    verdict, _ = full(cls, [f"({n},)"])
    assert verdict.outcome.value == "failed", bug
    worst = next(b for b in verdict.blocks if b.mismatched).worst[0]
    assert worst.abs_diff > 1e-5 + 1e-3 * abs(worst.numerical)


@pytest.mark.parametrize("bug, cls", list(bugs.LINEAR_BUGS.items()))
def test_full_mode_catches_every_seeded_linear_bug(bug, cls):
    verdict, _ = full(cls, ["20x20", "30x20", "(30,)"])
    assert verdict.outcome.value == "failed", bug


def test_full_mode_names_the_single_wrong_element_exactly():
    _, case, _ = case_of(bugs.LinearOneElement, ["20x20", "30x20", "(30,)"])
    x = case.problem.args[0]
    n, i = divmod(bugs._bad_index(x), 20)
    verdict, _ = full(bugs.LinearOneElement, ["20x20", "30x20", "(30,)"])
    (block,) = [b for b in verdict.blocks if b.mismatched]
    assert block.input == "weight" and block.mismatched == 1
    element = block.worst[0]
    assert element.input_index == (0, i) and element.output_index == (n, 0)
    assert element.analytical == pytest.approx(1.01 * float(x[n, i]), rel=1e-9)
    assert element.numerical == pytest.approx(float(x[n, i]), rel=1e-6)


def test_coloured_sweep_counts_every_element_once():
    verdict, problem = full(bugs.CubeScaled, ["(3000,)"])
    (block,) = verdict.blocks
    assert block.checked == 3000 * 3000
    assert problem.calls["forward"] < 200   # not 6000: one colour, confirmed columns only


class CumsumForgotten(Function):
    """cumsum whose backward returns grad unchanged: the analytical Jacobian is the identity,
    the numerical one lower-triangular. The missing elements are outside the analytical
    pattern, so a coloured sweep must find them from the numerical side alone."""

    @staticmethod
    def forward(ctx, x):
        return torch.cumsum(x, 0)

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def test_elements_missing_from_the_analytical_pattern_are_caught_and_named():
    verdict, _ = full(CumsumForgotten, ["(400,)"])
    assert verdict.outcome.value == "failed"
    (block,) = verdict.blocks
    element = block.worst[0]
    assert element.analytical == 0.0 and element.numerical == pytest.approx(1.0)
    assert element.output_index[0] > element.input_index[0]


def test_full_mode_passes_correct_functions_without_noise():
    for cls, inputs in ((bugs.Linear, ["20x20", "30x20", "(30,)"]), (bugs.Cube, ["(5000,)"])):
        verdict, _ = full(cls, inputs)
        assert verdict.outcome.value == "passed"
        assert all(b.max_abs_diff < 1e-6 for b in verdict.blocks)


class NearlyDiagonal(Function):
    """y = 1e-3 x + 1e-6 (sum of x): backward drops the tiny off-diagonal part. Each dropped
    derivative (1e-6) is within atol, so slow mode passes; but a colour sums thousands of
    them, past the diagonal's tolerance: full mode must confirm before failing, and pass."""

    @staticmethod
    def forward(ctx, x):
        return 1e-3 * x + 1e-6 * x.sum()

    @staticmethod
    def backward(ctx, grad):
        return 1e-3 * grad


def test_flags_that_no_single_element_bears_out_do_not_fail_the_check():
    # gradcheck's fixed tolerance (atol set): each dropped 1e-6 derivative is within it
    verdict, problem = full(NearlyDiagonal, ["(2000,)"], atol=1e-5)  # past the dense size
    assert verdict.outcome.value == "passed"
    assert verdict.blocks[0].checked == 2000 * 2000
    assert problem.calls["forward"] > 4000  # the colour was recomputed column by column


def test_the_measured_tolerance_sees_the_dropped_tiny_derivatives():
    # 1e-6 missing where the derivative is 1e-6: 100 % off, far beyond the measured error
    verdict, _ = full(NearlyDiagonal, ["(300,)"])
    assert verdict.outcome.value == "failed"
    assert any("tolerance measured" in d for d in verdict.details)
