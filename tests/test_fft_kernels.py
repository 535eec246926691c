"""FFT kernels below float64: a complex result (an FFT's) is rounded in the simulated run as
real ones are, part by part with the kernel's own measured error, and a complex operand (its
backward's grad) is measured in the low dtype's complex twin; so a correct spectral filter
passes in float32 and a 0.5 % seeded scale error still fails."""

from __future__ import annotations

import pytest

import gradtool
from conftest import load_fixture, result

F = load_fixture("fft_kernels")


def _gradient(fn, seed):
    return result(gradtool.check(fn, ["4x32"], dtype="float32", seed=seed, checks=["gradient"]),
                  "gradient")


@pytest.mark.parametrize("fn", [F.SpectralFilter, F.power], ids=["filter", "power"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_correct_fft_kernel_passes_in_float32(fn, seed):
    check = _gradient(fn, seed)
    assert check.outcome.value == "passed", check.summary


def test_a_seeded_scale_error_behind_an_fft_still_fails():
    check = _gradient(F.SpectralFilterScaled, 0)
    assert check.outcome.value == "failed"
    assert "gradient.rounding" in {f.rule for f in check.findings} or any(
        b.mismatched for b in check.blocks), check.summary
