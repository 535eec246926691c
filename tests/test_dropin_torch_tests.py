"""The drop-in's own versions of the tests torch's gradcheck runs beside the Jacobian
(dropin/torch_tests.py, dropin/batched.py: no private helper of torch.autograd.gradcheck) and the
calls the OpInfo suite found crashing or falsely failing (issue 56): each gives torch's own
function's outcome on the same call, and each test fails on its deliberately broken twin as
torch's does."""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch.autograd import Function

import gradtool
from test_dropin import Double, outcome

D, C = torch.float64, torch.complex128
DROPIN = pathlib.Path(gradtool.__file__).parent / "dropin"


def _x(*shape, dtype=D):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def _partial(dtype=D):
    return torch.randn(20, dtype=dtype)[:10].requires_grad_()


def _strided(t):
    return t.as_strided((2, 2), (1, 2), 10)


class ZeroGradOutputIgnored(Function):
    """2x whose backward answers ones where grad_output is all zero (right elsewhere)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 if bool(g.ne(0).any()) else torch.ones_like(g)


class Doubled(ZeroGradOutputIgnored):
    @staticmethod
    def backward(ctx, g):
        return g * 2


class ItemInBackward(Doubled):
    """2x whose backward reads a Python number from grad_output: no vmap over it."""

    @staticmethod
    def backward(ctx, g):
        return g * 2 + 0 * g.sum().item()


class ItemInJvp(Double):
    """2x whose jvp reads a Python number from its tangent: no vmap over forward AD."""

    @staticmethod
    def jvp(ctx, t):
        return t * 2 + 0 * t.sum().item()


FAST = {"check_batched_grad": True, "check_grad_dtypes": True, "fast_mode": True}
# name: (gradcheck or gradgradcheck, func, inputs maker, keywords)
CALLS = {
    "0-d input, fast mode, grad dtypes": (
        "gradcheck", torch.cosh,
        lambda: (torch.tensor(0.5, dtype=D, requires_grad=True),), FAST),
    "0-d input, slow mode": ("gradcheck", torch.cosh,
                             lambda: (torch.tensor(0.5, dtype=D, requires_grad=True),),
                             {"check_batched_grad": True, "check_grad_dtypes": True}),
    "complex b @ a": ("gradcheck", lambda a, b: b @ a,
                      lambda: (_x(5, 10, 5, dtype=C), _x(5, 10, dtype=C)), {}),
    "as_strided on a partial view": ("gradcheck", _strided, lambda: (_partial(),), {}),
    "as_strided on a partial view, fast": ("gradcheck", _strided, lambda: (_partial(),), FAST),
    "as_strided on a complex partial view": ("gradcheck", _strided,
                                             lambda: (_partial(C),), {}),
    "as_strided second order": ("gradgradcheck", lambda t: _strided(t) ** 2,
                                lambda: (_partial(),), {}),
    "gradgradcheck repeat complex": ("gradgradcheck", lambda t: t.repeat(2, 3),
                                     lambda: (_x(2, 3, dtype=C),), FAST),
    "gradgradcheck zero_ complex": ("gradgradcheck", lambda t: t.clone().zero_(),
                                    lambda: (_x(2, 3, dtype=C),), FAST),
    "gradgradcheck zero_ complex, slow": ("gradgradcheck", lambda t: t.clone().zero_(),
                                          lambda: (_x(2, 3, dtype=C),), {}),
    "gradgradcheck tile complex": ("gradgradcheck", lambda t: t.tile(2),
                                   lambda: (_x(2, 3, dtype=C),), FAST),
    "no differentiable output": ("gradcheck", lambda x: (x > 0).double(),
                                 lambda: (_x(2, 3),), {}),
    "no differentiable output, fast": ("gradcheck", lambda x: (x > 0).double(),
                                       lambda: (_x(2, 3),), {"fast_mode": True}),
    "no differentiable output, empty input": ("gradcheck", lambda x: (x > 0).double(),
                                              lambda: (_x(0, 3),), {}),
    "no differentiable output, complex": ("gradcheck", lambda z: (z.abs() > 0).to(C),
                                          lambda: (_x(2, 3, dtype=C),), {}),
    # broken twins: torch fails each, and so must the drop-in
    "an output not requiring grad that varies": ("gradcheck", lambda x: x.detach() * 2,
                                                 lambda: (_x(2, 3),), {}),
    "... in fast mode": ("gradcheck", lambda x: x.detach() * 2, lambda: (_x(2, 3),),
                         {"fast_mode": True}),
    "... complex": ("gradcheck", lambda z: z.detach() * 2, lambda: (_x(3, dtype=C),), {}),
    "backward not multiplied by grad_output": ("gradcheck", ZeroGradOutputIgnored.apply,
                                               lambda: (_x(3),), {"fast_mode": True}),
    "its twin": ("gradcheck", Doubled.apply, lambda: (_x(3),), {"fast_mode": True}),
    "backward not batchable": ("gradcheck", ItemInBackward.apply, lambda: (_x(3),),
                               {"check_batched_grad": True}),
    "backward not batchable, fast (the probe's backwards batched)": (
        "gradcheck", ItemInBackward.apply, lambda: (_x(3),), FAST),
    "its twin, fast": ("gradcheck", Doubled.apply, lambda: (_x(3),), FAST),
    "backward not batchable, unasked": ("gradcheck", ItemInBackward.apply,
                                        lambda: (_x(3),), {}),
    "jvp not batchable": ("gradcheck", ItemInJvp.apply, lambda: (_x(3),),
                          {"check_forward_ad": True, "check_batched_forward_grad": True}),
    "jvp not batchable, fast (the screen's jvp batched)": (
        "gradcheck", ItemInJvp.apply, lambda: (_x(3),),
        {"check_forward_ad": True, "check_batched_forward_grad": True, "fast_mode": True}),
    "its jvp twin": ("gradcheck", Double.apply, lambda: (_x(3),),
                     {"check_forward_ad": True, "check_batched_forward_grad": True}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_the_drop_in_gives_torchs_outcome(name):
    which, func, make, keywords = CALLS[name]
    torch.manual_seed(0)
    inputs = make()
    theirs = outcome(getattr(torch.autograd, which), func, inputs, **keywords)
    ours = outcome(getattr(gradtool, which), func, inputs, **keywords)
    assert ours[0] == theirs[0], (theirs, ours)
    if theirs[0] == "returned":
        assert ours[1] == theirs[1]


def test_the_function_runs_on_the_given_layout_only_where_it_differs():
    """A compact argument: the function judged is the user's own; a partial view: a wrapper
    that lays each value out as the given tensor, its storage's other elements as given."""
    from gradtool.dropin.given import laid_out

    def f(t):
        return t * 2

    assert laid_out(f, (_x(3),)) is f
    overlapping = torch.randn(10, dtype=D).as_strided((4, 3), (1, 1)).requires_grad_()
    assert laid_out(f, (overlapping,)) is f  # independent values cannot share its places
    view = _partial()
    wrapped = laid_out(f, (view,))
    assert wrapped is not f and wrapped.__name__ == "f"
    seen = []
    laid_out(lambda t: seen.append(t) or t, (view,))(torch.ones(10, dtype=D))
    assert seen[0].storage_offset() == view.storage_offset() == 0
    assert seen[0].untyped_storage().nbytes() == view.untyped_storage().nbytes()
    assert torch.equal(seen[0].as_strided((10,), (1,), 10), view.as_strided((10,), (1,), 10))


def test_no_private_helper_of_torchs_gradcheck_is_called():
    """The drop-in's tests are its own, on torch's public API (its private helpers' names and
    signatures change between releases): only GradcheckError is read from the module."""
    for path in DROPIN.glob("*.py"):
        text = path.read_text()
        assert "gradcheck._" not in text and '"torch.autograd.gradcheck"]' not in text, path
        for line in text.splitlines():
            if "from torch.autograd.gradcheck import" in line:
                assert line.split("import")[1].strip() == "GradcheckError", (path, line)


def test_an_exception_in_gradtools_own_code_is_its_internal_error(monkeypatch):
    """Never re-raised as if the checked code raised it; it says it is gradtool's."""
    from gradtool.dropin import functions
    from gradtool.errors import InternalError

    monkeypatch.setattr(functions, "_settings", lambda *args: {})  # gradtool then fails
    with pytest.raises(InternalError, match="bug in gradtool.*KeyError.*\n.*report it"):
        gradtool.gradcheck(torch.sin, (_x(3),))


class BackwardRaises(Doubled):
    @staticmethod
    def backward(ctx, g):
        raise ValueError("the user's backward")


@pytest.mark.parametrize("func, inputs, error", [
    (lambda x: x.reshape(7), lambda: (_x(3),), RuntimeError),  # a torch op of the user's
    (torch.mm, lambda: (_x(2, 3), _x(2, 3)), RuntimeError),  # a builtin as forward
    (BackwardRaises.apply, lambda: (_x(3),), ValueError),  # the user's backward
])
@pytest.mark.parametrize("keywords", [{}, FAST], ids=["slow", "fast"])
def test_the_checked_codes_exceptions_propagate_unchanged(func, inputs, error, keywords):
    from gradtool.errors import InternalError

    args = inputs()
    with pytest.raises(error) as theirs:
        torch.autograd.gradcheck(func, args, **keywords)
    with pytest.raises(error) as ours:
        gradtool.gradcheck(func, args, **keywords)
    assert not isinstance(ours.value, InternalError)
    assert type(ours.value) is type(theirs.value)


def test_a_builtin_raising_on_a_partial_view_is_the_users():
    """A builtin's exception on a partial view propagates as it is (the drop-in's call sites of
    the checked code, the layout wrapper of dropin/given.py among them, are marked)."""
    from gradtool.errors import InternalError

    view = _partial()
    with pytest.raises(RuntimeError) as raised:
        gradtool.gradcheck(torch.Tensor.view, (view, (3, 7)))
    assert not isinstance(raised.value, InternalError)
