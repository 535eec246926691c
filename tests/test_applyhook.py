"""run/applyhook.py: one hook on every custom Function application, on every torch version."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from torch.autograd import Function
from torch.autograd.function import FunctionMeta

from gradtool.run.applyhook import Hook, bypassed, hooked, takes_ctx


class Old(Function):
    @staticmethod
    def forward(ctx, x, k=2.0):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class New(Function):
    @staticmethod
    def forward(x, k=2.0):
        return x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class ByVjp(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def vjp(ctx, g):
        return g * 3


ALIAS = New.apply  # captured at import, as libraries do: bound before any hook exists


class Seen(Hook):
    def __init__(self):
        self.calls, self.backwards = [], []

    def forward(self, call):
        self.calls.append(call)
        return call.run()

    def backward(self, call, backward, ctx, grads):
        self.backwards.append(call.cls)
        return backward(ctx, *grads)


class Keeps(Seen):
    """Asks for its backward: keeps something per application."""

    def forward(self, call):
        call.extra["kept"] = True
        return super().forward(call)


def _unhooked():
    return not any(n in FunctionMeta.__dict__ for n in ("forward", "setup_context", "backward",
                                                         "vjp"))


def test_every_application_is_seen_with_its_arguments_and_node():
    x = torch.ones(2, requires_grad=True)
    seen = Keeps()
    with hooked(seen):
        outs = [Old.apply(x), ALIAS(x, 3.0), New.apply(x, 4.0), ByVjp.apply(x)]
        sum(o.sum() for o in outs).backward()
    assert [c.cls for c in seen.calls] == [Old, New, New, ByVjp]
    # ctx is not an argument; defaults are bound, keywords moved to their positions
    assert [len(c.args) for c in seen.calls] == [2, 2, 2, 1]
    assert [c.ctx is o.grad_fn for c, o in zip(seen.calls, outs)] == [True] * 4
    assert sorted(c.__name__ for c in seen.backwards) == ["ByVjp", "New", "New", "Old"]
    assert torch.equal(x.grad, torch.full((2,), 12.0))  # values untouched by the hook
    assert _unhooked()


def test_a_hook_without_backward_keeps_nothing_per_application():
    x = torch.ones(2, requires_grad=True)
    seen = Seen()
    with hooked(seen):
        Old.apply(x).sum().backward()
    assert seen.backwards == [] and len(seen.calls) == 1


def test_the_metaclass_is_restored_when_the_forward_raises():
    class Boom(Hook):
        def forward(self, call):
            raise KeyError("user code failed")

    with pytest.raises(KeyError), hooked(Boom()):
        Old.apply(torch.ones(1))
    assert _unhooked()
    assert Old.forward.__name__ == "forward" and takes_ctx(Old) and not takes_ctx(New)


def test_bypassed_applications_are_unseen_and_torch_functions_pass_through():
    seen = Seen()
    x = torch.ones(2, requires_grad=True)
    with hooked(seen):
        with bypassed():
            Old.apply(x)
        torch.utils.checkpoint.checkpoint(lambda t: Old.apply(t), x, use_reentrant=True)
    # checkpointing's own Function is torch's; the user's Function inside it is seen
    assert [c.cls for c in seen.calls] == [Old]


def test_a_class_made_while_hooked_and_its_forward_assigned_work():
    seen = Seen()
    with hooked(seen):
        class Late(Old):
            pass

        Late.forward = staticmethod(lambda ctx, x: x + 1)  # through the property's setter
        out = Late.apply(torch.zeros(1, requires_grad=True))
    assert seen.calls[0].cls is Late and out.item() == 1.0
    assert "forward" in Late.__dict__ and _unhooked()


def test_keyword_arguments_reach_forward_by_name():
    class Keyword(Function):
        @staticmethod
        def forward(ctx, x, weight, *rest, scale=1.0, **extra):
            return x * weight * scale

        @staticmethod
        def backward(ctx, g):
            return g, g, None

    x = torch.ones(2, requires_grad=True)
    try:  # torch 2.4 and 2.6 refuse keywords in a classic Function's apply
        expected = Keyword.apply(x, weight=x * 2)
    except TypeError as exc:
        pytest.skip(f"this torch's apply refuses keyword arguments: {exc}")
    seen = Seen()
    with hooked(seen):
        got = Keyword.apply(x, weight=x * 2)
    assert torch.equal(got, expected) and len(seen.calls) == 1
    assert Keyword.forward.__name__ == "forward"


def test_a_keyword_only_default_not_passed_is_not_invented():
    class KeywordOnly(Function):
        @classmethod
        def forward(cls, ctx, x, *, k=3.0):
            return x * k

        @classmethod
        def backward(cls, ctx, g):
            return g * 3.0

    seen = Seen()
    with hooked(seen):
        out = KeywordOnly.apply(torch.ones(2, requires_grad=True))
    # re-applied from what was recorded, it must bind again: apply refuses keyword-only names
    assert seen.calls[0].kwargs == {} and torch.equal(out, torch.full((2,), 3.0))
    assert KeywordOnly.apply(*seen.calls[0].args, **seen.calls[0].kwargs).sum().item() == 6.0
