"""Every target gets a verdict (issue 57): a catalogue of modules and Functions a library
maintainer writes (a 0-d parameter, scalar, buffer-only, keyword-only, callable and dict
arguments) meets no internal error; one that cannot be set up is rejected with its reason and
the file's other targets are still checked; hints name -i only for tensor arguments."""

from __future__ import annotations

import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from gradtool.cli.main import main
from gradtool.targets.load import split_target

CATALOGUE = FIXTURES / "catalogue.py"


@pytest.fixture
def here(tmp_path, monkeypatch):
    shutil.copy(CATALOGUE, tmp_path / "catalogue.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_0d_parameter_is_checked(here):
    """Scale's only parameter is 0-d: it used to raise IndexError in infer.py (exit 3)."""
    result = run("check", "catalogue.py:Scale")
    assert result.exit_code == 0, result.output
    assert "PASS  catalogue.py:Scale   gradient" in result.output


def test_the_catalogue_gets_a_verdict_each(here):
    result = run("check", "catalogue.py", "--check", "contract", "--check", "gradient")
    assert result.exit_code == 2, result.output  # Odeint rejected; nothing is internal
    out = result.output
    for name in ("Scale", "ScalarArgs", "BufferOnly", "KeywordOnly", "CallableArg", "DictArg",
                 "Square"):
        assert f"PASS  catalogue.py:{name}   gradient" in out, name
    assert "FAIL  catalogue.py:BadSquare   gradient" in out
    assert "internal error" not in out and "Traceback" not in out
    # what cannot be inferred is rejected with its reason, beside the others' verdicts
    assert "REJECTED catalogue.py:Odeint" in out
    assert "func (a callable)" in out


def test_hints_name_tensor_arguments_only(here):
    """An ODE Function's apply(func, y0, t, method, options): no `-i 3x4` for func, method
    and options (the old hint repeated it for each of them)."""
    out = run("check", "catalogue.py:Odeint").output
    assert "func (a callable), method (a string), options (a dict)" in out, out
    assert "-i 3x4 -i 3x4" not in out
    assert "y0, t: tensors, e.g. -i 3x4" in out
    out = run("check", "catalogue.py:OdeMethod").output
    assert "method (a string), options (a dict)" in out, out
    assert "-i \"{}\"" in out
    given = run("check", "catalogue.py:OdeMethod", "-i", "3x4", "-i", "3x4", "-i", "'euler'",
                "-i", "{'scale': 2.0}", "--check", "gradient")
    assert "PASS  catalogue.py:OdeMethod   gradient" in given.output, given.output


def test_a_default_that_cannot_be_typed_is_not_pinned(here):
    """CallableArg's fn defaults to torch.tanh: its repr is no --input."""
    out = run("check", "catalogue.py:CallableArg", "--check", "gradient").output
    assert "built-in method" not in out.split("pin them with:")[-1].splitlines()[0], out


def test_pytest_separator_is_accepted(here):
    assert split_target("a/b.py::Name") == ("a/b.py", "Name")
    assert split_target("a/b.py::Outer::Inner") == ("a/b.py", "Outer.Inner")
    result = run("check", "catalogue.py::Square", "--check", "gradient")
    assert result.exit_code == 0, result.output
    assert "PASS  catalogue.py:Square   gradient" in result.output


def test_a_comma_shape_is_refused_naming_the_x_syntax(here):
    result = run("check", "catalogue.py:Square", "-i", "3,4")
    assert result.exit_code == 2, result.output
    assert "-i 3x4" in result.output and "nothing in its signature says it takes one" \
        in result.output
    # typed as a literal on purpose (-i =VALUE): passed as is, and the error names the syntax
    meant = run("check", "catalogue.py:Square", "-i", "=(3, 4)", "--check", "contract")
    assert meant.exit_code == 1 and "a tensor of that shape is -i 3x4" in meant.output, \
        meant.output


def test_a_tuple_is_taken_where_the_signature_says_so(tmp_path, monkeypatch):
    (tmp_path / "perm.py").write_text(
        "import torch\n"
        "def permute(x, dims: tuple = (1, 0)):\n"
        "    return x.permute(*dims) * 2\n")
    monkeypatch.chdir(tmp_path)
    result = run("check", "perm.py:permute", "-i", "3x4", "-i", "1,0", "--check", "gradient")
    assert result.exit_code == 0, result.output


def test_a_forward_failing_on_a_tuple_names_the_shape_syntax(tmp_path, monkeypatch):
    """Taken as a literal (the signature says it may be one), the tuple reaches forward, whose
    error names no 'tuple': the report still says what a tensor of that shape is."""
    (tmp_path / "dims.py").write_text(
        "import torch\n"
        "def scaled(x, dims: tuple = (3, 4)):\n"
        "    return x * float(dims)\n")
    monkeypatch.chdir(tmp_path)
    result = run("check", "dims.py:scaled", "-i", "3x4", "-i", "3,4", "--check", "contract")
    assert result.exit_code == 1, result.output
    assert "'dims' is the tuple (3, 4), given as a literal; a tensor of that shape is -i 3x4" \
        in result.output, result.output


def test_an_options_dict_given_as_a_value_is_one_argument():
    """torchdiffeq's OdeintAdjointMethod takes an options dict; given as values (gradtool.check,
    a traced call), it was flattened into one argument per key, and a correct backward (one
    gradient per argument) failed contract.gradient_count: a false alarm."""
    import torch

    import gradtool
    from conftest import load_fixture

    OdeMethod = load_fixture("catalogue").OdeMethod

    y0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    t = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    report = gradtool.check(OdeMethod, [y0, t, "euler", {"scale": 2.0, "norm": abs}],
                            checks=["contract", "gradient"])
    assert report.ok(), str(report)
    names = [i.name for i in report.targets[0].cases[0].inputs]
    assert names == ["y0", "t", "method", "options"], names


EITHER = '''import torch
def scaled(x, scale): return x * (scale(x) if callable(scale) else scale)
def attn(q, bias):
    if isinstance(bias, str) and bias == "causal": bias = torch.triu(torch.full((q.shape[-1],)*2, float("-inf")), 1)
    return torch.softmax(q @ q.transpose(-1, -2) + bias, -1)
def apply_fn(x, fn): return fn(x) * x
def declared(x, fn: "Callable"): return fn(x) * x
def early(x, act):
    if callable(act):
        return act(x)
    return x * act
'''


@pytest.fixture
def either(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text(EITHER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["scaled", "attn", "early"])
def test_an_argument_that_may_be_a_tensor_is_tried_as_one(either, name):
    """The reviewer's two (a tensor or a callable; a tensor or a mask's name): a use behind a
    callable()/isinstance() guard is no role, and a role read from the source is only a hint:
    both gave 4 passing checks before the roles were read, and "REJECTED ... (a callable)"
    after."""
    result = run("check", f"t.py::{name}")
    assert result.exit_code == 0, result.output
    assert "4 check(s): 4 passed" in result.output, result.output
    assert "REJECTED" not in result.output


def test_a_role_read_from_the_source_is_told_once_tensors_fail(either):
    """fn(x) with a tensor fn fails on every candidate: then the role is named, with the plain
    function's words (not 'the module that calls this Function')."""
    out = run("check", "t.py:apply_fn").output
    assert "REJECTED t.py:apply_fn" in out, out
    assert "fn (a callable)" in out, out
    assert re.search(r"forward refused \d+ tensor candidates \(last error: TypeError", out), out
    assert "this Function" not in out
    assert "check the module or function that calls apply_fn" in out, out


def test_an_annotation_decides_at_once(either, monkeypatch):
    """`fn: Callable` refuses before any candidate is built."""
    from gradtool.targets import infer

    built = []
    monkeypatch.setattr(infer, "build_case", lambda *a, **k: built.append(a) or 1 / 0)
    out = run("check", "t.py:declared").output
    assert "REJECTED t.py:declared" in out and "fn (a callable)" in out, out
    assert "tensor candidates" not in out and built == [], out


def test_guards_hide_only_the_uses_behind_them():
    import ast

    from gradtool.targets.roles import _walk

    def roles(source: str) -> dict[str, str]:
        found: dict[str, str] = {}
        tree = ast.parse(source)
        _walk(tree, frozenset(), found)
        return {k: v for k, v in found.items() if k in {a.arg for a in tree.body[0].args.args}}

    assert roles("def f(x, g):\n    return g(x) if callable(g) else x * g\n") == {}
    assert roles("def f(x, g):\n    if not callable(g):\n        return x * g\n"
                 "    return g(x)\n") == {}
    assert roles("def f(x, m):\n    if isinstance(m, str) and m == 'a':\n        m = x\n"
                 "    return x + m\n") == {}
    # outside the guard, a use still counts
    assert roles("def f(x, m, g):\n    if isinstance(m, str):\n        m = lookup[m]\n"
                 "    return g(x) + m(x)\n") == {"g": "a callable", "m": "a callable"}
    assert roles("def f(x, o):\n    return x * o.get('s', 1)\n") == {"o": "a dict"}
