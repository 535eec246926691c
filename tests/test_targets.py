"""Target resolution: strings, files, modules, discovery, the Function styles, bad targets."""

from __future__ import annotations

import sys

import pytest

from conftest import EXAMPLES, FIXTURES
from gradtool.errors import TargetError
from gradtool.targets.kinds import CALLABLE, FUNCTION
from gradtool.targets.load import split_target
from gradtool.targets.resolve import make_target, resolve


def test_split_target():
    assert split_target("a/b.py:Name") == ("a/b.py", "Name")
    assert split_target("pkg.mod:Outer.Inner") == ("pkg.mod", "Outer.Inner")
    assert split_target("pkg.mod") == ("pkg.mod", None)


def test_both_function_styles():
    combined, setup = (resolve(f"{EXAMPLES}/linear.py:{n}")[0]
                       for n in ("LinearFunction", "LinearFunctionSetup"))
    assert combined.kind is setup.kind is FUNCTION
    assert combined.arg_names == setup.arg_names == ("input", "weight", "bias")
    assert combined.source.endswith("linear.py:19")  # its backward


def test_file_is_registered_in_sys_modules_before_running(tmp_path):
    module = tmp_path / "dc_user.py"
    module.write_text(
        "import dataclasses, torch\n"
        "@dataclasses.dataclass\nclass Cfg:\n    k: float = 2.0\n"
        "def double(x):\n    return x * Cfg().k\n")
    target = resolve(f"{module}:double")[0]
    assert target.kind is CALLABLE
    assert "dc_user" in sys.modules


def test_discovery_skips_imported_classes():
    names = {t.name.split(":")[1] for t in resolve(f"{EXAMPLES}/elementwise.py")}
    assert names == {"F", "LayerWithCustomGrad"}  # not nn.Module or Function themselves


def test_once_differentiable_is_detected():
    target = resolve(f"{FIXTURES}/contract_cases.py:CubeOnce")[0]
    assert target.once_differentiable
    assert not resolve(f"{FIXTURES}/contract_cases.py:Square")[0].once_differentiable


def test_apply_alias_is_its_function(contract_cases):
    target = make_target(contract_cases.Square.apply, "sq")
    assert target.kind is FUNCTION and target.obj is contract_cases.Square


@pytest.mark.parametrize("text, phrase", [
    ("no_such_module_xyz:F", "cannot import module 'no_such_module_xyz'"),
    ("missing/file.py:F", "file not found"),
    (f"{EXAMPLES}/linear.py:LinearFuncton", "did you mean 'LinearFunction'?"),
    (f"{EXAMPLES}/linear.py:torch", "not something gradtool can check"),
])
def test_bad_targets(text, phrase):
    with pytest.raises(TargetError) as info:
        resolve(text)
    assert phrase in str(info.value)


def test_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "broken_syntax.py"
    bad.write_text("import torch\n\ndef f(x:\n    return x\n")
    with pytest.raises(TargetError, match=r"syntax error in .*broken_syntax.py:3"):
        resolve(f"{bad}:f")
