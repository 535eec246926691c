"""The JSON report validates against the shipped schema, for passing, failing and rejected runs."""

from __future__ import annotations

import json
from importlib.resources import files

import jsonschema
from click.testing import CliRunner

from conftest import EXAMPLES, FIXTURES
from gradtool.cli.main import main

SCHEMA = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())


def report_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["check", *args, "--format", "json"])
    return json.loads(result.stdout)


def test_passing_and_failing_reports_validate():
    for args in ([f"{EXAMPLES}/linear.py"],
                 [f"{EXAMPLES}/mul_constant.py:MulConstantUnscaled", "-i", "3x3", "-i", "5"],
                 [f"{FIXTURES}/contract_cases.py:SquareRaises", "-i", "(4,)"],
                 [f"{EXAMPLES}/legendre.py:LegendrePolynomial3", "-i", "(3000,)",
                  "--mode", "probe"],
                 # below float64: 'float32 vs float64' and double backward's 'float64 full'
                 [f"{EXAMPLES}/linear.py:LinearFunction", "--dtype", "bfloat16"]):
        data = report_json(*args)
        jsonschema.validate(data, SCHEMA)


def test_spec_report_with_xfail_validates():
    data = report_json(f"{EXAMPLES}/mul_constant.yaml")
    jsonschema.validate(data, SCHEMA)
    outcomes = {c["outcome"] for t in data["targets"] for case in t["cases"] for c in case["checks"]}
    assert "xfailed" in outcomes
