"""action.yml's run steps, executed as the runner would: the install step against a stub python
(its pip commands recorded), the check step for real against this checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.slow

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
STEPS = {step["name"]: step for step in ACTION["runs"]["steps"] if "run" in step}
FAILING = "specs/examples/mul_constant.py:MulConstantUnscaled -i 3x3 -i 5"
PASSING = "specs/examples/mul_constant.py:MulConstant -i 3x3 -i 5"


def step_env(step: dict, **inputs: str) -> dict[str, str]:
    """The step's env with ${{ inputs.x }} and ${{ github.action_path }} filled in."""
    values = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
    unknown = set(inputs) - set(values)
    assert not unknown, unknown
    values.update(inputs)

    def fill(text: str) -> str:
        return re.sub(r"\$\{\{\s*(inputs\.([\w-]+)|github\.action_path)\s*\}\}",
                      lambda m: values[m[2]] if m[2] else str(ROOT), text)

    return {key: fill(str(value)) for key, value in step.get("env", {}).items()}


def run_step(name: str, path_prefix: Path | None = None, **inputs: str):
    step = STEPS[name]
    assert step["shell"] == "bash"
    path = os.environ["PATH"] if path_prefix is None else f"{path_prefix}:{os.environ['PATH']}"
    env = {**os.environ, **step_env(step, **inputs), "PATH": path}
    env.pop("GITHUB_ACTIONS", None)  # the annotations must come from the step's own flag
    return subprocess.run(["bash", "-c", step["run"]], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


@pytest.fixture
def stub_python(tmp_path) -> tuple[Path, Path]:
    """A `python` that records its arguments instead of installing anything."""
    log = tmp_path / "calls.log"
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    stub.chmod(0o755)
    return stub.parent, log


def test_the_action_is_composite_and_sets_up_python_first():
    assert ACTION["runs"]["using"] == "composite"
    assert ACTION["runs"]["steps"][0]["uses"].startswith("actions/setup-python@")
    assert list(STEPS) == ["Install torch and gradtool", "gradtool check"]
    for step in STEPS.values():
        assert "${{" not in step["run"], "inputs reach the script through env only"


def test_install_pins_cpu_torch_then_installs_this_checkout(stub_python):
    bin_dir, log = stub_python
    out = run_step("Install torch and gradtool", bin_dir)
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        "-m pip install --upgrade pip",
        "-m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        f"-m pip install {ROOT}",
    ]


def test_install_takes_a_gradtool_requirement_and_the_project(stub_python):
    bin_dir, log = stub_python
    out = run_step("Install torch and gradtool", bin_dir, **{
        "gradtool-version": "gradtool==0.3.0", "install": "-e .[dev]", "torch-version": "2.6.0"})
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert calls[1].startswith("-m pip install torch==2.6.0 ")
    assert calls[2:] == ["-m pip install gradtool==0.3.0", "-m pip install -e .[dev]"]


def test_install_stops_at_the_first_failing_command(tmp_path):
    stub = tmp_path / "python"
    stub.write_text("#!/usr/bin/env bash\nexit 7\n")
    stub.chmod(0o755)
    out = run_step("Install torch and gradtool", tmp_path)
    assert out.returncode == 7


@pytest.fixture
def gradtool_on_path() -> None:
    if shutil.which("gradtool", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("no gradtool script beside this Python")


def test_check_step_annotates_a_failure_and_fails(gradtool_on_path):
    out = run_step("gradtool check", Path(sys.executable).parent, targets=FAILING)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^::error file=specs/examples/mul_constant\.py,line=\d+", out.stdout, re.M), \
        out.stdout
    assert out.stdout.startswith("gradtool ")  # --version first, for the log


def test_check_step_passes_a_correct_target_with_extra_args(gradtool_on_path, tmp_path):
    xml = tmp_path / "gradtool.xml"
    out = run_step("gradtool check", Path(sys.executable).parent, targets=PASSING,
                   args=f"--junit-xml {xml}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "::error" not in out.stdout and xml.is_file()
