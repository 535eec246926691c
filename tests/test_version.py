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
