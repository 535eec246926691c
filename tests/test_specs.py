"""Spec files: every invalid spec names file:line, key path, bad value; the bundled specs load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradtool.config.settings import DTYPES
from gradtool.errors import SpecError
from gradtool.targets.inputs import Domain, LiteralSpec, TensorSpec
from gradtool.spec.values import TENSOR_DTYPES
from gradtool.spec.schema import (Spec, SpecFileError, find_spec_files, load_file, load_text,
                            resolve_reference)
from gradtool.spec.surrogates import ScaleSurrogate

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "specs"   # holds ops.py: Double, double_grad, scale


def load(text: str) -> list[Spec]:
    return load_text(text, "a.yaml", FIXTURES)


def spec_file(*lines: str) -> str:
    """A file whose one spec starts at line 3 with the given lines (indented under `specs:`)."""
    return "version: 1\nspecs:\n" + "".join(f"  {line}\n" for line in lines)


X = "inputs: [{name: x, shape: [3]}]"

# (spec file text, the first error exactly as reported, a hint fragment or None)
INVALID = [
    # --- the file itself -------------------------------------------------------------------
    ("", "a.yaml:1: a spec file is a mapping with version: 1 and specs: [...], got None", None),
    ("- 1\n- 2\n", "a.yaml:1: a spec file is a mapping with version: 1 and specs: [...], "
     "got [1, 2]", None),
    ("specs:\n  - {target: ops.py:Double}\n", "a.yaml:1: missing version: 1 (the spec format "
     "version)", None),
    ("version: 2\nspecs: [{target: ops.py:Double}]\n", "a.yaml:1: version: unsupported format "
     "version 2; this gradtool reads version 1", None),
    ("version: 1\nspecs: {target: ops.py:Double}\n", "a.yaml:2: specs: expected a non-empty list "
     "of specs, got {'target': 'ops.py:Double'}", None),
    ("version: 1\nspecs: [{target: ops.py:Double}]\nspec: []\n", "a.yaml:3: spec: unknown key "
     "'spec'; allowed: version, specs", "did you mean 'specs'?"),
    ("version: 1\nversion: 1\n", "a.yaml:2: duplicate key 'version' (first at line 1)", None),
    ("version: 1\n---\nversion: 1\n", "a.yaml:2: a spec file holds one YAML document; list several"
     " specs under `specs:` instead of separating documents with ---", None),
    ("version: !!python/object/apply:os.system [ls]\n", "a.yaml:1: unsupported YAML tag "
     "'tag:yaml.org,2002:python/object/apply:os.system'; use a plain list", None),
    # --- spec keys ---------------------------------------------------------------------------
    (spec_file("- target: ops.py:Double", "  atoll: 1.0e-5"),
     "a.yaml:4: specs[0].atoll: unknown key 'atoll'; allowed: name, target, expr, init, inputs, "
     "kwargs, inputs_from, cases, seed, dtype, device, eps, atol, rtol, nondet_tol, mode, checks, "
     "reference, autocast, timeout, ignore, masked, tolerances, xfail, surrogate, trust_callable, "
     "op, import, sweep",
     "did you mean 'atol'?"),
    (spec_file("- name: both", "  target: ops.py:Double", "  expr: x", f"  {X}"),
     "a.yaml:3: specs[0]: give exactly one of target: (file.py:Name or module:Name), op: or "
     "expr:",
     None),
    (spec_file("- name: neither"), "a.yaml:3: specs[0]: give exactly one of target: "
     "(file.py:Name or module:Name), op: or expr:", None),
    (spec_file("- 42"), "a.yaml:3: specs[0]: expected a mapping with target: or expr:, got 42",
     None),
    (spec_file("- {target: ops.py:Double}", "- {target: ops.py:Double}"),
     "a.yaml:4: name: duplicate spec name 'Double' (first at line 3); give one of them a "
     "different name:", None),
    # --- targets: refused without importing ----------------------------------------------------
    (spec_file("- target: os:system"), "a.yaml:3: specs[0].target: 'os:system': the name 'system'"
     " is refused (dunder names and names such as eval, exec, open, system, load are never a "
     "gradient to check)", None),
    (spec_file("- target: os.path:join"), "a.yaml:3: specs[0].target: 'os.path:join': module 'os' "
     "is refused: a target comes from the spec's folder or an installed package, never the "
     "standard library (os, sys, subprocess, builtins, ...)", None),
    (spec_file("- target: builtins:print"), "a.yaml:3: specs[0].target: 'builtins:print': module "
     "'builtins' is refused: a target comes from the spec's folder or an installed package, never "
     "the standard library (os, sys, subprocess, builtins, ...)", None),
    (spec_file("- target: torch.hub:list"), "a.yaml:3: specs[0].target: 'torch.hub:list': module "
     "'torch.hub' is refused: it loads or runs code or files, and a spec must not reach it", None),
    (spec_file("- target: mylib.__main__:foo"), "a.yaml:3: specs[0].target: "
     "'mylib.__main__:foo': dunder modules (names starting with __) are refused", None),
    (spec_file("- target: torch._inductor.codecache:foo"), "a.yaml:3: specs[0].target: "
     "'torch._inductor.codecache:foo': module 'torch._inductor' is refused: it loads or runs "
     "code or files, and a spec must not reach it", None),
    (spec_file("- target: ops.py:__class__"), "a.yaml:3: specs[0].target: 'ops.py:__class__': the"
     " name '__class__' is refused (dunder names and names such as eval, exec, open, system, load "
     "are never a gradient to check)", None),
    (spec_file("- target: Double"), "a.yaml:3: specs[0].target: expected 'file.py:Name' or "
     "'module:Name', got 'Double'", "relative to the spec file's folder"),
    (spec_file("- target: ops.py:Doubel"), "a.yaml:3: specs[0].target: 'ops.py' defines no "
     "'Doubel'", "did you mean 'Double'?"),
    (spec_file("- target: missing.py:F"), f"a.yaml:3: specs[0].target: file 'missing.py' not "
     f"found in '{FIXTURES}'", None),
    (spec_file("- target: ../broken_surrogates.py:RoundNoSTE"), "a.yaml:3: specs[0].target: "
     f"'../broken_surrogates.py' lies outside the spec's folder '{FIXTURES}'; a spec may only name "
     "Python files in its own folder (or below)", None),
    (spec_file("- target: /usr/lib/python3/os.py:system"), "a.yaml:3: specs[0].target: "
     "'/usr/lib/python3/os.py:system': the name 'system' is refused (dunder names and names such "
     "as eval, exec, open, system, load are never a gradient to check)", None),
    (spec_file("- target: /tmp/ops.py:Double"), "a.yaml:3: specs[0].target: '/tmp/ops.py' is an "
     "absolute path; write it relative to the spec's folder", None),
    # --- exprs -------------------------------------------------------------------------------
    (spec_file("- expr: x.__class__", f"  {X}"), "a.yaml:3: specs[0].expr: '__class__': names "
     "starting with an underscore (dunders, private attributes) are refused in an expr", None),
    (spec_file("- expr: os.system('ls')", f"  {X}"), "a.yaml:3: specs[0].expr: unknown name "
     "'os': an expr reaches no module but torch, and attributes only of its inputs", None),
    (spec_file("- expr: torch.load(x)", f"  {X}"), "a.yaml:3: specs[0].expr: 'torch.load' is not "
     "an allowed function in an expr", None),
    (spec_file("- expr: 'lambda: x'", f"  {X}"), "a.yaml:3: specs[0].expr: a lambda is not "
     "allowed in an expr", None),
    (spec_file("- expr: __import__('os').system('ls')", f"  {X}"), "a.yaml:3: specs[0].expr: "
     "'__import__': names starting with an underscore (dunders, private attributes) are refused "
     "in an expr", None),
    (spec_file("- expr: import os", f"  {X}"), "a.yaml:3: specs[0].expr: 'import os' is a "
     "statement (import, assignment, ...); an expr is a single expression", None),
    (spec_file("- expr: x * y", f"  {X}"), "a.yaml:3: specs[0].expr: unknown name 'y'; an expr "
     "may use its inputs (x) and allowed torch functions", None),
    (spec_file("- expr: sin(x)"), "a.yaml:3: specs[0].expr: an expr needs inputs:, each with a "
     "name: for the variable it is", None),
    (spec_file("- expr: x", "  init: {size: 3}", f"  {X}"), "a.yaml:4: specs[0].init: init: "
     "applies to a target:, not to an expr", None),
    # --- inputs ------------------------------------------------------------------------------
    (spec_file("- target: ops.py:Double", "  inputs:", "    - {name: x, shape: [3]}",
               "    - name: y", "      shape: 3x"),
     "a.yaml:7: specs[0].inputs[1].shape: expected a list of non-negative integers such as "
     "[3, 4] ([] for a 0-d tensor), got '3x'", None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [3, -1]}]"),
     "a.yaml:4: specs[0].inputs[0].shape: expected a list of non-negative integers such as "
     "[3, 4] ([] for a 0-d tensor), got [3, -1]", None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [3], domain: positiv}]"),
     "a.yaml:4: specs[0].inputs[0].domain: expected a domain (real, positive, negative, nonzero, "
     "sym, spd, simplex, integer), [lo, hi] with lo < hi, or {integer: [lo, hi]}, got 'positiv'",
     "did you mean 'positive'?"),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [3], domain: [1, 0]}]"),
     "a.yaml:4: specs[0].inputs[0].domain: expected a domain (real, positive, negative, nonzero, "
     "sym, spd, simplex, integer), [lo, hi] with lo < hi, or {integer: [lo, hi]}, got [1, 0]",
     None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [3], dtype: float63}]"),
     f"a.yaml:4: specs[0].inputs[0].dtype: expected a dtype ({', '.join(TENSOR_DTYPES)}), got "
     "'float63'",
     "did you mean 'float64'?"),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: a, shape: [3, 2], domain: spd}]"),
     "a.yaml:4: specs[0].inputs[0]: domain spd needs a square matrix shape (..., n, n), got (3, 2)",
     None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [10000, 10000]}]"),
     "a.yaml:4: specs[0].inputs[0]: shape [10000, 10000] has 100000000 elements; a spec input may "
     "have at most 1000000", None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x}]"),
     "a.yaml:4: specs[0].inputs[0]: missing shape: (a tensor) or value: (a literal)", None),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: c, value: 5, shape: [3]}]"),
     "a.yaml:4: specs[0].inputs[0].shape: a literal input takes only name: and value:, not "
     "shape:", None),
    (spec_file("- target: ops.py:Double", "  inputs: [{shape: [3]}]"),
     "a.yaml:4: specs[0].inputs[0]: an input is {name: x, shape: [3, 4], ...}, {name: c, value: "
     "5} or a one-key shorthand {x: '3x4:positive'}; got {'shape': [3]}", "add name:"),
    (spec_file("- target: ops.py:Double", "  inputs: [{name: x, shape: [3], requires_grad: 1}]"),
     "a.yaml:4: specs[0].inputs[0].requires_grad: expected true or false, got 1", None),
    (spec_file("- target: ops.py:Double", "  inputs:", "    - x: 3x3:postive"),
     "a.yaml:5: specs[0].inputs[0].x: '3x3:postive': unknown option 'postive'",
     "did you mean 'positive'?"),
    (spec_file("- target: ops.py:Double", "  inputs: [{x: [3]}, {x: [4]}]"),
     "a.yaml:4: specs[0].inputs[1]: duplicate input name 'x'", None),
    (spec_file("- target: ops.py:Double", "  inputs: {x: [3]}"),
     "a.yaml:4: specs[0].inputs: expected a list of inputs, one per forward argument in order, "
     "got {'x': [3]}", None),
    # --- cases -------------------------------------------------------------------------------
    (spec_file("- target: ops.py:Double", f"  {X}", "  cases:", "    - inputs: {y: [4]}"),
     "a.yaml:6: specs[0].cases[0].inputs.y: no input named 'y'; the spec's inputs are ['x']",
     None),
    (spec_file("- target: ops.py:Double", f"  {X}", "  cases:", "    - {name: a, sed: 1}"),
     "a.yaml:6: specs[0].cases[0].sed: unknown key 'sed'; allowed: name, seed, inputs",
     "did you mean 'seed'?"),
    (spec_file("- target: ops.py:Double", "  cases: [{name: a}]"),
     "a.yaml:4: specs[0].cases[0]: this case has no inputs: and the spec declares none", None),
    (spec_file("- expr: x * 2", f"  {X}", "  cases:", "    - {name: a}",
               "    - {name: b, inputs: [{name: z, shape: [3]}]}"),
     "a.yaml:7: specs[0].cases[1]: inputs named ['z'], but the first case has ['x']; every case "
     "takes the same arguments", None),
    # --- settings ----------------------------------------------------------------------------
    (spec_file("- target: ops.py:Double", "  seed: -1"),
     "a.yaml:4: specs[0].seed: expected a non-negative integer, got -1", None),
    (spec_file("- target: ops.py:Double", "  seed: true"),
     "a.yaml:4: specs[0].seed: expected a non-negative integer, got True", None),
    (spec_file("- target: ops.py:Double", "  atol: -1.0e-5"),
     "a.yaml:4: specs[0].atol: expected a non-negative number such as 1.0e-6, got -1e-05", None),
    (spec_file("- target: ops.py:Double", "  eps: 0"),
     "a.yaml:4: specs[0].eps: expected a positive number such as 1.0e-6, got 0", None),
    (spec_file("- target: ops.py:Double", "  rtol: .nan"),
     "a.yaml:4: specs[0].rtol: expected a non-negative number such as 1.0e-6, got nan", None),
    (spec_file("- target: ops.py:Double", "  dtype: float"),
     f"a.yaml:4: specs[0].dtype: expected one of {', '.join(DTYPES)}, got 'float'", None),
    (spec_file("- target: ops.py:Double", "  device: gpu"),
     "a.yaml:4: specs[0].device: expected a device such as cpu, cuda or cuda:1, got 'gpu'", None),
    (spec_file("- target: ops.py:Double", "  mode: fast"),
     "a.yaml:4: specs[0].mode: expected one of auto, full, probe, got 'fast'", None),
    (spec_file("- target: ops.py:Double", "  checks: [gradient, gradiant]"),
     "a.yaml:4: specs[0].checks[1]: unknown check 'gradiant'; checks are contract, gradient, "
     "double_backward, forward_ad, vmap, complex, compiled, op_schema, op_fake, op_autograd, "
     "op_compiled, layout", "did you mean 'gradient'?"),
    (spec_file("- target: ops.py:Double", "  checks: []"),
     "a.yaml:4: specs[0].checks: expected a list of checks among contract, gradient, "
     "double_backward, forward_ad, vmap, complex, compiled, op_schema, op_fake, op_autograd, "
     "op_compiled, layout, got []", None),
    (spec_file("- target: ops.py:Double", "  tolerances:", "    gradiend: {atol: 1.0e-4}"),
     "a.yaml:5: specs[0].tolerances.gradiend: unknown key 'gradiend'; allowed: contract, gradient, "
     "double_backward, forward_ad, vmap, complex, compiled, op_schema, op_fake, op_autograd, "
     "op_compiled, layout", "did you mean 'gradient'?"),
    (spec_file("- target: ops.py:Double", "  tolerances:", "    gradient: {atl: 1.0e-4}"),
     "a.yaml:5: specs[0].tolerances.gradient.atl: unknown key 'atl'; allowed: eps, atol, rtol, "
     "nondet_tol", "did you mean 'atol'?"),
    (spec_file("- target: ops.py:Double", "  tolerances:", "    gradient:", "      atol: big"),
     "a.yaml:6: specs[0].tolerances.gradient.atol: expected a non-negative number such as "
     "1.0e-6, got 'big'", None),
    (spec_file("- target: ops.py:Double", "  checks: [contract]", "  xfail:",
               "    gradient: broken on purpose"),
     "a.yaml:6: specs[0].xfail.gradient: check 'gradient' is expected to fail but is not run "
     "(checks: ['contract'])", None),
    (spec_file("- target: ops.py:Double", "  xfail: {gradient: ''}"),
     "a.yaml:4: specs[0].xfail.gradient: expected the reason as a non-empty string, got ''", None),
    (spec_file("- target: ops.py:Double", "  xfail: [gradient]"),
     "a.yaml:4: specs[0].xfail: expected a mapping of check name to the reason it fails, got "
     "['gradient']", None),
    (spec_file("- target: ops.py:Double", "  init: 3"),
     "a.yaml:4: specs[0].init: expected a mapping of keyword arguments or a list of positional "
     "arguments, got 3", None),
    # --- surrogates --------------------------------------------------------------------------
    (spec_file("- target: ops.py:Double", "  surrogate: straight"),
     "a.yaml:4: specs[0].surrogate.kind: expected one of identity, scale, clipped_identity, "
     "oracle, got 'straight'", None),
    (spec_file("- target: ops.py:Double", "  surrogate:", "    kind: scale"),
     "a.yaml:4: specs[0].surrogate.factor: expected a finite number, got None", None),
    (spec_file("- target: ops.py:Double", "  surrogate:", "    kind: scale", "    factr: -1"),
     "a.yaml:6: specs[0].surrogate.factr: unknown key for a scale surrogate; allowed: kind, "
     "factor, inputs", "did you mean 'factor'?"),
    (spec_file("- target: ops.py:Double", "  surrogate:", "    kind: clipped_identity",
               "    range: [1, -1]"),
     "a.yaml:6: specs[0].surrogate.range: expected lo < hi, got [1, -1]", None),
    (spec_file("- target: ops.py:Double", f"  {X}", "  surrogate:", "    kind: identity",
               "    inputs: [y]"),
     "a.yaml:7: specs[0].surrogate.inputs: expected input names (x) or argument positions "
     "0, 1, ..., got 'y'", None),
    (spec_file("- target: ops.py:Double", "  surrogate:", "    kind: oracle",
               "    oracle: builtins:eval"),
     "a.yaml:6: specs[0].surrogate.oracle: 'builtins:eval': the name 'eval' is refused (dunder "
     "names and names such as eval, exec, open, system, load are never a gradient to check)",
     None),
    (spec_file("- target: ops.py:Double", "  surrogate: {kind: oracle}"),
     "a.yaml:4: specs[0].surrogate.oracle: an oracle surrogate needs oracle: 'file.py:name' or "
     "'module:name'", None),
]


@pytest.mark.parametrize(("text", "expected", "hint"), INVALID,
                         ids=[f"{i:02d}" for i in range(len(INVALID))])
def test_invalid_spec_reports_file_line_key_and_value(text: str, expected: str, hint: str | None):
    with pytest.raises(SpecError) as info:
        load(text)
    first = info.value.errors[0] if isinstance(info.value, SpecFileError) else info.value
    assert str(first).splitlines()[0] == expected
    if hint is not None:
        assert hint in (first.hint or "")


@pytest.mark.parametrize(("text", "line"), [
    ("version: 1\nspecs: [\n", 3), ("version: 1\nspecs:\n  - a: b: c\n", 3),
    ("version: 1\n\tspecs: []\n", 2), ("version: 1\nspecs: *nowhere\n", 2),
])
def test_yaml_syntax_errors_name_the_line(text: str, line: int):
    # The wording comes from libyaml or PyYAML, whichever parses; the place is ours.
    with pytest.raises(SpecError, match=rf"^a\.yaml:{line}: invalid YAML: \S"):
        load(text)


def test_every_error_of_a_file_is_reported_at_once():
    text = spec_file("- target: os:system", "  seed: -1", "  inputs: [{name: x, shape: 3x}]",
                     "- expr: 'lambda: 0'")
    with pytest.raises(SpecFileError) as info:
        load(text)
    lines = [str(e).splitlines()[0] for e in info.value.errors]
    assert [line.split(": ")[0:2] for line in lines] == [
        ["a.yaml:3", "specs[0].target"], ["a.yaml:4", "specs[0].seed"],
        ["a.yaml:5", "specs[0].inputs[0].shape"], ["a.yaml:6", "specs[1].expr"]]
    assert str(info.value).count("a.yaml:") == 4
    assert (info.value.path, info.value.line, info.value.key) == ("a.yaml", 3, "specs[0].target")


def test_load_file_names_the_file_and_refuses_os_system(tmp_path: Path):
    path = tmp_path / "evil.yaml"
    path.write_text("version: 1\nspecs:\n  - target: os:system\n    inputs: [{c: \"'ls'\"}]\n")
    with pytest.raises(SpecError, match=r"evil\.yaml:3: specs\[0\]\.target: 'os:system'"):
        load_file(path)


@pytest.mark.parametrize("reference", [
    "os:system", "builtins:eval", "builtins:exec", "subprocess:run", "subprocess:Popen",
    "shutil:rmtree", "importlib:import_module", "pickle:loads", "sys:exit", "ctypes:CDLL",
    "socket:socket", "torch.hub:load", "torch:load", "numpy:load", "torch.serialization:load",
    "yaml:unsafe_load", "posix:system", "nt:system", "pathlib:Path", "io:open", "runpy:run_path",
    "code:interact", "pty:spawn", "signal:signal", "multiprocessing:Process", "threading:Thread",
    "urllib.request:urlopen", "http.client:HTTPConnection", "tempfile:mktemp", "glob:glob",
    "marshal:loads", "mypkg:__init__", "mypkg.__main__:f", "mypkg:open", "mypkg:eval",
])
def test_dangerous_references_are_refused_without_import(reference: str):
    with pytest.raises(SpecError, match="refused"):
        resolve_reference(reference, FIXTURES)


def test_allowed_references_resolve(tmp_path: Path):
    assert resolve_reference("ops.py:Double", FIXTURES) == f"{FIXTURES / 'ops.py'}:Double"
    assert resolve_reference("torch.nn:Linear", FIXTURES) == "torch.nn:Linear"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text("from torch import *\n")
    # A star import hides what the file defines: the import at run time decides.
    assert resolve_reference("sub/m.py:Anything", tmp_path).endswith("sub/m.py:Anything")


def test_a_symlink_out_of_the_spec_folder_is_refused(tmp_path: Path):
    (tmp_path / "os.py").symlink_to(FIXTURES / "ops.py")
    inner = tmp_path / "specs"
    inner.mkdir()
    (inner / "link.py").symlink_to(FIXTURES / "ops.py")
    with pytest.raises(SpecError, match="outside the spec's folder"):
        resolve_reference("link.py:Double", inner)


# --- the Spec model ----------------------------------------------------------------------------

FULL = """\
version: 1
specs:
  - target: ops.py:Double
    inputs:
      - {name: x, shape: [3, 3], domain: positive}
      - {name: c, value: 5}
      - w: 2x2:float32:nograd
      - {name: k, shape: [4], domain: {integer: [0, 9]}}
      - {name: r, shape: [], domain: [-1, 1]}
    cases:
      - {}
      - {name: big, seed: 9, inputs: {x: [5, 5], c: 2.5, w: {requires_grad: true}}}
    seed: 3
    atol: 1.0e-4
    rtol: 1e-2
    checks: gradient
    tolerances: {gradient: {eps: 1e-7}}
    xfail: {gradient: known}
    surrogate: {kind: scale, factor: -2, inputs: [x]}
"""


def test_the_spec_model_is_what_the_runner_consumes():
    (spec,) = load(FULL)
    assert spec.name == "Double" and spec.line == 3 and spec.path == "a.yaml"
    assert spec.target == f"{FIXTURES / 'ops.py'}:Double" and spec.expr is None
    base, big = spec.cases
    assert base.label == "case 0" and base.seed is None
    assert base.inputs == (
        TensorSpec((3, 3), domain=Domain("positive"), name="x"), LiteralSpec(5, name="c"),
        TensorSpec((2, 2), "float32", requires_grad=False, name="w"),
        TensorSpec((4,), domain=Domain("integer", 0, 9), name="k"),
        TensorSpec((), domain=Domain("range", -1, 1), name="r"))
    assert big.label == "big" and big.seed == 9
    assert big.inputs[0] == TensorSpec((5, 5), domain=Domain("positive"), name="x")  # domain kept
    assert big.inputs[1] == LiteralSpec(2.5, name="c")
    assert big.inputs[2] == TensorSpec((2, 2), "float32", requires_grad=True, name="w")
    # 1e-2 (no dot) is a string to YAML 1.1; numeric settings accept it anyway.
    assert spec.config == {"seed": 3, "atol": 1e-4, "rtol": 1e-2, "checks": ("gradient",)}
    assert spec.check_config == {"gradient": {"eps": 1e-7}}
    assert spec.xfail == {"gradient": "known"}
    assert spec.surrogate == ScaleSurrogate(inputs=(0,), factor=-2.0)
    assert spec.surrogate.describe() == "scale -2 (gradient reversal) for 'x'"
    assert spec.input_names == ("x", "c", "w", "k", "r")


def test_yaml_merge_keys_share_settings_between_specs():
    first, second = load(spec_file("- &base", "  target: ops.py:Double", "  atol: 1.0e-4",
                                   "  seed: 3", "- <<: *base", "  name: again", "  seed: 4"))
    assert second.name == "again" and second.target == first.target
    assert second.config == {"atol": 1e-4, "seed": 4}


def test_defaults_name_case_and_no_inputs():
    (target, expr) = load(spec_file("- target: ops.py:Double", "- expr: 'exp(x) * 2'", f"  {X}"))
    assert target.cases == () and target.input_names == () and target.config == {}
    assert target.surrogate is None and target.xfail == {} and target.init is None
    assert expr.name == "exp(x) * 2" and expr.target is None and expr.expr == "exp(x) * 2"
    assert expr.cases[0].label == "case 0"


def test_init_is_plain_data():
    (spec,) = load(spec_file("- target: torch.nn:Linear", "  init: {in_features: 3, "
                             "out_features: 2, bias: false}", "  inputs: [{x: [4, 3]}]"))
    assert spec.init == {"in_features": 3, "out_features": 2, "bias": False}
    assert type(spec.init) is dict
    assert spec.target == "torch.nn:Linear" and spec.name == "Linear"


def test_literal_shorthands():
    (spec,) = load(spec_file("- target: ops.py:Double", "  inputs:", "    - x: [2]",
                             "    - reduction: \"'mean'\"", "    - bias: null", "    - flag: true",
                             "    - {name: dims, value: [0, 1]}"))
    assert [type(s).__name__ for s in spec.cases[0].inputs] == ["TensorSpec"] + ["LiteralSpec"] * 4
    assert [getattr(s, "value", None) for s in spec.cases[0].inputs[1:]] == [
        "mean", None, True, [0, 1]]


def test_find_spec_files(tmp_path: Path):
    for name in ("b.yaml", "a/c.yml", "a/d.txt", ".hidden/e.yaml", "a/.f.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert find_spec_files(tmp_path) == [tmp_path / "a/c.yml", tmp_path / "b.yaml"]
    assert find_spec_files(tmp_path / "a/d.txt") == [tmp_path / "a/d.txt"]
    with pytest.raises(SpecError, match="no such file or directory"):
        find_spec_files(tmp_path / "nope")


BUNDLED = find_spec_files(ROOT / "specs")


@pytest.mark.parametrize("path", BUNDLED, ids=[str(p.relative_to(ROOT)) for p in BUNDLED])
def test_every_bundled_spec_loads(path: Path):
    specs = load_file(path)
    assert specs and all(isinstance(s, Spec) for s in specs)


def test_the_bundled_library_covers_the_format():
    specs = [s for path in BUNDLED for s in load_file(path)]
    assert len([s for s in specs if s.expr]) >= 12                       # torch built-ins
    assert {s.surrogate.kind for s in specs if s.surrogate} == {
        "identity", "scale", "clipped_identity", "oracle"}
    assert any(s.xfail.get("gradient") for s in specs)                  # the notebook's bug
    assert any(len(s.cases) > 1 for s in specs)


# --- bounded loading ---------------------------------------------------------------------------

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize(("text", "message"), [
    (LAUGHS, "YAML expands to more than"),
    ("[" * 100_000, "nested deeper than"),
    ("- " * 10_000 + "x", "nested deeper than"),
    ("a: &a [*a]\n", "nested deeper than"),
    ("a: &a {b: *a}\n", "nested deeper than"),
    ("x: " + "y" * 300_000, "a spec file may hold at most"),
    (b"\xff\xfe\xfa\x00garbage", "invalid YAML"),
], ids=["billion-laughs", "deep-flow", "deep-block", "recursive-list", "recursive-map", "huge",
        "bad-bytes"])
def test_hostile_yaml_is_refused_quickly(text: str | bytes, message: str):
    start = time.perf_counter()
    with pytest.raises(SpecError, match=message):
        load_text(text, "a.yaml", FIXTURES)
    assert time.perf_counter() - start < 2.0


def test_load_file_reads_a_bounded_prefix(tmp_path: Path):
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"# " + b"x" * 10_000_000)
    with pytest.raises(SpecError, match="at most"):
        load_file(path)


# --- fuzzing: nothing but SpecError, ever ------------------------------------------------------

KEYS = ["version", "specs", "name", "target", "expr", "init", "inputs", "cases", "seed", "dtype",
        "device", "eps", "atol", "rtol", "nondet_tol", "mode", "checks", "tolerances", "xfail",
        "surrogate", "shape", "domain", "value", "requires_grad", "kind", "factor", "range",
        "oracle", "gradient", "contract", "double_backward", "x", "<<"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["ops.py:Double", "os:system", "x * 2", "3x4:positive",
                                           "identity", "spd", "float64", "1e-5", "[0, 1]", "x"]))
DATA = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=30)
SPECISH = st.fixed_dictionaries({"version": st.one_of(st.just(1), SCALARS),
                                 "specs": st.lists(st.dictionaries(st.sampled_from(KEYS), DATA,
                                                                   max_size=6), max_size=3)})
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _only_spec_errors(data: str | bytes) -> None:
    try:
        specs = load_text(data, "fuzz.yaml", FIXTURES)
    except SpecError as exc:
        assert str(exc)
    else:
        assert all(isinstance(s, Spec) for s in specs)


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes):
    _only_spec_errors(data)


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("{}[]-:&*!|>'\"#%@`,?\n \t.01aexy<")), max_size=200))
def test_fuzz_yaml_punctuation(data: str):
    _only_spec_errors(data)


@FUZZ
@given(DATA)
def test_fuzz_random_yaml_documents(data: object):
    _only_spec_errors(yaml.safe_dump(data, allow_unicode=True))


@FUZZ
@given(SPECISH)
def test_fuzz_spec_shaped_documents(data: object):
    _only_spec_errors(yaml.safe_dump(data, allow_unicode=True))


def test_the_complete_example_in_specs_readme_loads():
    text = (ROOT / "specs" / "README.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    specs = load_text(example, "README.md", ROOT / "specs" / "examples")
    assert [s.name for s in specs] == ["linear layer", "P3 as a formula", "MulConstantUnscaled",
                                       "GradientReversal", "LayerWithCustomGrad"]
    assert [c.label for c in specs[0].cases] == ["with bias", "without bias", "big batch"]
    assert specs[0].cases[2].inputs[0].shape == (64, 3)
