"""The one door for bounds (numerics/bounds.py), and each rule it caps, each test failing
without its cap: a bound is finite, never the size of the values, and its cuts are named."""

from __future__ import annotations

import math

import torch
from conftest import load_fixture

from gradtool.numerics.bounds import CAP_REL, CAP_SCALE, admit, finite_max
from gradtool.numerics.compare import BlockTally
from gradtool.numerics.measured import first_bound
from gradtool.numerics.rounding import measure_bound


def test_a_non_finite_bound_is_cut_to_the_cap_and_counted():
    n = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    found = admit(torch.tensor([math.inf, math.nan, 1e-9], dtype=torch.float64), n, n,
                  origin="test")
    assert found.nonfinite == 2 and found.n_capped == 2
    assert torch.equal(found.tol[:2], CAP_REL * n[:2].abs() + CAP_SCALE * 2.0)
    assert found.tol[2] == 1e-9  # a bound below the cap is left as it is
    assert "NaN or inf bound" in found.words()


def test_a_bound_the_size_of_the_values_is_cut_so_a_sign_flip_fails():
    n = torch.tensor([1.0, 0.8, -0.9], dtype=torch.float64)
    found = admit(10.0, -n, n, origin="test")
    assert bool(((-n - n).abs() > found.tol).all())  # every element flipped stands
    assert found.n_capped == 3 and "as large as the values" in found.words()


def test_the_floor_the_user_set_is_never_cut():
    """gradcheck's verdict at the tolerance given: atol=1 passes what gradcheck would."""
    n = torch.tensor([0.1, 0.2], dtype=torch.float64)
    found = admit(1.0, -n, n, origin="test", floor=torch.full((2,), 1.0, dtype=torch.float64))
    assert bool((found.tol == 1.0).all()) and found.n_capped == 0


def test_sizes_read_only_finite_values():
    x = torch.tensor([1.0, -float("inf"), float("nan"), -3.0])
    assert finite_max(x) == 3.0
    assert finite_max(torch.empty(0), x[:1]) == 1.0


def test_the_first_bound_reads_no_minus_inf_padding():
    """The root cause of issue 55's float64 pass: max |x| was inf, so rtol was inf."""
    x = torch.randn(4, 6, dtype=torch.float64)
    x[:, 3:] = -float("inf")
    atol, rtol = first_bound([x], torch.randn(12, dtype=torch.float64), 1e-6)
    assert math.isfinite(atol) and math.isfinite(rtol) and rtol < 1e-3


def test_the_tally_door_fails_a_negated_block_even_at_an_inf_first_bound():
    """Without the door (its cap), an rtol of inf passes every element whatever the first
    bound's maker did; with it the fixed tolerance is the most a widened bound may reach."""
    tally = BlockTally("v", (3,), "out", (2,), atol=1e-9, rtol=math.inf)
    tally.kink_atol, tally.kink_rtol = 1e-5, 1e-3  # measured mode: the fixed tolerance kept
    n = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=torch.float64)
    tally.add(-n, n)
    assert tally.mismatched == 6 and tally.capped == 6


def test_a_fixed_tally_keeps_gradchecks_tolerance():
    tally = BlockTally("v", (3,), "out", (1,), atol=1.0, rtol=0.0)
    n = torch.tensor([[0.1, 0.2, -0.3]], dtype=torch.float64)
    tally.add(-n, n)
    assert tally.mismatched == 0  # |a - n| <= atol: gradcheck passes it, so does this


def test_simulated_rounding_of_a_masked_softmax_is_finite():
    """Sums' accumulation read |terms| with -inf in them (softmax of |-inf| = NaN): every
    rounding bound of a causal attention was inf, and a negated dv passed at float32."""
    M = load_fixture("masked_attention")
    x, v = M.causal_inputs(torch.float64)
    bound = measure_bound(lambda: [M.masked_ref(x, v)], [M.masked_ref(x, v)], "float32", 0)
    assert all(bool(torch.isfinite(t).all()) for t in bound.tolerances)


def test_a_probe_test_with_an_inf_tolerance_cannot_pass():
    """localise.Tests: an inf bound (differences that left the domain) passed any probe; now it
    is noisy (full mode judges, else inconclusive), the door's first rule."""
    from gradtool.numerics.localise import Tests

    t = lambda *rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    d = torch.tensor([[[1.0, math.inf]], [[1.0, 2.0]]], dtype=torch.float64)  # (2, P, n_out)
    for ceiling in ((1e-5, 1e-3), None):  # without a ceiling, only the door's rule holds it
        tests = Tests(t([1.0, 1.0]), d, t(0.5, 0.5), t([-5.0, 3.0]), t([1.0, 1.0]), 1e-6,
                      2.2e-16, 1e-5, ceiling)
        assert not tests.fails.any() and tests.noisy.all(), ceiling
