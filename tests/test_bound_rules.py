"""Each rule routed through the one door (numerics/bounds.py) beside a seeded mutant the rule
let pass without the door's cap, now failing, and its correct twin passing."""

from __future__ import annotations

import torch

import gradtool

FLIP = {"on": False}


class SmallBias(torch.autograd.Function):
    """x·10 + b in bfloat16; b's gradient about 0.115 of the largest gradient: under layout's
    NOISE_ULPS of it, so taken for a gradient that cancels whole and compared at FLOOR_ULPS
    (half the largest gradient). Broken: b's gradient negated for a non-contiguous
    grad_output (a layout bug on a real, non-negligible gradient)."""

    @staticmethod
    def forward(ctx, x, b):
        return x * 10 + b

    @staticmethod
    def backward(ctx, g):
        gx = g * 10
        gb = g[0] / g[0].abs().max() * (0.115 * float(gx.abs().max()))
        if FLIP["on"] and not g.is_contiguous():
            gb = -gb
        return gx, gb


def _layout(on: bool):
    FLIP["on"] = on
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4, 5, generator=gen).bfloat16()
        b = torch.randn(5, generator=gen).bfloat16()
        report = gradtool.check(SmallBias.apply, (x, b), checks=["layout"])
    finally:
        FLIP["on"] = False
    return next(c for _, _, c in report.checks() if c.name == "layout")


def test_layout_a_sign_flip_under_the_cancelling_floor_fails_and_names_the_cut():
    # without the cap: 64 bfloat16 ulps of the largest gradient (0.5 of it) passed the
    # flipped gradient (2 x 0.115 of it apart)
    result = _layout(True)
    assert result.outcome.name == "FAILED"
    assert "'b'" in result.summary and "cut to 0.5 |value| + 0.1 max |value|" in result.summary
    assert "64 ulps of its terms' scale" in result.summary


def test_layout_its_correct_twin_passes():
    assert _layout(False).outcome.name == "PASSED"


def test_contract_a_measured_rounding_as_large_as_the_values_cannot_pass_a_sign_flip():
    from gradtool.checks.contract_rounding import MEASURED_WORDS, beyond_rounding

    gen = torch.Generator().manual_seed(1)
    grad = (torch.randn(32, generator=gen) + 3).bfloat16()
    # backward's measured rounding as large as the gradient (a noisy or nonlinear backward
    # measures itself so): without the cap it let the negated gradient through
    measured = 12 * grad.double().abs().max()
    flipped = beyond_rounding(-grad, [(1, grad)], "bfloat16", 32, 0.0, False,
                              measured=measured, widened=MEASURED_WORDS)
    assert flipped is not None and "cut to 0.5 |value| + 0.1 max |value|" in flipped
    assert MEASURED_WORDS in flipped
    assert beyond_rounding(grad, [(1, grad)], "bfloat16", 32, 0.0, False,
                           measured=measured, widened=MEASURED_WORDS) is None


def test_contract_the_users_nondet_tol_is_never_cut():
    from gradtool.checks.contract_rounding import beyond_rounding

    grad = torch.ones(8, dtype=torch.float32)
    assert beyond_rounding(-grad, [(1, grad)], "float32", 8, 2.5, False) is None


MUTANT = {"kind": None}


class TanhLayer(torch.autograd.Function):
    """tanh(x @ w); x's gradient negated or 1.5x as MUTANT says."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.tanh(x @ w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        y = torch.tanh(x @ w)
        gz = g * (1 - y * y)
        gx = gz @ w.T
        gx = {"negate": -gx, "scale": 1.5 * gx}.get(MUTANT["kind"], gx)
        return gx, x.T @ gz


def tanh_reference(x, w):
    return torch.tanh(x.double() @ w.double())


def _against_reference(kind):
    MUTANT["kind"] = kind
    try:
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(5, 6, generator=gen), torch.randn(6, 3, generator=gen)
        report = gradtool.check(TanhLayer.apply, (x, w), checks=["gradient"],
                                reference=tanh_reference)
    finally:
        MUTANT["kind"] = None
    return next(c for _, _, c in report.checks())


def test_a_negated_gradient_against_a_reference_is_a_sign_flip_not_rounding():
    result = _against_reference("negate")
    assert result.outcome.name == "FAILED"
    assert "sign flipped" in result.summary
    assert [f.rule for f in result.findings][0] == "gradient.sign"


def test_a_scaled_gradient_is_no_sign_flip_and_the_correct_twin_passes():
    scaled = _against_reference("scale")
    assert scaled.outcome.name == "FAILED" and "sign" not in scaled.summary
    assert "gradient.sign" not in [f.rule for f in scaled.findings]
    assert _against_reference(None).outcome.name == "PASSED"
