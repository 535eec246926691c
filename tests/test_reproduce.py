"""One reproduce builder: replaying a failing case's `reproduce:` line gives the same verdict."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from gradtool.cli.main import main
from gradtool.config.settings import CheckConfig
from gradtool.run.reproduce import reproduce_command
from gradtool.targets.inputs import parse_input
from gradtool.targets.resolve import make_target


def _report(args: list[str]) -> dict:
    out = CliRunner().invoke(main, [*args, "--no-isolate", "--format", "json"])
    assert out.exit_code in (0, 1), out.output
    return json.loads(out.stdout)


def _verdicts(report: dict) -> list[tuple[str, list[tuple[str, str]], str]]:
    return [(t["target"], [(k["name"], k["outcome"]) for k in c["checks"]], c["reproduce"])
            for t in report["targets"] for c in t["cases"]]


@pytest.mark.parametrize("args", [
    ["bugs.py"],
    ["contract_cases.py:SquareWrongDtype", "-i", "3x4", "--check", "contract"],
    ["contract_cases.py:SquareNoisyBackward", "-i", "3x4", "--nondet-tol", "1e-12"],
    ["probe_cases.py:InvertedDropoutNoScale", "-i", "3x4", "--check", "gradient", "--seed", "3"],
    ["probe_cases.py:WeightsOfSizeK", "-i", "5x3", "--init", "k=3", "--mode", "full",
     "--atol", "1e-4", "--dtype", "float64", "--probes", "6"],
], ids=["bugs", "dtype", "noisy", "dropout", "init"])
def test_replaying_the_reproduce_line_of_a_failing_case_gives_the_same_verdict(
        tmp_path, monkeypatch, args):
    for name in ("bugs.py", "contract_cases.py", "probe_cases.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    failing = [v for v in _verdicts(_report(["check", *args]))
               if any(o == "failed" for _, o in v[1])]
    assert failing
    for target, checks, line in failing:
        words = shlex.split(line)
        assert words[:2] == ["gradtool", "check"], line
        again = _verdicts(_report(words[1:]))
        assert [(t, c) for t, c, _ in again] == [(target, checks)], line


def test_the_reproduce_line_carries_every_flag_that_changed_the_verdict():
    import torch

    class Sized(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(k))

        def forward(self, x):
            return x * self.w

    target = make_target(Sized, "model.py:Sized", {"k": 3})
    config = CheckConfig(device="cpu:0", checks=("gradient", "compiled"), probes=7,
                         trust_callables=True, autocast="bfloat16", atol=1e-4,
                         reference="ref.py:fn", mode="probe")
    line = reproduce_command(target, [parse_input("5x3")], config, 11)
    for flag in ("--init k=3", "--device cpu:0", "--check gradient --check compiled",
                 "--probes 7", "--trust-callables", "--autocast bfloat16", "--atol 0.0001",
                 "--reference ref.py:fn", "--mode probe", "--seed 11", "-i 5x3"):
        assert flag in line, (flag, line)
    default = reproduce_command(target, [parse_input("5x3")], CheckConfig(), 0)
    assert "--check" not in default and "--probes" not in default


def test_a_spec_reproduces_with_the_settings_given_beside_it():
    """--dtype on the command line is part of the case, unless the spec sets it itself."""
    import gradtool

    report = gradtool.check("specs/examples/cube.yaml", dtype="float32", eps=1e-3)
    lines = {case.reproduce for target in report.targets for case in target.cases}
    assert lines == {"gradtool check specs/examples/cube.yaml --dtype float32 --eps 0.001"}
