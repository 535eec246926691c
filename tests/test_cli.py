"""CLI end to end: exit codes, clear errors for bad targets and inputs, lazy torch, JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from conftest import EXAMPLES, FIXTURES, ROOT
from gradtool.cli.main import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_help_and_import_do_not_load_torch():
    code = ("import sys, gradtool, gradtool.cli.main; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
    helped = subprocess.run([sys.executable, "-m", "gradtool", "--help"], capture_output=True,
                            text=True, cwd=ROOT)
    assert helped.returncode == 0 and "Exit codes" in helped.stdout


def test_passing_target_exits_0():
    result = run("check", f"{EXAMPLES}/legendre.py:LegendrePolynomial3")
    assert result.exit_code == 0, result.output
    assert "4 passed" in result.output  # contract, gradient, double_backward, layout


def test_failing_target_exits_1_and_reproduces():
    result = run("check", f"{EXAMPLES}/mul_constant.py:MulConstantUnscaled", "-i", "3x3",
                 "-i", "5")
    assert result.exit_code == 1
    assert "analytical 1, numerical 5" in result.output
    assert "reproduce: gradtool check" in result.output and "--seed 0" in result.output


def test_error_in_backward_other_targets_still_run():
    result = run("check", f"{FIXTURES}/contract_cases.py:SquareRaises",
                 f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "-i", "3x4")
    assert result.exit_code == 1
    assert "ERROR" in result.output and "deliberate failure inside backward" in result.output
    assert "PASS  " in result.output and "LegendrePolynomial3" in result.output


def test_bad_targets_exit_2_without_traceback():
    for target, phrase in [
        ("no_such_module_xyz:F", "cannot import module"),
        (f"{EXAMPLES}/linear.py:LinearFuncton", "did you mean 'LinearFunction'?"),
        ("nope/missing.py:F", "file not found"),
    ]:
        result = run("check", target)
        assert result.exit_code == 2, (target, result.output)
        assert phrase in result.output and "Traceback" not in result.output


def test_bad_input_exits_2():
    result = run("check", f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "-i", "3x4:postive")
    assert result.exit_code == 2
    assert "did you mean 'positive'?" in result.output


def test_wrong_number_of_inputs_exits_2():
    result = run("check", f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "-i", "3", "-i", "4")
    assert result.exit_code == 2
    assert "forward takes (input)" in result.output


def test_uninferable_inputs_exit_2_with_how_to_pass_them(tmp_path):
    odd = tmp_path / "odd.py"
    odd.write_text("def f(x):\n    assert x.shape == (7, 11, 13)\n    return x * 2\n")
    result = run("check", f"{odd}:f")
    assert result.exit_code == 2
    assert "could not infer inputs" in result.output and "--input" in result.output


def test_nothing_to_check(tmp_path, monkeypatch):
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    result = run("check", str(empty))
    assert result.exit_code == 5  # a file with no Function or Module: nothing to check
    assert "defines no torch.autograd.Function" in result.output
    monkeypatch.chdir(tmp_path)  # no pyproject with [tool.gradtool] up from here
    result = run("check")
    assert result.exit_code == 5
    assert "nothing to check" in result.output
    (tmp_path / "specs").mkdir()
    assert run("check", "specs").exit_code == 5


def test_json_report_alone_on_stdout():
    result = CliRunner().invoke(main, ["check", f"{EXAMPLES}/linear.py:LinearFunction",
                                       "--format", "json"])
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    checks = data["targets"][0]["cases"][0]["checks"]
    assert [c["name"] for c in checks] == ["contract", "gradient", "double_backward",
                                            "layout"]
    assert data["config"]["seed"] == 0 and data["versions"]["torch"]


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "gradtool", "check",
                          f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "--check", "gradient"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_sympy_import_during_a_check():
    code = ("import sys, gradtool; "
            f"r = gradtool.check({str(EXAMPLES / 'linear.py:LinearFunction')!r}); "
            "assert r.ok(); print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_unusable_device_is_a_usage_error():
    import torch

    result = run("check", f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "--device", "bogus")
    assert result.exit_code == 2 and "'bogus' is not a torch device" in result.output
    if not torch.cuda.is_available():
        result = run("check", f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "--device", "cuda")
        assert result.exit_code == 2 and "no usable CUDA" in result.output


def test_closed_pipe_is_quiet_and_keeps_the_verdict():
    command = (f"set -o pipefail; {sys.executable} -m gradtool check "
               f"{EXAMPLES}/mul_constant.py | head -1")
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1  # MulConstantUnscaled fails; head closing the pipe changes nothing
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr


def test_a_block_whose_largest_difference_is_not_the_worst_element_says_so():
    from gradtool.render.terminal import block_lines
    from gradtool.results import Block, Element

    worst = Element("x", (3,), "out", (3,), 0.0, -2.65, 2.65, 1.0)
    block = Block("x", (8,), "out", (8,), 64, 3, 4.89, 1.0, (worst,))
    head = block_lines(block, {"atol": 1e-3, "rtol": 1e-2})[1]
    assert head.startswith("max abs diff 4.89 over the block; furthest beyond tolerance at (3)")
    same = Block("x", (8,), "out", (8,), 64, 3, 2.65, 1.0, (worst,))
    assert block_lines(same, {"atol": 1e-3, "rtol": 1e-2})[1].startswith("max abs diff 2.65 at")
