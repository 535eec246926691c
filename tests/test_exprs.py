"""expr targets: the allow-list computes what torch computes, and everything else is refused."""

from __future__ import annotations

import inspect
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.errors import SpecError
from gradtool.spec.exprs import compile_expr


def _spd(n: int) -> torch.Tensor:
    a = torch.randn(n, n, dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


X = torch.randn(3, 4, dtype=torch.float64)
Y = torch.rand(3, 4, dtype=torch.float64) + 0.5
A = _spd(3)

EVALUATED = [
    ("0.5 * (5 * x**3 - 3 * x)", ["x"], (X,), 0.5 * (5 * X**3 - 3 * X)),
    ("torch.sin(x) + exp(y) - log(y) / sqrt(y)", ["x", "y"], (X, Y),
     torch.sin(X) + torch.exp(Y) - torch.log(Y) / torch.sqrt(Y)),
    ("-x // 2 + x % 3 + (+y)", ["x", "y"], (X, Y), -X // 2 + X % 3 + Y),
    ("x @ y.T", ["x", "y"], (X, Y), X @ Y.T),
    ("torch.matmul(x, y.mT)", ["x", "y"], (X, Y), X @ Y.mT),
    ("torch.softmax(x, dim=-1)", ["x"], (X,), torch.softmax(X, dim=-1)),
    ("softplus(x) * sigmoid(x) + tanh(x)", ["x"], (X,),
     torch.nn.functional.softplus(X) * torch.sigmoid(X) + torch.tanh(X)),
    ("torch.linalg.cholesky(0.5 * (a + a.mT))", ["a"], (A,), torch.linalg.cholesky(A)),
    ("cholesky(a)", ["a"], (A,), torch.linalg.cholesky(A)),
    ("torch.linalg.det(a) + torch.logdet(a)", ["a"], (A,), torch.linalg.det(A) + torch.logdet(A)),
    ("torch.linalg.slogdet(a)[1]", ["a"], (A,), torch.linalg.slogdet(A)[1]),
    ("x.sum(dim=0, keepdim=True).mean()", ["x"], (X,), X.sum(dim=0, keepdim=True).mean()),
    ("x[0] * x[:, 1:3].sum() + x[..., -1].prod()", ["x"], (X,),
     X[0] * X[:, 1:3].sum() + X[..., -1].prod()),
    ("torch.where(x > 0, x, 2 * x)", ["x"], (X,), torch.where(X > 0, X, 2 * X)),
    ("torch.stack([x, y], dim=0).cumsum(dim=1)", ["x", "y"], (X, Y),
     torch.stack([X, Y]).cumsum(dim=1)),
    ("torch.atan2(x, y) * torch.pi", ["x", "y"], (X, Y), torch.atan2(X, Y) * torch.pi),
    ("x ** 2 ** 2", ["x"], (X,), X ** 4),
    ("x.reshape(4, 3).t().clamp(min=-1, max=1)", ["x"], (X,), X.reshape(4, 3).t().clamp(-1, 1)),
    ("x * 1e-3 + 2j * 0 + True", ["x"], (X,), X * 1e-3 + 1),
]


@pytest.mark.parametrize(("text", "names", "args", "expected"), EVALUATED,
                         ids=[e[0] for e in EVALUATED])
def test_allowed_expressions_compute_what_torch_computes(text, names, args, expected):
    result = compile_expr(text, names)(*args)
    torch.testing.assert_close(result, expected.to(result.dtype) if result.is_complex() else
                               expected)


def test_the_callable_has_a_signature_and_keeps_the_graph():
    fn = compile_expr("x * sin(y)", ["x", "y"])
    assert list(inspect.signature(fn).parameters) == ["x", "y"]
    assert fn.__name__ == "expr" and repr(fn) == "expr('x * sin(y)')"
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)
    (gx, gy) = torch.autograd.grad(fn(x, y=y).sum(), (x, y))
    torch.testing.assert_close(gx, torch.sin(y))
    torch.testing.assert_close(gy, x * torch.cos(y))


def test_it_works_under_vmap():
    fn = compile_expr("torch.softmax(x, dim=-1) * w", ["x", "w"])
    xs, w = torch.randn(5, 4), torch.randn(4)
    out = torch.func.vmap(fn, in_dims=(0, None))(xs, w)
    torch.testing.assert_close(out, torch.softmax(xs, dim=-1) * w)


REFUSED = [
    # attribute access outside torch / the allow-list
    ("x.__class__", "'__class__': names starting with an underscore"),
    ("x.__class__.__bases__[0].__subclasses__()", "'__subclasses__': names starting with an "
     "underscore"),
    ("x.grad_fn", "attribute .grad_fn is not allowed in an expr"),
    ("x.data", "attribute .data is not allowed in an expr"),
    ("x.numpy()", "method .numpy() is not allowed in an expr"),
    ("x.add_(1)", "method .add_() is not allowed in an expr"),
    ("x.expand(10**6, 10**6).sum()", "method .expand() is not allowed"),
    ("os.system('ls')", "unknown name 'os': an expr reaches no module but torch"),
    ("np.sin(x)", "unknown name 'np': an expr reaches no module but torch"),
    ("torch.load(x)", "'torch.load' is not an allowed function in an expr"),
    ("torch.hub.load(x)", "'torch.hub.load' is not an allowed function in an expr"),
    ("torch.ops.aten.sin(x)", "'torch.ops.aten.sin' is not an allowed function"),
    ("torch.float64", "'torch.float64' is not an allowed value"),
    ("torch._C._nn.gelu(x)", "'_C': names starting with an underscore"),
    ("torch.sin(x).__class__", "'__class__': names starting with an underscore"),
    ("getattr(x, 'grad')", "'getattr' is not an allowed function in an expr"),
    ("eval('1')", "'eval' is not an allowed function in an expr"),
    ("open('/etc/passwd')", "'open' is not an allowed function in an expr"),
    ("x(1)", "input 'x' is a value, not a function"),
    ("(lambda: x)()", "only named torch functions can be called in an expr"),
    # lambdas, dunders, imports, comprehensions and other syntax
    ("lambda: x", "a lambda is not allowed in an expr"),
    ("__import__('os').system('ls')", "'__import__': names starting with an underscore"),
    ("__builtins__", "'__builtins__': names starting with an underscore"),
    ("import os", "'import os' is a statement (import, assignment, ...)"),
    ("from os import system", "is a statement (import, assignment, ...)"),
    ("y = x", "'y = x' is a statement"),
    ("[v for v in x]", "a comprehension is not allowed in an expr"),
    ("sum(v for v in x)", "a generator expression is not allowed in an expr"),
    ("(y := x)", "an assignment (:=) is not allowed in an expr"),
    ("x if x else x", "a conditional (use torch.where) is not allowed in an expr"),
    ("x and x", "and/or (use & and | on comparisons, or torch.where) is not allowed"),
    ("f'{x}'", "an f-string is not allowed in an expr"),
    ("{'a': x}", "a dict is not allowed in an expr"),
    ("sin(*[x])", "a starred argument is not allowed in an expr"),
    ("x.sum(**{'dim': 0})", "**kwargs is not allowed in an expr"),
    ("x.sum(out=x)", "keyword argument out= is not allowed in an expr"),
    ("x << 2", "operator LShift is not allowed in an expr"),
    ("not x", "`not` is not allowed in an expr"),
    ("0 < x < 1", "only single comparisons"),
    ("x + 'a'", "constant 'a' is not allowed in an expr"),
    ("x[...] + y", "unknown name 'y'"),
    ("sin", "'sin' is a function; call it, e.g. sin(x)"),
    ("sine(x)", "'sine' is not an allowed function in an expr"),
    ("1 + 2", "expression '1 + 2' uses none of the inputs (x)"),
    ("exp(x", "'exp(x' is not a valid expression: '(' was never closed"),
    ("", "expected a non-empty expression string, got ''"),
    ("x" + " + x" * 1000, "characters long; at most 2000"),
    ("(" * 300 + "x" + ")" * 300, "too many nested parentheses"),
    ("-" * 100 + "x", "nested more than 60 levels deep"),
    ("x" + "+x" * 400, "syntax nodes; at most 500"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_everything_outside_the_allow_list_is_refused(text: str, message: str):
    with pytest.raises(SpecError) as info:
        compile_expr(text, ["x"])
    assert message in str(info.value)


@pytest.mark.parametrize(("names", "message"), [
    (["torch"], "input name 'torch' is reserved"),
    (["sin"], "input name 'sin' is reserved"),
    (["__x__"], "input name '__x__' is reserved"),
    (["class"], "input name 'class' cannot be used in an expr"),
    (["a b"], "input name 'a b' cannot be used in an expr"),
])
def test_input_names_that_would_shadow_or_break_are_refused(names, message):
    with pytest.raises(SpecError, match=message):
        compile_expr("1", names)


def test_hints_suggest_the_allowed_spelling():
    with pytest.raises(SpecError) as info:
        compile_expr("torch.sine(x)", ["x"])
    assert info.value.hint == "did you mean 'torch.sin'?"
    with pytest.raises(SpecError) as info:
        compile_expr("x.summ()", ["x"])
    assert info.value.hint == "did you mean 'sum'?"


@pytest.mark.parametrize(("text", "error"), [
    ("x * 10 ** 10 ** 10", OverflowError),       # a Python-int tower would never finish
    ("torch.cat([x] * 10 ** 9)", TypeError),      # a billion-item list is never built
    ("x.sum(dim=(0,) * 10 ** 9)", TypeError),
])
def test_runaway_evaluation_stops_at_once(text, error):
    fn = compile_expr(text, ["x"])
    start = time.perf_counter()
    with pytest.raises(error):
        fn(torch.ones(2))
    assert time.perf_counter() - start < 1.0


@settings(max_examples=300, deadline=1000)
@given(st.lists(st.sampled_from(list("xy()[]{}.,:*+-/@%<>=!~&|^'\"_ 0123456789eajT\\")
                               + ["torch", "sin", "lambda", "__class__", "import", "sum", "mT",
                                  "linalg", "for", "in", "if", "dim="]), max_size=40).map("".join))
def test_fuzz_compile_raises_only_spec_errors(text: str):
    try:
        compile_expr(text, ["x", "y"])
    except SpecError:
        pass
