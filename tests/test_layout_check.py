"""The layout check: non-contiguous grad_outputs and inputs against the contiguous result."""

from __future__ import annotations

import pytest
import torch
from conftest import load_fixture, result

import gradtool
from gradtool.checks.layout import difference
from gradtool.checks.layout_variants import channels_last, expanded, sliced, transposed
from gradtool.results import Outcome, Severity
from gradtool.targets.load import source_of


@pytest.fixture(scope="module")
def fx():
    return load_fixture("layouts")


def layout(target, inputs, **settings):
    report = gradtool.check(target, inputs, checks=("layout",), **settings)
    return result(report, "layout")


def rules(check):
    return [f.rule for f in check.findings]


def test_a_backward_reading_grad_output_flat_fails_for_transposed_sliced_and_expanded(fx):
    check = layout(fx.RowScaleFlat, ["3x4", "(4,)"])
    assert check.outcome is Outcome.FAILED
    assert check.summary.startswith("backward ignores grad_output's strides: wrong for a "
                                    "transposed grad_output")
    assert rules(check) == ["layout.grad_output_strides", "layout.grad_output_strides",
                            "layout.grad_output_raises"]
    messages = [f.message for f in check.findings]
    assert "sliced grad_output" in messages[1]
    # .sum()'s grad_output has one element of storage: reading it flat runs out of bounds.
    assert "backward raises on an expanded (stride-0) grad_output" in messages[2]
    assert "contiguous()" in messages[2]
    assert check.findings[0].source == source_of(fx.RowScaleFlat.backward)
    assert all(f.severity is Severity.FAILURE for f in check.findings)


def test_the_stride_aware_twin_passes_with_a_few_calls(fx):
    check = layout(fx.RowScale, ["3x4", "(4,)"])
    assert check.outcome is Outcome.PASSED, check.summary
    assert "a transposed grad_output" in check.summary and "expanded" in check.summary
    # One recorded forward and backward; a backward per grad_output layout (the expanded one
    # and its contiguous copy, other values, two); a forward and backward per input layout.
    # No finite differences.
    assert check.calls == {"forward": 3, "backward": 7}


def test_a_backward_reading_a_saved_input_flat_fails_for_that_input_only(fx):
    """The finding names the input layout, and no grad_output layout is blamed."""
    check = layout(fx.SavedFlat, ["3x4", "(4,)"])
    assert check.outcome is Outcome.FAILED
    assert rules(check) == ["layout.input_strides"]
    assert check.findings[0].data["inputs"] == ["x", "w"]  # x moved, w's gradient wrong
    assert "transposed input 'x'" in check.summary
    assert "a transposed grad_output" in layout(fx.RowScale, ["3x4", "(4,)"]).summary


def test_both_mistakes_at_once_are_each_named(fx):
    check = layout(fx.BothFlat, ["3x4", "(4,)"])
    assert rules(check) == ["layout.grad_output_strides", "layout.grad_output_strides",
                            "layout.grad_output_raises", "layout.input_strides"]
    assert "transposed grad_output" in check.findings[0].message
    assert "sliced grad_output" in check.findings[1].message
    assert "transposed input 'x'" in check.findings[3].message


def test_a_forward_through_view_is_named_with_the_fix(fx):
    check = layout(fx.FlattenView, ["3x4"])
    assert check.outcome is Outcome.FAILED
    assert rules(check)[0] == "layout.input_raises"
    assert "forward raises on a transposed input 'x'" in check.summary
    assert "reshape" in check.summary and ".contiguous()" in check.summary
    assert check.source.endswith(f"layouts.py:{_line_of(fx, 'x.view(-1) ** 2')}")
    assert layout(fx.FlattenReshape, ["3x4"]).outcome is Outcome.PASSED


def test_a_backward_assuming_nchw_fails_for_a_channels_last_grad_output(fx):
    check = layout(fx.ChannelScaleNCHW, ["2x3x4x5", "(3,)"])
    assert check.outcome is Outcome.FAILED
    assert any("wrong for a channels_last grad_output" in f.message for f in check.findings)
    twin = layout(fx.ChannelScale, ["2x3x4x5", "(3,)"])
    assert twin.outcome is Outcome.PASSED and "channels_last grad_output" in twin.summary


def test_layouts_that_change_nothing_are_not_tried():
    assert transposed(torch.zeros(1, 4)) is None          # a 1-element dimension
    assert transposed(torch.zeros(4)) is None
    assert channels_last(torch.zeros(2, 1, 3, 3)) is None  # one channel: the same memory
    assert channels_last(torch.zeros(2, 3, 1, 1)) is None
    assert expanded(torch.zeros(1, 1)) is None
    assert sliced(torch.zeros(())) is None
    t = torch.arange(6.0).reshape(2, 3)
    for make in (transposed, sliced, expanded):
        out = make(t)
        assert not out.is_contiguous() or out.storage_offset()
    assert torch.equal(transposed(t), t) and torch.equal(sliced(t), t)
    assert sliced(t).storage_offset() == 1 and expanded(t).stride() == (0, 0)
    x = torch.randn(2, 3, 4, 5)
    assert channels_last(x).is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(channels_last(x), x)


def test_a_1_by_n_input_is_checked_without_the_transposed_layout(fx):
    check = layout(fx.RowScale, ["1x4", "(4,)"])
    assert check.outcome is Outcome.PASSED
    assert "transposed grad_output" not in check.summary


def test_rounding_is_not_a_finding():
    have = torch.tensor([1.0, 2.0], dtype=torch.float32)
    assert difference(have + 1e-7, have, 0.0, "x") is None
    assert "'x'[1]" in difference(torch.tensor([1.0, 2.5]), have, 0.0, "x")
    # A cancelling gradient (rounding noise) is judged at the random cotangent's scale.
    noise = torch.tensor([1e-17, -3e-17], dtype=torch.float64)
    assert difference(noise, -noise, 0.0, "x", scale=1.0) is None


@pytest.mark.parametrize("target, inputs, settings", [
    ("torch.nn:BatchNorm2d", ["2x3x4x4"], {"init": {"num_features": 3}}),
    ("torch.nn:Conv2d", ["2x3x6x6"], {"init": {"in_channels": 3, "out_channels": 4,
                                                 "kernel_size": 3}}),
    ("torch.nn:LayerNorm", ["4x5"], {"init": {"normalized_shape": 5}, "dtype": "float32"}),
    ("torch:matmul", ["8x16", "16x9"], {"dtype": "float32"}),
    ("torch:cumsum", ["3x4", "1"], {}),
])
def test_correct_torch_code_never_fails(target, inputs, settings):
    from gradtool.config.settings import CheckConfig
    from gradtool.run.collect import collect_one
    from gradtool.run.runner import run
    from gradtool.targets.inputs import parse_input

    config = CheckConfig(checks=("layout",), **{k: v for k, v in settings.items()
                                                if k != "init"})
    jobs, _ = collect_one(target, config, [parse_input(i) for i in inputs],
                          init=settings.get("init"))
    check = result(run(jobs, config), "layout")
    assert check.outcome is Outcome.PASSED, check.summary


def test_layout_runs_in_the_default_run(fx):
    report = gradtool.check(fx.RowScaleFlat, ["3x4", "(4,)"])
    assert result(report, "layout").outcome is Outcome.FAILED
    assert result(report, "gradient").outcome is Outcome.PASSED  # contiguous one-hots pass


def _line_of(module, text: str) -> int:
    import inspect

    lines = inspect.getsource(module).splitlines()
    return next(k + 1 for k, line in enumerate(lines) if text in line)


def test_the_culprit_search_names_a_function_given_a_transposed_grad_output(fx):
    report = gradtool.check(fx.scaled_transposed, ["3x4", "(4,)"], checks=("gradient",))
    check = result(report, "gradient")
    assert check.outcome is Outcome.FAILED
    text = "\n".join(check.details)
    assert "RowScaleFlat (" in text and "is wrong w.r.t. x" in text
    assert "is wrong in the layouts it received" in text
    assert "wrong for the transposed grad_output it received" in text
    assert "code between them" not in text
    assert check.source == source_of(fx.RowScaleFlat.backward)


def test_the_model_case_names_the_function(fx):
    check = result(gradtool.check(fx.TransposedModel(), ["3x4"], checks=("gradient",)),
                   "gradient")
    assert check.outcome is Outcome.FAILED
    assert any("RowScaleFlat at" in line and "transposed grad_output it received" in line
               for line in check.details)


def test_the_stride_aware_twin_inside_the_callable_passes(fx):
    report = gradtool.check(fx.scaled_transposed_ok, ["3x4", "(4,)"])
    assert report.ok(), [(k.name, k.summary) for _, _, k in report.checks()]


def test_restride_keeps_values_in_the_captured_strides():
    from gradtool.run.received import describe, restride

    t = torch.randn(3, 4)
    out = restride(t, ((3, 4), (1, 3), 0))
    assert out.stride() == (1, 3) and torch.equal(out, t)
    out = restride(t, ((3, 4), (8, 2), 1))
    assert out.stride() == (8, 2) and out.storage_offset() == 1 and torch.equal(out, t)
    out = restride(t, ((3, 4), (0, 1), 0))
    assert out.stride() == (0, 1) and torch.equal(out, t[:1].expand(3, 4))
    assert restride(t, ((3, 4), (4, 1), 0)) is None        # already so: nothing to try
    assert restride(t, ((4, 3), (1, 4), 0)) is None        # another shape
    assert describe(((3, 4), (1, 3), 0)) == "transposed"
    assert describe(((3, 4), (0, 0), 0)) == "expanded (stride-0)"
    assert describe(((2, 3, 4, 5), (60, 1, 15, 3), 0)) == "channels_last"


def test_a_module_is_checked_in_the_input_and_grad_output_layouts_not_its_parameters(fx):
    check = layout(fx.ChannelScaleModule(), ["2x3x4x5"])
    assert check.outcome is Outcome.FAILED
    assert any("channels_last grad_output" in f.message for f in check.findings)
    assert "'scale'" not in check.summary.split("inputs")[-1]  # a parameter keeps its layout
    twin = layout(fx.ChannelScaleModuleOk(), ["2x3x4x5"])
    assert twin.outcome is Outcome.PASSED, twin.summary
    assert "inputs 'x'" in twin.summary and "scale" not in twin.summary


def test_a_custom_op_s_registered_backward_is_checked_too():
    ops = load_fixture("layout_ops")
    check = layout(ops.row_scale, ["3x4", "(4,)"])
    assert check.outcome is Outcome.FAILED
    assert "wrong for a transposed grad_output" in check.summary
    assert layout(ops.row_scale_ok, ["3x4", "(4,)"]).outcome is Outcome.PASSED


def test_a_backward_assuming_grad_output_has_the_input_strides_fails(fx):
    """Right only when grad_output moves with the input (both transposed at once): each layout
    is tried alone, so the transposed grad_output on a contiguous input shows it."""
    check = layout(fx.FastPathOnInput, ["3x4", "(4,)"])
    assert check.outcome is Outcome.FAILED
    assert rules(check)[0] == "layout.grad_output_raises"
    assert "backward raises on a transposed grad_output" in check.summary
    same = layout(fx.SameStridesAsInput, ["3x4", "(4,)"])
    assert rules(same) == ["layout.grad_output_strides", "layout.grad_output_strides",
                           "layout.grad_output_raises", "layout.input_strides"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_gradient_that_cancels_whole_is_judged_at_its_backward_s_scale(fx, dtype):
    """A convolution's bias before batch norm: its gradient is rounding noise (~1e-15 in
    float64), other noise in every layout; it failed every layout before (a reviewer's find)."""
    check = layout(fx.ConvBatchNorm(), ["2x3x6x6"], dtype=dtype)
    assert check.outcome is Outcome.PASSED, check.summary
    assert layout(fx.RowScaleFlat, ["3x4", "(4,)"], dtype=dtype).outcome is Outcome.FAILED


@pytest.mark.parametrize("dtype, scale", [("float64", 1e-6), ("float32", 1e-4),
                                          ("float16", 5e-2), ("bfloat16", 5e-1)])
def test_a_small_but_real_gradient_keeps_its_own_rounding(fx, dtype, scale):
    """Only a gradient within a few units of rounding of the backward's largest is taken for a
    cancelled sum's noise: a layout bug on an input whose gradient is `scale` times smaller
    than another's still fails (it passed at bfloat16 with a floor for every gradient)."""
    check = layout(fx.SmallBranch(scale), ["3x4", "3x4"], dtype=dtype)
    assert "layout.input_strides" in rules(check), check.summary
