"""The check registry is the one place check names come from: CLI, specs, schema, README, runner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import import_module
from importlib.resources import files
from pathlib import Path

import pytest

from gradtool.config.registry import CHECK_NAMES, DEFAULT_CHECKS, REGISTRY
from gradtool.config.settings import CheckConfig

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_default_run_is_every_check_that_is_not_opt_in():
    assert CheckConfig().checks == DEFAULT_CHECKS
    assert set(DEFAULT_CHECKS) == {i.name for i in REGISTRY if i.default}
    assert {"contract", "gradient", "double_backward"} <= set(DEFAULT_CHECKS)


@pytest.mark.parametrize("info", REGISTRY, ids=lambda i: i.name)
def test_every_registered_check_has_a_runnable_module(info):
    module = import_module(info.import_path)
    assert callable(module.run)
    assert info.description and "\n" not in info.description


def test_the_report_schema_names_exactly_the_registered_checks():
    schema = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())
    assert tuple(schema["$defs"]["check"]["properties"]["name"]["enum"]) == CHECK_NAMES


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_readme_describes_every_check(name):
    assert re.search(rf"^- \*\*{name}\*\* — ", README.read_text(encoding="utf-8"), re.MULTILINE), name


def test_check_option_and_config_reject_unknown_names_with_the_registered_ones():
    out = subprocess.run([sys.executable, "-m", "gradtool", "check", "x.py:F", "--check", "nope"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert all(name in out.stderr for name in CHECK_NAMES)


def test_registry_is_importable_without_torch():
    code = ("import sys, gradtool.config.registry, gradtool.config.settings; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
