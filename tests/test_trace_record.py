"""The trace recorder in-process: what is recorded, deduplicated, copied and put back."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

from gradtool.run.trace import Recorder, hooked
from gradtool.run.trace_messages import Layouts, recorded

APPLY = Function.__dict__["apply"]  # what the recording must put back


class Square(Function):
    @staticmethod
    def forward(ctx, x, scale=1.0):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return scale * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * ctx.scale * x * grad, None


class AddOneInPlace(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.add_(1)

    @staticmethod
    def backward(ctx, grad):
        return grad


@pytest.fixture
def recorder(tmp_path):
    messages = []
    rec = Recorder(str(tmp_path), 10, "script.py", messages.append)
    rec.messages = messages
    return rec


def calls(recorder):
    return recorded(recorder.messages)


def test_calls_are_deduplicated_by_class_shapes_strides_and_literals(recorder):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    with hooked(recorder):
        Square.apply(x)
        Square.apply(x)                    # same signature: counted, not recorded again
        Square.apply(x.t())                # other strides
        Square.apply(x, 2.0)               # another literal
        Square.apply(x.float())            # another dtype
    found = calls(recorder)
    assert [c["inputs"] for c in found] == [["3x4 float64"], ["4x3 float64, strides (1, 4)"],
                                            ["3x4 float64"], ["3x4 float32"]]
    assert recorder.summary()["repeats"] == {0: 1}
    assert all(c["label"] == "Square" and "test_trace_record.py:" in c["site"] for c in found)
    lines = [int(c["site"].rsplit(":", 1)[1]) for c in found]
    assert lines == sorted(lines) and len(set(lines)) == 4  # each call's own line
    assert found[0]["target"].endswith("test_trace_record.py:Square")
    assert Function.__dict__["apply"] is APPLY  # put back


def test_calls_whose_backward_cannot_run_are_counted_not_recorded(recorder):
    x = torch.randn(3, dtype=torch.float64)
    with hooked(recorder):
        Square.apply(x)                    # nothing requires grad
        with torch.no_grad():
            Square.apply(x.requires_grad_())
    assert calls(recorder) == [] and recorder.summary()["no_grad"] == 2


def test_max_calls_bounds_the_distinct_calls(tmp_path):
    messages = []
    recorder = Recorder(str(tmp_path), 2, "s.py", messages.append)
    with hooked(recorder):
        for n in range(1, 6):
            Square.apply(torch.randn(n, requires_grad=True))
    assert len(recorded(messages)) == 2
    assert recorder.summary()["dropped"] == 3


def test_inputs_are_saved_before_a_forward_that_writes_in_place(recorder):
    x = torch.zeros(4, dtype=torch.float64, requires_grad=True).clone()
    with hooked(recorder):
        AddOneInPlace.apply(x)
    [call] = calls(recorder)
    args, kwargs = torch.load(call["file"], weights_only=True)
    assert torch.equal(args[0], torch.zeros(4, dtype=torch.float64)) and args[0].requires_grad
    assert torch.equal(x.detach(), torch.ones(4, dtype=torch.float64))  # the run is untouched


def test_the_backward_grad_output_layout_is_recorded_once(recorder):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    with hooked(recorder):
        y = Square.apply(x)
    y.t().contiguous().t().sum().backward()
    y2 = Square.apply(x)  # the hooks are gone: nothing more is recorded
    y2.sum().backward()
    grads = [m for m in recorder.messages if isinstance(m, Layouts)]
    assert grads == [Layouts(0, ("3x4 float64, strides (0, 0)",))]
    assert len(calls(recorder)) == 1


def test_hooks_are_put_back_when_the_script_raises(recorder):
    from torch._ops import OpOverloadPacket

    before = (Function.__dict__["apply"], OpOverloadPacket.__dict__["__call__"])
    with pytest.raises(ValueError):
        with hooked(recorder):
            raise ValueError("script failed")
    assert (Function.__dict__["apply"], OpOverloadPacket.__dict__["__call__"]) == before


def test_a_function_defined_in_a_function_is_recorded_but_not_replayable(recorder):
    class Local(Square):
        pass

    with hooked(recorder):
        Local.apply(torch.randn(2, requires_grad=True))
    [call] = calls(recorder)
    assert call["target"] is None and "define it at module level" in call["problem"]


def test_a_call_with_an_object_argument_is_recorded_but_not_replayable(recorder):
    class Config:
        scale = 2.0

    class WithConfig(Function):
        @staticmethod
        def forward(ctx, x, config):
            return x * config.scale

        @staticmethod
        def backward(ctx, grad):
            return grad * 2.0, None

    with hooked(recorder):
        WithConfig.apply(torch.randn(2, requires_grad=True), Config())
    [call] = calls(recorder)
    assert call["target"] is None and "takes a" in call["problem"] and "Config" in call["problem"]
