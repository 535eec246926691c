"""The torch-free commands on every Python in the declared range that the machine has (pyenv)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from gradtool import __version__

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.slow

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
CACHE = Path(os.environ.get("GRADTOOL_TEST_CACHE", Path.home() / ".cache" / "gradtool-tests"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Every minor version Python has had or announced; the declared range picks from it.
MINORS = [f"3.{minor}" for minor in range(8, 16)]


def declared_minors() -> list[str]:
    """The 3.x versions requires-python admits (a single '>=3.N' bound, as the project states)."""
    match = re.fullmatch(r">=\s*3\.(\d+)", PROJECT["requires-python"].strip())
    assert match, f"requires-python {PROJECT['requires-python']!r}: this test reads '>=3.N'"
    return [minor for minor in MINORS if int(minor.split(".")[1]) >= int(match.group(1))]


def interpreter(minor: str) -> Path | None:
    """The newest pyenv build of that minor version, or None."""
    builds = sorted(PYENV.glob(f"{minor}.*"), key=lambda p: [int(x) for x in
                                                            re.findall(r"\d+", p.name)])
    builds = [b / "bin" / "python" for b in builds if re.fullmatch(r"\d+\.\d+\.\d+", b.name)]
    return builds[-1] if builds else None


def torch_free_requirements() -> list[str]:
    """The project's dependencies without torch: what a torch-free command may import."""
    return [dep for dep in PROJECT["dependencies"] if not dep.startswith("torch")]


def torch_free_env(python: Path, minor: str) -> Path:
    """A venv with gradtool's dependencies but no torch, made once per Python and requirement set."""
    key = hashlib.sha256("\n".join(torch_free_requirements()).encode()).hexdigest()[:12]
    venv = CACHE / f"py{minor}-{key}"
    ready = venv / "ready"
    if not ready.exists():
        subprocess.run([str(python), "-m", "venv", "--clear", str(venv)], check=True)
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                              *torch_free_requirements()], capture_output=True, text=True)
        if pip.returncode:
            pytest.skip(f"cannot install gradtool's dependencies for Python {minor}: "
                        f"{pip.stderr.strip().splitlines()[-1:]}")
        ready.touch()
    return venv / "bin" / "python"


# Versions in the range that the machine lacks are not tests (3.14 and later, usually).
PRESENT = [(minor, python) for minor in declared_minors() if (python := interpreter(minor))]


def test_the_declared_range_includes_the_python_running_the_suite():
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in declared_minors()


def test_the_declared_minimum_is_on_the_machine():
    # Otherwise the oldest Python the project claims would go untested here.
    if not PYENV.is_dir():
        pytest.skip(f"no pyenv at {PYENV}")
    assert PRESENT and PRESENT[0][0] == declared_minors()[0], PRESENT


@pytest.mark.parametrize("minor,python", PRESENT, ids=[minor for minor, _ in PRESENT])
def test_torch_free_commands_run(minor, python, tmp_path):
    venv_python = torch_free_env(python, minor)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONHOME", None)
    absent = subprocess.run([str(venv_python), "-c", "import torch"], capture_output=True, env=env)
    assert absent.returncode != 0, "the torch-free venv has torch"
    # A project setting makes `config` parse TOML (tomllib, or tomli before 3.11).
    (tmp_path / "pyproject.toml").write_text("[tool.gradtool]\nseed = 7\n")
    outputs = {}
    for args in (["--help"], ["list", "--rules"], ["config"], ["--version"]):
        run = subprocess.run([str(venv_python), "-m", "gradtool", *args], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=120)
        assert run.returncode == 0, (minor, args, run.stdout, run.stderr)
        assert "Traceback" not in run.stderr and run.stdout.strip(), (minor, args, run.stderr)
        outputs[args[0]] = run.stdout
    assert "contract.broadcast_gradient" in outputs["list"]
    assert re.search(r"^seed\s+7\s+pyproject.toml", outputs["config"], re.M), outputs["config"]
    assert outputs["--version"].startswith(f"gradtool {__version__} ")
