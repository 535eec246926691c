"""Double backward of kernels that compute below the dtype they are given (a Triton kernel's
float32 inside float64 inputs, forward and backward, or the backward alone) is judged at the
precision they compute in: correct kernels pass as gradgradcheck at float32's tolerances
passes them, and their broken twins (a negated second derivative, a dropped term) fail."""

from __future__ import annotations

import pytest
import torch

import gradtool

BROKEN = {"flag": None}


def _rot(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def _rot_t(g):  # the transpose of _rot
    a, b = g.chunk(2, -1)
    return torch.cat([b, -a], -1)


class RoPEBackward(torch.autograd.Function):
    """RoPE's backward as a kernel: float32 inside, its own backward float32 too."""

    @staticmethod
    def forward(ctx, g, x, cos, sin):
        ctx.save_for_backward(g, x, cos, sin)
        g32, x32 = g.float(), x.float()
        dx = g32 * cos.float() + _rot_t(g32 * sin.float())
        return dx.to(g.dtype), (g32 * x32).to(g.dtype), (g32 * _rot(x32)).to(g.dtype)

    @staticmethod
    def backward(ctx, gdx, gdcos, gdsin):
        dtype = ctx.saved_tensors[0].dtype
        g, x, cos, sin = (t.float() for t in ctx.saved_tensors)
        gdx, gdcos, gdsin = gdx.float(), gdcos.float(), gdsin.float()
        dg = gdx * cos + _rot(gdx) * sin + gdcos * x
        if BROKEN["flag"] != "drop":
            dg = dg + gdsin * _rot(x)
        dxx = gdcos * g + _rot_t(gdsin * g)
        if BROKEN["flag"] == "negate":
            dxx = -dxx
        return dg.to(dtype), dxx.to(dtype), (gdx * g).to(dtype), (_rot(gdx) * g).to(dtype)


def _rope_forward(x, cos, sin, coarse):
    if coarse:
        return (x.float() * cos.float() + _rot(x.float()) * sin.float()).to(x.dtype)
    return x * cos + _rot(x) * sin


class RoPE(torch.autograd.Function):
    """Rotary embedding; forward float32 inside (`coarse`) or in the dtype given."""

    @staticmethod
    def forward(ctx, x, cos, sin, coarse):
        ctx.save_for_backward(x, cos, sin)
        return _rope_forward(x, cos, sin, coarse)

    @staticmethod
    def backward(ctx, g):
        return (*RoPEBackward.apply(g, *ctx.saved_tensors), None)


class SparsemaxBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, p):
        s = (p > 0).float()
        ctx.save_for_backward(s)
        ctx.dtype = g.dtype
        g32 = g.float()
        return (s * (g32 - (g32 * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
                ).to(g.dtype)

    @staticmethod
    def backward(ctx, gg):
        s, = ctx.saved_tensors
        gg32 = gg.float()
        out = s * (gg32 - (gg32 * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
        return (-out if BROKEN["flag"] == "negate" else out).to(ctx.dtype), None


class Sparsemax(torch.autograd.Function):
    """Sparsemax over the last dimension; forward float32 inside (`coarse`) or not."""

    @staticmethod
    def forward(ctx, z, coarse):
        zc = z.float() if coarse else z
        zs = zc.sort(-1, descending=True)[0]
        cs = zs.cumsum(-1)
        k = torch.arange(1, z.shape[-1] + 1, dtype=zc.dtype)
        kz = (1 + k * zs > cs).sum(-1, keepdim=True)
        p = (zc - (cs.gather(-1, kz - 1) - 1) / kz).clamp_min(0)
        ctx.save_for_backward(p)
        return p.to(z.dtype)

    @staticmethod
    def backward(ctx, g):
        return SparsemaxBackward.apply(g, ctx.saved_tensors[0]), None


def _double_backward(name: str, coarse: bool, flag: str | None):
    gen = torch.Generator().manual_seed(0)
    BROKEN["flag"] = flag
    try:
        if name == "rope":
            x = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
            angle = torch.randn(3, 8, generator=gen, dtype=torch.float64)
            report = gradtool.check(lambda x, c, s: RoPE.apply(x, c, s, coarse),
                                    (x, angle.cos(), angle.sin()), checks=["double_backward"])
        else:
            z = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64)
            report = gradtool.check(lambda z: Sparsemax.apply(z, coarse), (z,),
                                    checks=["double_backward"])
    finally:
        BROKEN["flag"] = None
    return next(c for _, _, c in report.checks())


@pytest.mark.parametrize("name", ["rope", "sparsemax"])
@pytest.mark.parametrize("coarse", [True, False], ids=["float32-forward", "float64-forward"])
def test_a_correct_float32_kernel_passes_double_backward(name, coarse):
    result = _double_backward(name, coarse, None)
    assert result.outcome.name == "PASSED", result.summary
    assert any("judged at float32's precision" in d for d in result.details)


@pytest.mark.parametrize("name,flag", [("rope", "negate"), ("rope", "drop"),
                                       ("sparsemax", "negate")])
@pytest.mark.parametrize("coarse", [True, False], ids=["float32-forward", "float64-forward"])
def test_its_broken_twin_fails(name, flag, coarse):
    assert _double_backward(name, coarse, flag).outcome.name == "FAILED"


def test_a_backward_computing_below_the_dtype_given_is_said_to():
    # the forward in float64, only the backward kernel in float32 (before: "finite
    # differences are unreliable" on correct code, gradgradcheck at float32's tolerances passes)
    result = _double_backward("rope", False, None)
    assert any("the backward's" in d for d in result.details)


QUANT = {"negate": False}
WEIGHT = ((torch.randint(0, 16, (16, 12), generator=torch.Generator().manual_seed(3)).float()
           - 7.5) * 0.1).bfloat16()  # a 4-bit layer's weight, dequantized to bfloat16


class QuantLinear(torch.autograd.Function):
    """x @ Wᵀ computed in bfloat16 (a quantized layer's kernel), backward as gradgradcheck
    differentiates it: in the dtype given, from the dequantized weight."""

    @staticmethod
    def forward(ctx, x):
        return (x.bfloat16() @ WEIGHT.T).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        grad = g @ WEIGHT.to(g.dtype)
        return -grad if QUANT["negate"] else grad


def _quantized(negate: bool):
    QUANT["negate"] = negate
    try:
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        report = gradtool.check(QuantLinear.apply, (x,), checks=["gradient", "double_backward"])
    finally:
        QUANT["negate"] = False
    return {c.name: c for _, _, c in report.checks()}


def test_a_bfloat16_kernel_is_never_failed_on_a_mismatch_and_its_double_backward_passes():
    # today the first order at bfloat16's steps is inconclusive (rounding, at 1e-2 steps
    # finite differences read ulp(y) / 2h), never a mismatch; gradgradcheck passes the second
    # order, and so does gradtool
    found = _quantized(False)
    assert not any(b.mismatched for b in found["gradient"].blocks
                   if found["gradient"].outcome.name == "FAILED")
    assert {f.rule for f in found["gradient"].findings} <= {"gradient.forward_precision"}
    assert found["double_backward"].outcome.name == "PASSED"


def test_its_negated_twin_never_passes():
    assert _quantized(True)["gradient"].outcome.name != "PASSED"


def test_its_inconclusive_elements_are_not_called_a_kink():
    # issue 55: "kink" only where one is shown; here bfloat16's rounding is
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    report = gradtool.check(QuantLinear.apply, (x,), checks=["gradient"], mode="full")
    check = next(c for _, _, c in report.checks())
    notes = [d for d in check.details if d.startswith("inconclusive: finite differences")]
    assert notes and all("not a kink shown" in d and "kink, tie" not in d for d in notes)
