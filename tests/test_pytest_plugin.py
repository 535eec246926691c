"""The pytest plugin: opt-in spec collection, outcomes, failure text, fixture, xdist."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch  # noqa: F401
import yaml  # noqa: F401

import gradtool
from gradtool.config.registry import DEFAULT_CHECKS
from gradtool.run.collect import collect_specs
from gradtool.config.settings import CheckConfig
from gradtool.errors import SpecError
from gradtool.pytest_plugin import CheckFailed, GradtoolInconclusive, is_spec_file, settle
from gradtool.render.terminal import check_text
from gradtool.results import CaseResult, CheckResult, Outcome, TargetResult
from gradtool.run.runner import run
from gradtool.spec.schema import load_file

pytest_plugins = ["pytester"]

# Everything an inner run imports is imported here first. pytester restores sys.modules after each
# in-process run, dropping modules first imported inside it; torch and yaml's C loader cannot be
# imported twice in one process (yaml's would build nodes of the old classes).
for _module in pkgutil.walk_packages(gradtool.__path__, "gradtool."):
    if _module.name != "gradtool.__main__":  # importing it runs the CLI
        importlib.import_module(_module.name)

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
FIXTURES_TRACE = Path(__file__).resolve().parent / "fixtures" / "trace"

MUL = """\
  - target: mul_constant.py:{name}
    inputs:
      - {{name: tensor, shape: [3, 3]}}
      - {{name: constant, value: 5}}
"""
PASSING = "version: 1\nspecs:\n" + MUL.format(name="MulConstant") + """\
    cases:
      - {name: five}
      - {name: half, inputs: {constant: 0.5}}
"""
FAILING = "version: 1\nspecs:\n" + MUL.format(name="MulConstantUnscaled")
XFAIL = FAILING + "    xfail: {gradient: backward forgets the constant}\n"
XPASS = "version: 1\nspecs:\n" + MUL.format(name="MulConstant") + \
    "    xfail: {gradient: stale declaration}\n"
INVALID = "version: 1\nspecs:\n  - target: mul_constant.py:MulConstant\n    inputs:\n" \
          "      - {name: tensor, shpe: [3, 3]}\n"
BOOM_TARGET = "version: 1\nspecs:\n  - target: boom.py:MulConstantUnscaled\n" + \
    MUL.format(name="MulConstant")
NOT_SPECS = {
    "docker-compose.yml": "version: '3'\nservices:\n  web: {image: nginx}\n",
    "manifests.yaml": "kind: A\n---\nkind: B\n",
    "broken.yaml": "key: [unclosed\n",
    "empty.yaml": "",
}


def plugin_args() -> list[str]:
    """-p loads the plugin until the entry point is installed; after, -p would register it twice."""
    installed = any(ep.value.startswith("gradtool.pytest_plugin")
                    for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "gradtool.pytest_plugin"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder with the example Functions module the specs point at."""
    pytester.makefile(".py", mul_constant=(EXAMPLES / "mul_constant.py").read_text())
    return pytester


# Plugins the inner runs do not need; unraisableexception alone costs ~1.5 s a run (its
# gc.collect() calls walk torch's heap), four fifths of an in-process run's time.
QUIET_PLUGINS = ("cacheprovider", "unraisableexception", "benchmark", "hypothesispytest")


def run_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    blocked = [arg for name in QUIET_PLUGINS for arg in ("-p", f"no:{name}")]
    return pytester.runpytest(*plugin_args(), *blocked, *args)


def test_spec_files_are_not_collected_without_opting_in(project):
    project.makefile(".yaml", good=PASSING)
    result = run_pytest(project)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_one_item_per_spec_case_and_check(project):
    project.makefile(".yaml", good=PASSING)
    result = run_pytest(project, "--gradtool", "--collect-only", "-q")
    ids = [line for line in result.outlines if line.startswith("good.yaml::")]
    assert ids == [f"good.yaml::MulConstant::{check}[{case}]" for case in ("five", "half")
                   for check in DEFAULT_CHECKS if not check.startswith("op_")]  # ops only


def test_passing_spec_passes(project):
    project.makefile(".yaml", good=PASSING)
    run_pytest(project, "--gradtool").assert_outcomes(passed=8, skipped=6)  # faces a spec's target lacks: skipped


@pytest.mark.parametrize("ini", ["[pytest]\ngradtool = true\n",
                                 "[tool.pytest.ini_options]\ngradtool = true\n"])
def test_ini_option_opts_in(project, ini):
    if ini.startswith("[pytest]"):
        project.makeini(ini)
    else:
        project.makepyprojecttoml(ini)
    project.makefile(".yaml", good=PASSING)
    run_pytest(project).assert_outcomes(passed=8, skipped=6)  # faces a spec's target lacks: skipped


def test_failure_text_is_the_cli_plain_report(project):
    project.makefile(".yaml", bad=FAILING)
    result = run_pytest(project, "--gradtool")
    result.assert_outcomes(passed=3, failed=1, skipped=3)  # faces a spec's target lacks: skipped
    # What the CLI prints for the same spec, computed in this process (same cwd, same seed).
    jobs, _ = collect_specs("bad.yaml", CheckConfig())
    report = run(jobs, CheckConfig())
    [expected] = [check_text(t, c, k) for t, c, k in report.checks()
                  if k.outcome is Outcome.FAILED]
    assert "diagnosis:" in expected and "reproduce: gradtool check bad.yaml" in expected
    # Every line but the mode line, whose predicted time varies from run to run.
    lines = [line.strip() for line in expected.splitlines() if "predicted" not in line]
    result.stdout.fnmatch_lines([f"*{line}*" for line in lines], consecutive=False)
    assert "Traceback" not in result.stdout.str() and "runtest" not in result.stdout.str()
    result.stdout.fnmatch_lines(["FAILED bad.yaml::MulConstantUnscaled::gradient*"])


def test_declared_expected_failure_is_xfail_and_a_stale_one_fails(project):
    project.makefile(".yaml", xfail=XFAIL, xpass=XPASS)
    result = run_pytest(project, "--gradtool", "-rxX")
    result.assert_outcomes(passed=6, xfailed=1, failed=1, skipped=6)  # faces a spec's target lacks: skipped
    result.stdout.fnmatch_lines(["XPASS MulConstant   gradient",
                                 "*declared expected failure: stale declaration"],
                                consecutive=False)
    result.stdout.fnmatch_lines(["XFAIL xfail.yaml::MulConstantUnscaled::gradient*"
                                 "backward forgets the constant"])


def test_invalid_spec_is_a_collection_error_with_the_spec_error(project):
    project.makefile(".yaml", invalid=INVALID, good=PASSING)
    result = run_pytest(project, "--gradtool", "--continue-on-collection-errors")
    result.assert_outcomes(passed=8, errors=1, skipped=6)  # faces a spec's target lacks: skipped
    with pytest.raises(SpecError) as error:  # what `gradtool check invalid.yaml` reports
        load_file("invalid.yaml")
    assert str(error.value).startswith("invalid.yaml:5: specs[0].inputs[0].shpe: unknown key")
    out = result.stdout.str()
    assert re.search(rf"ERROR collecting invalid\.yaml _+\n{re.escape(str(error.value))}\n", out)
    assert "Traceback" not in out


def test_target_failing_on_import_fails_collection_of_that_spec_only(project):
    # The validator reads names with ast; importing the module is what fails here.
    project.makepyfile(boom=(EXAMPLES / "mul_constant.py").read_text() +
                       "\nraise RuntimeError('boom at import')\n")
    project.makefile(".yaml", targets=BOOM_TARGET)
    result = run_pytest(project, "--gradtool", "--continue-on-collection-errors")
    result.assert_outcomes(passed=4, errors=1, skipped=3)  # faces a spec's target lacks: skipped
    result.stdout.fnmatch_lines(["targets.yaml:3: target: importing *boom.py raised "
                                 "RuntimeError: boom at import",
                                 "ERROR targets.yaml::MulConstantUnscaled"], consecutive=False)


def test_other_yaml_files_are_ignored(project):
    for name, text in NOT_SPECS.items():
        (project.path / name).write_text(text)
    result = run_pytest(project, "--gradtool")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_tool_gradtool_settings_apply(project):
    project.makepyprojecttoml('[tool.gradtool]\nchecks = ["contract"]\n')
    project.makefile(".yaml", bad=FAILING)
    result = run_pytest(project, "--gradtool", "--collect-only", "-q")
    assert [line for line in result.outlines if "::" in line] == \
        ["bad.yaml::MulConstantUnscaled::contract"]


def test_bad_tool_gradtool_key_is_a_usage_error(project):
    project.makepyprojecttoml("[tool.gradtool]\natoll = 1e-3\n")
    project.makefile(".yaml", good=PASSING)
    result = run_pytest(project, "--gradtool")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown key 'atoll'*", "*did you mean 'atol'*"],
                                consecutive=False)


FIXTURE_TESTS = """
import pytest
from mul_constant import MulConstant, MulConstantUnscaled
from gradtool.testing import assert_gradients

def test_fixture_passes(gradtool_check):
    report = gradtool_check(MulConstant, ["3x3", "5"])
    assert report.ok() and len(report.checks()) == 4

def test_fixture_fails(gradtool_check):
    gradtool_check(MulConstantUnscaled, ["3x3", "5"])

def test_assert_gradients_passes():
    assert assert_gradients(MulConstant, ["3x3", "5"], checks=["gradient"]).ok()

def test_assert_gradients_fails():
    assert_gradients(MulConstantUnscaled, ["3x3", "5"])
"""


def test_fixture_and_assert_gradients(project):
    project.makepyfile(test_grads=FIXTURE_TESTS)
    project.syspathinsert()
    result = run_pytest(project)  # no --gradtool: the fixture works without opting in
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert len(re.findall(r"^E +diagnosis: ", out, re.MULTILINE)) == 2
    assert out.count("FAIL ") >= 2 and "reproduce: gradtool check" in out
    # The failure points at the test's own line, not at gradtool's internals.
    assert "gradtool/api.py" not in out and "gradtool/testing.py" not in out


def test_fixture_defaults_come_from_tool_gradtool(project):
    project.makepyprojecttoml("[tool.gradtool]\natol = 10.0\n")
    project.makepyfile(test_tol="""
from mul_constant import MulConstantUnscaled

def test_loose(gradtool_check):
    gradtool_check(MulConstantUnscaled, ["3x3", "5"])

def test_override(gradtool_check):
    gradtool_check(MulConstantUnscaled, ["3x3", "5"], atol=1e-5)
""")
    project.syspathinsert()
    result = run_pytest(project)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_tol.py::test_override*"])


def test_xdist_two_workers(project):
    project.makefile(".yaml", good=PASSING, bad=FAILING, xfail=XFAIL)
    result = run_pytest(project, "--gradtool", "-n", "2")
    result.assert_outcomes(passed=14, failed=1, xfailed=1, skipped=12)  # faces a spec's target lacks: skipped
    result.stdout.fnmatch_lines(["*2 workers*", "  diagnosis: *"],
                                consecutive=False)


def test_importing_the_plugin_is_cheap():
    code = ("import sys, gradtool.pytest_plugin; "
            "assert not {'torch', 'numpy', 'yaml'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True)


def one_check(outcome: Outcome, **kw) -> tuple[TargetResult, CaseResult, CheckResult]:
    check = CheckResult("gradient", outcome, summary="finite differences disagree", **kw)
    case = CaseResult("case 0", 0, (), (check,), reproduce="gradtool check m.py:F --seed 0")
    return TargetResult("m.py:F", "function", "F", "m.py:3", (case,)), case, check


def test_outcome_mapping():
    assert settle(*one_check(Outcome.PASSED), strict=True) is None
    with pytest.raises(pytest.skip.Exception, match="finite differences disagree"):
        settle(*one_check(Outcome.SKIPPED), strict=False)
    with pytest.raises(pytest.xfail.Exception, match="surrogate"):
        settle(*one_check(Outcome.XFAILED, expected_failure="surrogate"), strict=False)
    for outcome in (Outcome.FAILED, Outcome.ERROR, Outcome.XPASSED):
        with pytest.raises(CheckFailed, match=rf"^{outcome.name[:4]}\w* m.py:F   gradient"):
            settle(*one_check(outcome), strict=False)


def test_inconclusive_warns_and_fails_only_when_strict():
    with pytest.warns(GradtoolInconclusive, match="INCONCLUSIVE m.py:F   gradient"):
        settle(*one_check(Outcome.INCONCLUSIVE), strict=False)
    with pytest.raises(CheckFailed, match="reproduce: gradtool check m.py:F"):
        settle(*one_check(Outcome.INCONCLUSIVE), strict=True)


@pytest.mark.parametrize(("text", "ours"), [
    (PASSING, True),
    ("version: 1\n", True),                          # invalid, but a spec file: report it
    ("{version: 1, specs: []}\n", True),             # flow style
    ("version: 1\nspecs:\n  - target: [unclosed\n", True),  # broken, but declares specs
    *((text, False) for text in NOT_SPECS.values()),
    ("jobs:\n  specs: {run: pytest}\n", False),      # a nested specs key is someone else's
])
def test_spec_file_detection(tmp_path, text, ours):
    path = tmp_path / "file.yaml"
    path.write_text(text)
    assert is_spec_file(path) is ours


TRACED_TEST = '''
import pytest
import torch
from kernels import RowSumSq, RowSumSqTailBug, ScaledTanh


def step(norm, width):
    x = torch.randn(8, width, dtype=torch.float64, requires_grad=True)
    norm.apply(ScaledTanh.apply(x, 0.5)).sum().backward()


def test_buggy_at_40(gradtool_trace):
    step(RowSumSqTailBug, 40)
    assert len(gradtool_trace.calls) == 2


def test_fixed_at_40(gradtool_trace):
    step(RowSumSq, 40)


def test_buggy_at_48_is_right_there(gradtool_trace):
    step(RowSumSqTailBug, 48)


@pytest.mark.gradtool_trace(checks=("gradient",))
def test_marked(request):
    step(RowSumSqTailBug, 40)


def test_explicit_check(gradtool_trace):
    step(RowSumSq, 24)
    report = gradtool_trace.check()
    assert len(report.targets) == 2 and report.ok()
    step(RowSumSqTailBug, 40)  # after check(): no longer recorded
'''


def test_gradtool_trace_fixture_and_marker_fail_the_test_that_calls_a_wrong_function(pytester):
    pytester.makepyfile(kernels=(FIXTURES_TRACE / "kernels.py").read_text(),
                        test_traced=TRACED_TEST)
    result = run_pytest(pytester, "-q", "-rA")
    result.assert_outcomes(passed=3, failed=2)
    text = result.stdout.str()
    assert "FAILED test_traced.py::test_buggy_at_40" in text
    assert "FAILED test_traced.py::test_marked" in text
    assert "RowSumSqTailBug at test_traced.py:8, input 8x40 float64" in text  # the call site
    assert "reproduce: gradtool check kernels.py:RowSumSqTailBug --inputs-from" in text
    for name in ("test_fixed_at_40", "test_buggy_at_48_is_right_there", "test_explicit_check"):
        assert f"PASSED test_traced.py::{name}" in text
