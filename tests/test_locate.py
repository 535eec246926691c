"""locate: find which custom Function in a model is wrong, on the inputs it actually received."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.function import FunctionMeta

import gradtool
from conftest import FIXTURES, load_fixture, result
from gradtool.targets.cases import build_case
from gradtool.checks.gradient import check_gradient
from gradtool.config.settings import CheckConfig
from gradtool.targets.inputs import parse_input
from gradtool.run.culprit import (annotate, case_from_values, describe, forward_line,
                             locate_functions)
from gradtool.numerics.problem import Problem
from gradtool.results import Outcome
from gradtool.targets.load import source_of
from gradtool.targets.resolve import make_target

CONFIG = CheckConfig()


@pytest.fixture(scope="module")
def fx():
    return load_fixture("three_functions")


def line_of(marker: str) -> str:
    """'three_functions.py:N' of the fixture line carrying a marker comment."""
    lines = (FIXTURES / "three_functions.py").read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))
    return f"three_functions.py:{number}"


def net(fx, wrong: bool):
    torch.manual_seed(0)
    return fx.ThreeFunctionNet(wrong=wrong)


def problem_for(obj, inputs: list[str], config: CheckConfig = CONFIG) -> Problem:
    target = make_target(obj, "fixture")
    return build_case(target, [parse_input(i) for i in inputs], config, 0).problem


def by_name(findings):
    return {f.qualname: f for f in findings}


def test_whole_model_fails_first(fx):
    report = gradtool.check(net(fx, wrong=True), ["4x3"], checks=("gradient",))
    assert result(report, "gradient").outcome is Outcome.FAILED
    ok = gradtool.check(net(fx, wrong=False), ["4x3"], checks=("gradient",))
    assert result(ok, "gradient").outcome is Outcome.PASSED


def test_names_the_wrong_function_its_lines_and_input(fx):
    findings = locate_functions(problem_for(net(fx, wrong=True), ["4x3"]), CONFIG)
    assert [f.qualname for f in findings] == ["WrongLinearFunction", "MulConstant", "Tanh"]
    found = by_name(findings)
    bad = found["WrongLinearFunction"]
    assert bad.outcome is Outcome.FAILED
    assert bad.wrong_inputs == ("weight",)
    assert bad.source == source_of(fx.WrongLinearFunction.backward)
    assert "three_functions.py:" in bad.source
    assert bad.created_at.endswith(line_of("LINEAR LINE"))
    assert "is wrong w.r.t. weight" in bad.summary and "factor 2" in bad.summary
    assert found["MulConstant"].outcome is Outcome.PASSED  # setup_context style, a literal arg
    assert found["MulConstant"].created_at.endswith(line_of("SCALE LINE"))
    assert found["Tanh"].outcome is Outcome.PASSED
    assert found["Tanh"].created_at.endswith(line_of("TANH LINE"))


def test_a_probe_settles_the_culprit_where_its_full_check_alone_is_over_budget(fx):
    """Full mode over budget alone (an adjoint solve's Function, say): a failing probe names
    the culprit without locating its elements again (the model's blocks did); a passing probe
    leaves the verdict to the whole check, so a correct Function still passes."""
    from collections import Counter

    import gradtool.numerics.probe as probe_module

    tight = CONFIG.with_(full_budget_s=0.0)
    screens: Counter = Counter()
    real = probe_module.screen

    def counted(problem, *args, **kwargs):
        found = real(problem, *args, **kwargs)
        screens["failing" if found[1] else "passing"] += 1
        return found

    probe_module.screen = counted
    try:
        findings = by_name(locate_functions(problem_for(net(fx, wrong=True), ["4x3"]), tight))
    finally:
        probe_module.screen = real
    bad = findings["WrongLinearFunction"]
    assert bad.outcome is Outcome.FAILED and bad.wrong_inputs == ()
    assert "is found wrong by a probe of it alone" in bad.summary
    assert "2 of 2 probes fail" in bad.summary
    assert findings["MulConstant"].outcome is findings["Tanh"].outcome is Outcome.PASSED
    # one probe settled the wrong one; each correct one was probed, then checked whole
    assert screens["failing"] == 1 and screens["passing"] >= 2
    line = describe(list(findings.values()))[0]
    assert line.startswith("custom Functions, each checked alone on the inputs it received: "
                           "WrongLinearFunction (")
    assert ") is found wrong by a probe of it alone; MulConstant passes" in line


class _Doubled(torch.autograd.Function):
    """y = x with a backward that doubles the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_a_probe_blames_no_function_an_inconclusive_cause_explains():
    """Over budget alone, a probe settles "wrong" only where a forward computed to a tolerance
    or a kink cannot explain it: a correct fixed-point solve stopped at 1e-4 goes to the whole
    check (never blamed), a backward off by 1 % too (named with its inputs there), a doubled
    one is settled by the probe."""
    sharp = load_fixture("sharp")
    loose = type("Loose", (sharp.FixedPoint,), {"TOL": 1e-4})

    def model(x, w):
        return _Doubled.apply(loose.apply(x, w))

    def slightly(x, w):
        return sharp.FixedPointScaled.apply(x, w)

    tight = CONFIG.with_(full_budget_s=0.0)
    found = by_name(locate_functions(problem_for(model, ["2x8", "8x8:[-0.02,0.02]"]), tight))
    assert found["Loose"].outcome is not Outcome.FAILED, found["Loose"].summary
    assert found["_Doubled"].outcome is Outcome.FAILED
    assert "found wrong by a probe of it alone" in found["_Doubled"].summary
    scaled = by_name(locate_functions(problem_for(slightly, ["2x8", "8x8:[-0.02,0.02]"]),
                                      tight))["FixedPointScaled"]
    assert scaled.outcome is Outcome.FAILED and scaled.wrong_inputs == ("x",)


def test_a_function_applied_inside_an_installed_package_names_the_users_calling_line(tmp_path):
    """A library's solver applies its Function on its own line: the finding gives that line
    and the line of the user's code that called the library."""
    import importlib.util

    package = tmp_path / "site-packages" / "fakelib"
    package.mkdir(parents=True)
    (package / "solve.py").write_text(
        "import torch\n\n\n"
        "class Doubled(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x.clone()\n\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        return 2 * grad\n\n\n"
        "def solve(x):\n"
        "    return Doubled.apply(x)  # the library's line\n")
    spec = importlib.util.spec_from_file_location("fakelib_solve", package / "solve.py")
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)

    def model(x):
        return lib.solve(x * 1.0)  # THE USER'S LINE

    findings = locate_functions(problem_for(model, ["(4,)"]), CONFIG)
    [found] = findings
    # the library's function as the target itself: gradtool called it, no user line above
    # (it named a frame of whatever ran gradtool: multiprocessing's, the test runner's)
    [direct] = locate_functions(problem_for(lib.solve, ["(4,)"]), CONFIG)
    assert direct.created_at.endswith("site-packages/fakelib/solve.py:15"), direct.created_at
    here = (FIXTURES.parent / "test_locate.py").read_text().splitlines()
    line = next(i for i, text in enumerate(here, 1) if text.rstrip().endswith("# THE USER'S LINE"))
    assert "site-packages/fakelib/solve.py:15 (called from" in found.created_at
    assert found.created_at.endswith(f"(called from tests/test_locate.py:{line})")
    assert found.outcome is Outcome.FAILED


def test_all_correct_model_every_finding_passes(fx):
    findings = locate_functions(problem_for(net(fx, wrong=False), ["4x3"]), CONFIG)
    assert len(findings) == 3
    assert all(f.outcome is Outcome.PASSED and not f.wrong_inputs for f in findings)


def test_plain_callable(fx):
    report = gradtool.check(fx.three_functions, ["4x3", "2x3"], checks=("gradient",))
    assert result(report, "gradient").outcome is Outcome.FAILED
    findings = locate_functions(problem_for(fx.three_functions, ["4x3", "2x3"]), CONFIG)
    found = by_name(findings)
    assert found["WrongLinearFunction"].wrong_inputs == ("weight",)
    assert found["WrongLinearFunction"].created_at.endswith(line_of("CALLABLE LINEAR LINE"))
    assert found["MulConstant"].outcome is found["Tanh"].outcome is Outcome.PASSED
    ok = locate_functions(problem_for(fx.three_functions_ok, ["4x3", "2x3"]), CONFIG)
    assert [f.outcome for f in ok] == [Outcome.PASSED] * 3


def test_input_that_needs_no_grad_is_not_checked(fx):
    findings = locate_functions(problem_for(fx.three_functions, ["4x3:nograd", "2x3"]), CONFIG)
    assert by_name(findings)["WrongLinearFunction"].wrong_inputs == ("weight",)


def test_keyword_argument_moved_to_its_position(fx):
    try:  # torch 2.4 and 2.6 refuse keywords in a classic Function's apply: nothing to locate
        fx.keyword_call(torch.ones(4, 3), torch.ones(2, 3))
    except TypeError as exc:
        pytest.skip(f"this torch's Function.apply refuses keyword arguments: {exc}")
    findings = locate_functions(problem_for(fx.keyword_call, ["4x3", "2x3"]), CONFIG)
    assert [(f.qualname, f.wrong_inputs) for f in findings] == \
        [("WrongLinearFunction", ("weight",))]


def test_one_finding_per_class_and_call_site(fx):
    findings = locate_functions(problem_for(fx.repeated, ["(5,)"]), CONFIG)
    sites = [f.created_at for f in findings]
    assert [f.qualname for f in findings] == ["Tanh", "Tanh"]
    assert sites[0].endswith(line_of("LOOP LINE")) and sites[1].endswith(line_of("AFTER LOOP LINE"))


def test_function_applied_inside_another_forward_is_not_reported(fx):
    findings = locate_functions(problem_for(fx.nested, ["(5,)"]), CONFIG)
    assert [f.qualname for f in findings] == ["Outer"]


def test_no_hook_left_and_module_untouched(fx):
    model = net(fx, wrong=True)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gradtool.check(model, ["4x3"])
    locate_functions(problem_for(model, ["4x3"]), CONFIG)
    forward_line(problem_for(model, ["4x3"]))
    assert not _hooked()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())
    assert model.linear is fx.WrongLinearFunction and "forward" not in vars(model)


def _hooked():
    return any(name in vars(FunctionMeta) for name in ("forward", "setup_context", "backward"))


def test_hook_removed_even_when_forward_raises(fx):
    def broken(x):
        fx.Tanh.apply(x)
        raise RuntimeError("forward breaks after the Function")

    x = torch.randn(3, dtype=torch.float64)
    problem = Problem(broken, [x], ["x"], [0])
    assert locate_functions(problem, CONFIG) == []
    assert not _hooked()


def test_describe_lines(fx):
    findings = locate_functions(problem_for(net(fx, wrong=True), ["4x3"]), CONFIG)
    lines = describe(findings)
    assert f"WrongLinearFunction (tests/fixtures/{line_of('LINEAR LINE')}) is wrong w.r.t. weight" \
        in lines[0]
    assert "MulConstant passes; Tanh passes" in lines[0]
    assert any("backward at" in line and "three_functions.py" in line for line in lines[1:])
    ok = describe(locate_functions(problem_for(net(fx, wrong=False), ["4x3"]), CONFIG))
    assert "every custom Function passes alone" in ok[-1]
    assert describe([]) == []


def test_annotate_adds_details_and_source(fx):
    model = net(fx, wrong=True)
    target = make_target(model, "fixture")
    case = build_case(target, [parse_input("4x3")], CONFIG, 0)
    plain = check_gradient(case, target, CONFIG)
    assert plain.outcome is Outcome.FAILED
    located = annotate(plain, case.problem, CONFIG)
    assert located.source == source_of(fx.WrongLinearFunction.backward)
    assert any("is wrong w.r.t. weight" in d for d in located.details)
    assert located.blocks == plain.blocks and located.outcome is Outcome.FAILED


def test_forward_line_points_at_first_function(fx):
    line = forward_line(problem_for(net(fx, wrong=True), ["4x3"]))
    assert line is not None and line.endswith(line_of("LINEAR LINE"))
    assert forward_line(problem_for(lambda x: x * 2, ["(3,)"])) is None


def test_case_from_values(fx):
    target = make_target(fx.LinearFunction, "fixture:LinearFunction")
    x = torch.randn(4, 3, dtype=torch.float64)
    w = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    case = case_from_values(target, [x, w, None], CONFIG)
    assert case.problem.names == ["input", "weight", "bias"]
    assert case.problem.diff == [1]
    assert [i.differentiable for i in case.infos] == [False, True, False]
    assert not case.problem.args[1].requires_grad  # detached: the engine makes its own leaves
    assert check_gradient(case, target, CONFIG).outcome is Outcome.PASSED


def test_float32_model_uses_float32_tolerances(fx):
    config = CONFIG.with_(dtype="float32")
    problem = problem_for(fx.three_functions_ok, ["4x3", "2x3"], config)
    assert problem.args[0].dtype is torch.float32
    findings = locate_functions(problem, CheckConfig())  # the captured dtype decides
    assert [f.outcome for f in findings] == [Outcome.PASSED] * 3
