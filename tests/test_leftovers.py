"""Left-overs of issue 57: a bare --json names FILE; a check of values given from Python
names a real rerun (the test or the script), not a placeholder INPUTS.pt; a PASS report does
not mention shapes inference passed over."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import torch
from click.testing import CliRunner

import gradtool
from conftest import FIXTURES
from gradtool.cli.main import main


def test_a_bare_report_option_names_what_it_takes():
    for option, example in (("--json", "report.json"), ("--junit-xml", "report.xml")):
        result = CliRunner().invoke(main, ["check", "x.py", option])
        assert result.exit_code == 2
        assert f"requires an argument: FILE (e.g. {option} {example})" in result.output


def test_a_report_option_before_the_target_does_not_take_it_as_its_file():
    """`gradtool check --json ops.py:Scale` took the target as the JSON file and said "nothing
    to check" (exit 5, the target unnamed): the target is named, and where the FILE goes."""
    for target in ("ops.py:Scale", "ops.py", "specs/op.yaml", "pkg.mod:Fn"):
        result = CliRunner().invoke(main, ["check", "--json", target])
        assert result.exit_code == 2, result.output
        assert f"{target!r} reads as a target" in result.output
        assert f"--json report.json {target}" in result.output
    assert "reads as a target" not in CliRunner().invoke(
        main, ["check", "nothing.py", "--json", "out.json"]).output


def test_given_values_reproduce_by_the_test_that_gave_them():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    report = gradtool.check(f"{FIXTURES}/catalogue.py:BadSquare", [x], checks=["gradient"])
    text = str(report)
    assert "INPUTS.pt --seed" not in text
    node = os.environ["PYTEST_CURRENT_TEST"].rpartition(" (")[0]
    assert f"reproduce: pytest {node}" in text, text


def test_given_values_reproduce_by_the_script_that_gave_them(tmp_path):
    shutil.copy(FIXTURES / "catalogue.py", tmp_path / "catalogue.py")
    (tmp_path / "script.py").write_text(
        "import torch, gradtool\n"
        "x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)\n"
        "print(gradtool.check('catalogue.py:BadSquare', [x], checks=['gradient']))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert "reproduce: python script.py" in done.stdout, done.stdout + done.stderr


VEC = '''import torch
class Vec(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        if g.dim() > 1:
            raise NotImplementedError("batched backward not supported")
        x, = ctx.saved_tensors
        return {factor} * x * g
'''


def test_a_pass_does_not_mention_shapes_inference_passed_over(tmp_path, monkeypatch):
    """Vec's backward takes 1-D only: inference passes over 3x4 for (5,). Said beside a
    failure (it explains the shape), not beside a pass."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vec.py").write_text(VEC.format(factor=2))
    (tmp_path / "bad.py").write_text(VEC.format(factor=3).replace("Vec", "Bad"))
    good = CliRunner().invoke(main, ["check", "vec.py", "--check", "gradient"])
    assert good.exit_code == 0 and "x (5,)" in good.output, good.output
    assert "passed over" not in good.output
    bad = CliRunner().invoke(main, ["check", "bad.py", "--check", "gradient"])
    assert bad.exit_code == 1 and "inference passed over 3x4" in bad.output, bad.output


def test_the_readme_says_how_to_keep_a_configured_index():
    from conftest import ROOT

    text = " ".join((ROOT / "README.md").read_text().split())
    assert "--index-url https://download.pytorch.org/whl/cpu" in text  # the default line
    assert ("pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
            in text)
    assert "configured for" in text and "PIP_INDEX_URL" in text
