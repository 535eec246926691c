"""Findings are data: every failing check names a registered rule in JSON, JUnit and annotations
(its correct twin names none), and a new check or report format is one module plus one entry."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import gradtool
from gradtool.config import registry
from gradtool.render.annotations import render_github
from gradtool.render.json import render_json
from gradtool.render.junit import render_junit

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))
import contract_cases  # noqa: E402
import faces  # noqa: E402

MUL = f"{ROOT / 'specs' / 'examples' / 'mul_constant.py'}"
# check -> (broken target, its correct twin, inputs, the diagnosis rule it must name, options)
CASES = {
    "gradient": (f"{MUL}:MulConstantUnscaled", f"{MUL}:MulConstant", ["3x3", "5"],
                 "gradient.factor", {}),
    "double_backward": (contract_cases.my_cube_no_second_order, faces.CompileSensitive, ["3x4"],
                        "double_backward.untracked", {}),
    "forward_ad": (faces.ScaledSinJvpFactor, faces.ScaledSin, ["6x5", "6x5"],
                   "forward_ad.factor", {"mode": "full"}),
    "vmap": (faces.RowScaleBadRule, faces.RowScale, ["3x4", "(3,)"], "vmap.forward", {}),
    "complex": (faces.ComplexScaleNoConj, faces.ComplexScale, ["3x4:complex128"], "complex.conj",
                {}),
    "compiled": (faces.CompileSensitive, faces.ScaledSin, ["3x4"], "compiled.first_order",
                 {"checks": ("compiled",)}),
}


def _ids(report, check: str) -> dict[str, list[str]]:
    """The rule ids of `check` as JSON, JUnit's properties and the annotations carry them."""
    data = json.loads(render_json(report))
    in_json = [f["rule"] for t in data["targets"] for c in t["cases"] for k in c["checks"]
               if k["name"] == check for f in k["findings"]]
    root = ET.fromstring(render_junit(report))
    in_junit = [p.get("value") for case in root.iter("testcase")
                if case.get("name").endswith(f"::{check}") for p in case.iter("property")]
    rules = [line.split("rules broken: ", 1)[1].split("%0A")[0]
             for line in render_github(report).splitlines()
             if f"gradtool {check} " in line and "rules broken: " in line]
    return {"json": in_json, "junit": in_junit, "annotations": rules}


@pytest.mark.parametrize("check", sorted(CASES))
def test_a_failing_check_names_registered_rules_everywhere_and_its_twin_none(check, monkeypatch):
    monkeypatch.setenv("GRADTOOL_COMPILE_BACKEND", "aot_eager")
    broken, twin, inputs, kind, options = CASES[check]
    report = gradtool.check(broken, inputs, **options)
    found = _ids(report, check)
    assert found["json"] and set(found["json"]) <= set(registry.RULE_IDS), found
    assert kind in found["json"] and found["junit"] == found["json"], found
    assert found["annotations"] and all(kind in line for line in found["annotations"]), found
    good = gradtool.check(twin, inputs if check != "compiled" else ["3x4", "3x4"], **options)
    assert not _ids(good, check)["json"]


def test_a_finding_carries_the_data_its_words_are_made_of():
    report = gradtool.check(f"{MUL}:MulConstantUnscaled", ["3x3", "5"])
    gradient = next(k for _, _, k in report.checks() if k.name == "gradient")
    mismatch, factor = gradient.findings
    assert mismatch.rule == "gradient.mismatch" and mismatch.data["mismatched"] == 9
    assert factor.rule == "gradient.factor" and factor.data["factor"] == pytest.approx(0.2)
    assert factor.data["input"] == "tensor" and factor.message == gradient.blocks[0].diagnosis


def test_ignoring_a_diagnosis_kind_never_passes_a_wrong_gradient():
    report = gradtool.check(f"{MUL}:MulConstantUnscaled", ["3x3", "5"],
                            ignore=("gradient.factor",))
    gradient = next(k for _, _, k in report.checks() if k.name == "gradient")
    assert gradient.outcome.value == "failed"
    assert [f.rule for f in gradient.findings] == ["gradient.mismatch"]


@pytest.fixture
def toy(monkeypatch):
    """The toy check and format registered: one entry each (undone after the test)."""
    monkeypatch.setattr(registry, "BY_NAME", dict(registry.BY_NAME))
    monkeypatch.setattr(registry, "RULES", dict(registry.RULES))
    monkeypatch.setattr(registry, "FORMATS", dict(registry.FORMATS))
    for module in ("gradtool.config.settings", "gradtool.checks._common"):
        for name in ("BY_NAME", "RULES"):
            if hasattr(sys.modules[module], name):
                monkeypatch.setattr(sys.modules[module], name, getattr(registry, name))
    registry.register(registry.CheckInfo(
        "toy", "the first input has an even number of elements", default=False,
        module="toys.check", rules=(registry.Rule("toy.odd", "failure", "an odd count"),)))
    registry.register(registry.ReportFormat("count", "--count", "count",
                                            "toys.check:render_count", "rule ids per check"))


def test_a_new_check_is_one_module_plus_one_registry_entry(toy):
    report = gradtool.check(f"{MUL}:MulConstant", ["3x3", "5"], checks=("toy",))
    [toy_result] = [k for _, _, k in report.checks()]
    assert toy_result.name == "toy" and toy_result.outcome.value == "failed"
    assert _ids(report, "toy") == {"json": ["toy.odd"], "junit": ["toy.odd"],
                                   "annotations": ["toy.odd"]}
    even = gradtool.check(f"{MUL}:MulConstant", ["2x2", "5"], checks=("toy",))
    assert even.ok() and not _ids(even, "toy")["json"]
    assert gradtool.check(f"{MUL}:MulConstant", ["3x3", "5"], checks=("toy",),
                          ignore=("toy.odd",)).ok()


def test_a_new_report_format_is_one_module_plus_one_registry_entry(toy):
    report = gradtool.check(f"{MUL}:MulConstant", ["3x3", "5"], checks=("toy",))
    assert registry.FORMATS["count"].renderer()(report) == "toy toy.odd"
    assert json.loads(registry.FORMATS["json"].renderer()(report))["targets"]


def test_a_spec_ignoring_the_gradient_mismatch_is_rejected_naming_the_id_and_why():
    from gradtool.errors import GradtoolError
    from gradtool.spec.schema import load_text

    text = ("version: 1\nspecs:\n  - target: mul_constant.py:MulConstant\n"
            "    inputs: ['3x3', 5]\n    ignore: [gradient.factor, gradient.mismatch]\n")
    with pytest.raises(GradtoolError, match=r"s\.yaml:5: specs\[0\]\.ignore\[1\]: rule "
                                            r"gradient\.mismatch cannot be ignored: a wrong "
                                            r"gradient value is never silenced"):
        load_text(text, "s.yaml", ROOT / "specs" / "examples")
    ok = load_text(text.replace(", gradient.mismatch", ""), "s.yaml", ROOT / "specs" / "examples")
    assert tuple(ok[0].config["ignore"]) == ("gradient.factor",)
