"""--repro DIR: shrunk failing cases as standalone pytest files (issue 27)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gradtool
from gradtool.config.settings import CheckConfig
from gradtool.run.collect import collect_one
from gradtool.run.repro import write_reproducers
from gradtool.results import Block, CheckResult, Finding, Outcome
from gradtool.run.shrink import failure_kind, smaller
from gradtool.targets.inputs import TensorSpec, parse_input

ROOT = Path(__file__).resolve().parent.parent
BUGS = ROOT / "tests" / "fixtures" / "report_bugs.py"
CASES = {  # broken, correct twin, inputs, shrunk to, words of the finding
    "transposed": ("TransposeNotTransposed", "Transpose", ["5x5"], "2x2", "transposed"),
    "scaled": ("ScaleTwice", "Scale", ["6x40"], "2x1", "extra factor 3"),
    "tail": ("SquareTailDropped", "Square", ["6x42"], "1x5", "the rest agree"),
}


def reproduce(target: str, inputs: list[str], folder: Path, budget: int = 40):
    config = CheckConfig()
    jobs, _ = collect_one(target, config, [parse_input(i) for i in inputs])
    report = gradtool.check(target, inputs)
    return report, write_reproducers(report, jobs, str(folder), budget)


def pytest_run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(path)], cwd=path.parent, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("bug", sorted(CASES))
def test_repro_fails_on_the_bug_and_passes_on_the_twin(bug, tmp_path):
    broken, twin, inputs, shrunk_to, words = CASES[bug]
    report, written = reproduce(f"{BUGS}:{broken}", inputs, tmp_path / "repro")
    assert not report.ok() and len(written) == 1
    r = written[0]
    assert r.check == "gradient" and r.shrunk_from == inputs[0] and r.shrunk_to == shrunk_to
    assert 1 < r.checks_run <= 40 and r.path == str(tmp_path / "repro" / f"test_{broken}.py")
    path = Path(r.path)
    failing = pytest_run(path)
    assert failing.returncode == 1, failing.stdout
    assert words in failing.stdout and "1 failed" in failing.stdout  # the same finding
    fixed = path.with_name(f"test_{twin}.py")
    fixed.write_text(path.read_text().replace(f":{broken}'", f":{twin}'"))
    assert f":{twin}'" in fixed.read_text()
    passing = pytest_run(fixed)
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_repro_run_with_python_fails_on_the_bug_and_passes_on_the_twin(tmp_path):
    """`python test_X.py` used to define the test, run nothing and exit 0 on the bug."""
    _, written = reproduce(f"{BUGS}:ScaleTwice", ["6x40"], tmp_path / "repro")
    path = Path(written[0].path)
    failing = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                             timeout=300)
    assert failing.returncode == 1 and "extra factor 3" in failing.stderr, failing.stderr
    fixed = path.with_name("test_Scale.py")
    fixed.write_text(path.read_text().replace(":ScaleTwice'", ":Scale'"))
    passing = subprocess.run([sys.executable, str(fixed)], capture_output=True, text=True,
                             timeout=300)
    assert passing.returncode == 0, passing.stderr
    assert "test_ScaleTwice passed" in passing.stdout  # the function keeps its name


def test_budget_spent_before_values_leaves_the_seeded_spec(tmp_path):
    """Three checks: the confirmation and two sizes; no values tried, the -i spec is written."""
    _, written = reproduce(f"{BUGS}:ScaleTwice", ["6x40"], tmp_path, budget=3)
    assert written[0].checks_run == 3 and "budget exhausted" in written[0].note
    text = Path(written[0].path).read_text()
    assert "seed=0" in text and "checks=['gradient']" in text
    assert "torch.tensor(" not in text and "'" + written[0].shrunk_to + "'" in text


def test_nothing_written_for_a_passing_run(tmp_path):
    folder = tmp_path / "repro"
    report, written = reproduce(f"{BUGS}:Scale", ["6x40"], folder)
    assert report.ok() and written == () and not folder.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"{BUGS}:Square", "-i", "2x5",
         "--check", "gradient", "--repro", str(folder), "--no-isolate"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not folder.exists() and "REPRO" not in proc.stdout


def test_cli_repro_reports_how_far_it_shrank(tmp_path):
    folder = tmp_path / "repro"
    proc = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"{BUGS}:SquareTailDropped", "-i", "6x42",
         "--check", "gradient", "--repro", str(folder), "--repro-budget", "30", "-q",
         "--json", str(tmp_path / "r.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"REPRO    {folder}/test_SquareTailDropped.py" in proc.stdout
    assert "shrunk 6x42 → 1x5 in" in proc.stdout
    import json

    data = json.loads((tmp_path / "r.json").read_text())
    assert data["reproducers"][0]["shrunk_to"] == "1x5" and data["reproducers"][0]["budget"] == 30
    assert (folder / "test_SquareTailDropped.py").is_file()


def test_smaller_shrinks_equal_sizes_together_first():
    specs = [TensorSpec((6, 40)), TensorSpec((40, 3))]
    first = next(iter(smaller(specs)))
    assert [s.shape for s in first] == [(6, 1), (1, 3)]  # the shared 40, both at once
    shapes = [tuple(s.shape for s in c) for c in smaller(specs)]
    assert ((6, 40), (40, 1)) in shapes and ((1, 40), (40, 3)) in shapes  # then one alone


def test_failure_kind_is_the_origin_not_the_words():
    """(check, rule, block) identity: numbers and messages never count, rules and blocks do."""
    def failed(factor: float, rule: str = "gradient.factor", where: str = "x") -> CheckResult:
        block = Block(where, (4,), "output", (4,), 16, 4, 1.0, 1.0)
        data = {"input": where, "output": "output"}
        return CheckResult("gradient", Outcome.FAILED, f"misses {factor}", blocks=(block,),
                           findings=(Finding("gradient.mismatch", f"{factor}", data=data),
                                     Finding(rule, f"× {factor} words", data={**data,
                                                                               "factor": factor})))
    assert failure_kind(failed(0.4)) == failure_kind(failed(0.5)) == \
        "'x' -> output: gradient.factor, gradient.mismatch"
    assert failure_kind(failed(0.4, "gradient.few_elements")) != failure_kind(failed(0.4))
    assert failure_kind(failed(0.4, where="y")) != failure_kind(failed(0.4))
    contract = CheckResult("contract", Outcome.FAILED, "words", findings=(
        Finding("contract.nonlinear", "one text"),))
    assert failure_kind(contract) == "broken rule contract.nonlinear"


def test_given_values_are_saved_beside_the_test(tmp_path):
    """--inputs-from a .pt: the values are replayed (not shrunk), from a .pt beside the test."""
    saved, folder = tmp_path / "in.pt", tmp_path / "repro"
    base = [sys.executable, "-m", "gradtool", "check", f"{BUGS}:ScaleTwice", "--check",
            "gradient", "-q", "--no-isolate"]
    subprocess.run([*base, "-i", "9x9", "--save-inputs", str(saved)], cwd=ROOT, timeout=300,
                   capture_output=True)
    proc = subprocess.run([*base, "--inputs-from", str(saved), "--repro", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "given values replayed as they are" in proc.stdout
    assert (folder / "test_ScaleTwice.inputs.pt").is_file()
    assert "torch.load(HERE / 'test_ScaleTwice.inputs.pt')" in \
        (folder / "test_ScaleTwice.py").read_text()
    failing = pytest_run(folder / "test_ScaleTwice.py")
    assert failing.returncode == 1 and "extra factor 3" in failing.stdout
