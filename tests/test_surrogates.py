"""Surrogates: vjp gives the intended gradient; the examples match it, their broken twins don't."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradtool.errors import SpecError
from gradtool.spec.surrogates import (ClippedIdentitySurrogate, IdentitySurrogate, OracleSurrogate,
                                 ScaleSurrogate, Surrogate, load_callable, make_surrogate)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "specs" / "examples"
FIXTURES = ROOT / "tests" / "fixtures"


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(f"_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


good = _module(EXAMPLES / "surrogates.py")
broken = _module(FIXTURES / "broken_surrogates.py")


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def _backward(function, args, grad_output):
    """What the Function's backward returns for grad_output (the gradient of each tensor arg)."""
    leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    out = function.apply(*leaves)
    tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
    grads = iter(torch.autograd.grad(out, tensors, grad_output, allow_unused=True))
    return [next(grads) if isinstance(a, torch.Tensor) else None for a in leaves]


def _same(actual, intended) -> bool:
    return all((a is None and i is None) or (a is not None and i is not None and torch.equal(a, i))
               for a, i in zip(actual, intended, strict=True))


# --- make_surrogate and describe -------------------------------------------------------------

@pytest.mark.parametrize(("data", "expected", "description"), [
    ("identity", IdentitySurrogate(), "straight-through identity"),
    ({"kind": "identity", "inputs": [1]}, IdentitySurrogate(inputs=(1,)),
     "straight-through identity for 'lambda_'"),
    ({"kind": "scale", "factor": -0.5, "inputs": ["x"]}, ScaleSurrogate(inputs=(0,), factor=-0.5),
     "scale -0.5 (gradient reversal) for 'x'"),
    ({"kind": "scale", "factor": "2e-1"}, ScaleSurrogate(factor=0.2), "scale 0.2"),
    ({"kind": "clipped_identity", "range": [-1, 1]}, ClippedIdentitySurrogate(lo=-1.0, hi=1.0),
     "clipped identity on [-1, 1]"),
    ({"kind": "oracle", "oracle": "surrogates.py:reversal_grad"},
     OracleSurrogate(reference=f"{EXAMPLES / 'surrogates.py'}:reversal_grad"),
     "oracle specs/examples/surrogates.py:reversal_grad"),
])
def test_make_surrogate(data, expected, description, monkeypatch):
    monkeypatch.chdir(ROOT)
    surrogate = make_surrogate(data, base_dir=EXAMPLES, input_names=["x", "lambda_"])
    assert isinstance(surrogate, Surrogate)
    assert surrogate == expected and surrogate.kind == expected.kind
    assert surrogate.describe() == description


@pytest.mark.parametrize(("data", "key", "message"), [
    (3, "surrogate", "expected a mapping with kind:"),
    ({"kind": "ste"}, "surrogate.kind", "expected one of identity, scale, clipped_identity"),
    ({"kind": "scale", "factor": float("inf")}, "surrogate.factor", "expected a finite number"),
    ({"kind": "scale", "factor": True}, "surrogate.factor", "expected a finite number"),
    ({"kind": "clipped_identity", "range": [0]}, "surrogate.range", "expected [lo, hi]"),
    ({"kind": "identity", "inputs": [-1]}, "surrogate.inputs", "argument positions"),
    ({"kind": "identity", "range": [0, 1]}, "surrogate.range", "unknown key for a identity"),
    ({"kind": "oracle", "oracle": "os:system"}, "surrogate.oracle", "refused"),
    ({"kind": "oracle", "oracle": "builtins:eval"}, "surrogate.oracle", "refused"),
    ({"kind": "oracle", "oracle": "../fixtures/x.py:f"}, "surrogate.oracle", "outside"),
    ({"kind": "oracle", "oracle": "surrogates.py:no_such"}, "surrogate.oracle", "defines no"),
])
def test_make_surrogate_refuses_bad_declarations(data, key, message):
    with pytest.raises(SpecError) as info:
        make_surrogate(data, base_dir=EXAMPLES, input_names=["x"])
    assert info.value.key == key and message in str(info.value)


# --- vjp: the intended gradient --------------------------------------------------------------

def test_identity_passes_grad_output_to_the_first_float_tensor():
    x, g = _randn(3, 2), _randn(3, 2) * 7
    intended = IdentitySurrogate().vjp([2, torch.arange(3), x, "mean"], [g, _randn(1)])
    assert intended[:2] == [None, None] and torch.equal(intended[2], g) and intended[3] is None


def test_identity_sums_a_broadcast_gradient_back_to_the_input_shape():
    x, g = _randn(4), _randn(3, 4)
    (intended,) = IdentitySurrogate().vjp([x], [g])
    torch.testing.assert_close(intended, g.sum(0))


def test_scale_multiplies_only_the_named_inputs():
    x, w, g = _randn(5), _randn(5), _randn(5)
    intended = ScaleSurrogate(inputs=(1,), factor=-0.25).vjp([x, w], [g])
    assert intended[0] is None and torch.equal(intended[1], -0.25 * g)


def test_clipped_identity_zeroes_outside_the_range_even_nan():
    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    g = torch.tensor([float("nan"), 1.0, 2.0, 3.0, 4.0, float("inf")], dtype=torch.float64)
    (intended,) = ClippedIdentitySurrogate(lo=-1.0, hi=1.0).vjp([x], [g])
    assert intended.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]


def test_oracle_is_called_with_inputs_then_grad_outputs():
    oracle = make_surrogate({"kind": "oracle", "oracle": "surrogates.py:reversal_grad"},
                            base_dir=EXAMPLES)
    x, g = _randn(4), _randn(4)
    intended = oracle.vjp([x, 0.5], [g])
    assert torch.equal(intended[0], -0.5 * g) and intended[1] is None


def test_oracle_returning_the_wrong_number_of_gradients_is_an_error(tmp_path: Path):
    (tmp_path / "o.py").write_text("def one(x, lam, g):\n    return g\n"
                                   "def three(x, g):\n    return g, None, None\n")
    single = make_surrogate({"kind": "oracle", "oracle": "o.py:one"}, base_dir=tmp_path)
    with pytest.raises(TypeError, match="expected one gradient per forward argument"):
        single.vjp([_randn(2), 0.5], [_randn(2)])
    triple = make_surrogate({"kind": "oracle", "oracle": "o.py:three"}, base_dir=tmp_path)
    with pytest.raises(TypeError, match="returned 3"):
        triple.vjp([_randn(2)], [_randn(2)])


def test_load_callable_accepts_module_references():
    assert load_callable("torch.nn.functional:relu") is torch.nn.functional.relu


def test_no_float_tensor_to_pass_through_is_an_error():
    with pytest.raises(ValueError, match="no floating-point tensor"):
        IdentitySurrogate().vjp([3, torch.arange(2)], [_randn(2)])


# --- the example Functions match their declared surrogate; the broken twins don't --------------

X = _randn(40) * 2
G = _randn(40)

EXAMPLES_AND_TWINS = [
    ("straight-through round", IdentitySurrogate(), good.RoundSTE, broken.RoundNoSTE, (X,)),
    ("gradient reversal", ScaleSurrogate(inputs=(0,), factor=-0.5), good.GradientReversal,
     broken.GradientReversalPlus, (X, 0.5)),
    ("clamp STE", ClippedIdentitySurrogate(lo=-1.0, hi=1.0), good.ClampSTE,
     broken.ClampSTEWrongRange, (X,)),
    ("reversal oracle", OracleSurrogate(f"{EXAMPLES / 'surrogates.py'}:reversal_grad"),
     good.GradientReversal, broken.GradientReversalPlus, (X, 0.5)),
]


@pytest.mark.parametrize(("label", "surrogate", "function", "twin", "args"), EXAMPLES_AND_TWINS,
                         ids=[e[0] for e in EXAMPLES_AND_TWINS])
def test_example_matches_its_surrogate_and_the_broken_twin_does_not(label, surrogate, function,
                                                                    twin, args):
    intended = surrogate.vjp(list(args), [G])
    assert _same(_backward(function, args, G), intended)
    assert not _same(_backward(twin, args, G), intended)


# --- end to end through the engine: the broken twins fail, naming the surrogate ---------------

def _engine() -> None:
    for module in ("gradtool.run.runner", "gradtool.run.collect", "gradtool.cli.main"):
        pytest.importorskip(module)


def _gradtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradtool", "check", *args, "--format", "json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _gradient_checks(report: dict) -> dict[str, dict]:
    return {target["target"]: check for target in report["targets"] for case in target["cases"]
            for check in case["checks"] if check["name"] == "gradient"}


def test_broken_surrogate_twins_fail_naming_the_surrogate():
    _engine()
    done = _gradtool("tests/fixtures/broken_surrogates.yaml")
    assert done.returncode == 1, done.stderr
    checks = _gradient_checks(json.loads(done.stdout))
    expected = {"RoundNoSTE": "straight-through identity",
                "GradientReversalPlus": "scale -0.5 (gradient reversal) for 'x'",
                "ClampSTEWrongRange": "clipped identity on [-1, 1]"}
    assert set(checks) == set(expected)
    for name, description in expected.items():
        assert checks[name]["outcome"] == "failed"
        assert f"declared surrogate ({description})" in checks[name]["summary"]


def test_the_example_surrogates_pass_end_to_end():
    _engine()
    done = _gradtool("specs/examples/surrogates.yaml")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    checks = _gradient_checks(json.loads(done.stdout))
    assert checks and all(c["outcome"] == "passed" for c in checks.values())
