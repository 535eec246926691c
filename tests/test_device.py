"""Device-correct by construction, guarded on the CPU: every tensor gradtool makes names its
device, and a value handed to user code on another device is gradtool's error, not the user's."""

from __future__ import annotations

import textwrap

import pytest
import torch

import gradtool
from gradtool.errors import InternalError
from gradtool.numerics.problem import Problem
from conftest import load_fixture
from device_guard import PACKAGE, FactoryGuard, package_violations, violations


def test_every_factory_gradtool_calls_names_its_device():
    assert package_violations() == []


@pytest.mark.parametrize("source", ["torch.zeros(3)", "torch.arange(n)", "torch.tensor([1, 2])",
                                    "torch.randn(s, generator=g, dtype=d)",
                                    "torch.from_numpy(a)"])
def test_the_source_rule_finds_a_planted_factory(source):
    assert violations(source) == [f"<source>:1 {source.split('(')[0]}(...)"]


@pytest.mark.parametrize("source", ["torch.zeros(3, device=x.device)", "torch.zeros_like(x)",
                                    "x.new_zeros(3)", "torch.tensor(v, **kw)"])
def test_the_source_rule_lets_placed_tensors_pass(source):
    assert violations(source) == []


def _outcomes(report) -> set[str]:
    return {check.outcome.value for _, _, check in report.checks()}


def test_the_bundled_specs_make_no_tensor_without_a_device():
    with FactoryGuard() as guard:
        report = gradtool.check("specs/")
    assert guard.found == []
    assert _outcomes(report) <= {"passed", "skipped", "xfailed"}, _outcomes(report)


@pytest.mark.parametrize("checks", [("gradient", "double_backward", "forward_ad", "vmap"),
                                    ("contract", "layout")])
def test_a_failing_run_makes_no_tensor_without_a_device(checks):
    """The failing path (diagnosis, measured tolerance, kink test, bisection) too."""
    with FactoryGuard() as guard:
        report = gradtool.check("specs/examples/mul_constant.py:MulConstantUnscaled",
                                inputs=("3x3", "5"), checks=checks)
        report = gradtool.check("specs/examples/mul_constant.py:MulConstantUnscaled",
                                inputs=("40x40", "5"), checks=("gradient",), mode="probe")
    assert guard.found == []
    assert "failed" in _outcomes(report)


@pytest.mark.parametrize("target, inputs", [
    ("tests/fixtures/three_functions.py:ThreeFunctionNet", None),   # the culprit search
    ("tests/fixtures/models.py:InnerBroken", None),                  # a Function inside a model
    ("specs/examples/mul_constant.py:MulConstantUnscaled", ("3x3", "5"))])
def test_models_and_their_culprits_make_no_tensor_without_a_device(target, inputs, tmp_path):
    with FactoryGuard() as guard:
        report = gradtool.check(target, inputs)
    assert guard.found == []
    assert _outcomes(report) - {"passed", "skipped", "xfailed"}  # each has a failure to diagnose


def test_the_runtime_guard_finds_a_factory_planted_in_numerics():
    # Compiled under a numerics/ file name: to the guard, a frame of gradtool's numerics.
    planted = textwrap.dedent("""
        import torch
        def one_hot(n):
            return torch.zeros(n, n)   # no device: wrong for a CUDA target
        """)
    namespace: dict = {}
    exec(compile(planted, str(PACKAGE / "numerics" / "steps.py"), "exec"), namespace)
    with FactoryGuard() as guard:
        namespace["one_hot"](3)
        torch.zeros(3)  # this test's own frame: not gradtool's
    assert guard.found == ["gradtool/numerics/steps.py:4 torch.zeros"]


def _problem() -> Problem:
    x = torch.randn(3, dtype=torch.float64)
    return Problem(load_fixture("bugs").Cube.apply, [x], ["x"], [0])


def test_a_value_on_another_device_is_gradtools_error_before_the_target_runs():
    problem = _problem()
    with pytest.raises(RuntimeError, match="gradtool made a value of input 0 on meta"):
        problem.outputs([torch.zeros(3, dtype=torch.float64, device="meta")])
    assert problem.calls["forward"] == 0


def test_a_grad_output_on_another_device_is_gradtools_error():
    problem = _problem()
    leaves, outs = problem.graph()
    with pytest.raises(RuntimeError, match="grad_output 0 on meta"):
        problem.vjp(leaves, outs, [torch.zeros(3, dtype=torch.float64, device="meta")])


def test_a_wrong_device_inside_a_check_is_an_internal_error(monkeypatch):
    """Blamed by its frame on gradtool (exit 3), never reported as the target's error."""
    from gradtool.numerics import steps

    real = steps.one_hot

    def misplaced(idx, n_out, outs):
        return real(idx, n_out, outs).to("meta")

    monkeypatch.setattr(steps, "one_hot", misplaced)
    with pytest.raises(InternalError, match="grad_output 0 on meta"):
        gradtool.check(load_fixture("bugs").Cube, inputs=("4x3",), checks=("gradient",))


def test_a_module_is_checked_where_its_parameters_are():
    from gradtool.api import _given_dtype, _input_specs

    on_meta = torch.nn.Linear(3, 2, device="meta")
    assert _given_dtype(None, {}, on_meta)["device"] == "meta"
    assert _given_dtype(None, {"device": "cpu"}, on_meta)["device"] == "cpu"  # asked: kept
    x = torch.zeros(2, 3)
    assert "device" not in _given_dtype(None, {}, lambda v: v)
    assert _given_dtype(_input_specs((x,), None), {}, on_meta)["device"] == "cpu"  # values decide
