"""One version, everywhere it shows: _version.py, pyproject, the install, --version, JSON, CHANGELOG."""

from __future__ import annotations

import importlib.metadata
import json
import re

from click.testing import CliRunner

from conftest import EXAMPLES, ROOT
from gradtool import __version__
from gradtool.cli.main import main

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def test_pyproject_reads_the_version_from_version_py():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "gradtool._version.__version__"


def test_the_installed_metadata_agrees():
    # A stale editable install (built before a bump) says otherwise: reinstall.
    assert importlib.metadata.version("gradtool") == __version__


def test_version_flag_names_gradtool_torch_numpy_and_python():
    out = CliRunner().invoke(main, ["--version"]).output
    assert re.match(rf"gradtool {re.escape(__version__)} \(torch \S+, numpy \S+, Python \S+\)",
                    out), out


def test_json_report_carries_the_version():
    result = CliRunner().invoke(main, ["check", f"{EXAMPLES}/cube.py", "--check", "gradient",
                                       "--format", "json"])
    assert json.loads(result.stdout)["versions"]["gradtool"] == __version__


def test_changelog_leads_with_this_version():
    headings = re.findall(r"^## \[?(\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == __version__, headings
    assert headings == sorted(headings, key=lambda v: [int(x) for x in v.split(".")],
                              reverse=True)


# Metadata a setuptools release first understood: the declared build requirement must reach it,
# or `pip install --no-build-isolation .` on an older image fails (a GPU machine's, typically).
# Measured: setuptools 76.1 refuses `license = "MIT"`, 77.0.3 builds the wheel (docs/compatibility.md).
NEEDS_SETUPTOOLS = {"license as a string (PEP 639)": 77, "license-files": 77}


def _declared_setuptools_floor(requires: list[str]) -> int:
    [spec] = [r for r in requires if r.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", spec.replace(" ", ""))
    assert match, f"build requirement {spec!r}: give a lower bound, setuptools>=N"
    return int(match.group(1))


def test_the_build_requirement_builds_the_declared_metadata():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    used = []
    if isinstance(pyproject["project"].get("license"), str):
        used.append("license as a string (PEP 639)")
    if "license-files" in pyproject["project"]:
        used.append("license-files")
    floor = _declared_setuptools_floor(pyproject["build-system"]["requires"])
    for feature in used:
        assert floor >= NEEDS_SETUPTOOLS[feature], \
            f"{feature} needs setuptools>={NEEDS_SETUPTOOLS[feature]}, the build declares >={floor}"


def test_the_floor_rule_reads_a_stale_requirement():
    assert _declared_setuptools_floor(["setuptools>=64"]) == 64 < NEEDS_SETUPTOOLS[
        "license as a string (PEP 639)"]
