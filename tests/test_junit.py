"""JUnit XML renderer: schema validity, outcome mapping, counts, escaping, determinism."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.render.junit import check_text, render_junit, xml_safe
from gradtool.results import (Block, CaseResult, CheckResult, Element, InputInfo, Outcome,
                              Rejected, Report, TargetResult)

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit.xsd"))

NASTY = 'q"uo\'te <tag> & amp; \x00nul \x1b[31mansi\x07 \ud800 \ufffe\nnew\r\nline\ttab é 漢 🙂'


def mismatch_block() -> Block:
    element = Element("tensor", (1, 2), "output 0", (1, 2), 1.0, 5.0, 4.0, 0.8)
    return Block("tensor", (3, 3), "output 0", (3, 3), checked=81, mismatched=9,
                 max_abs_diff=4.0, max_rel_diff=0.8, worst=(element,),
                 diagnosis="analytical = 0.2 x numerical: backward misses a constant factor 5")


def make_check(outcome: Outcome, name: str = "gradient", **kw) -> CheckResult:
    defaults = {
        Outcome.FAILED: dict(summary="9 / 81 elements mismatched", blocks=(mismatch_block(),),
                             tolerance={"atol": 1e-5, "rtol": 1e-3}, source="specs/m.py:12"),
        Outcome.ERROR: dict(summary="RuntimeError in backward",
                            traceback="Traceback...\n  File 'm.py', line 3\nRuntimeError: boom"),
        Outcome.SKIPPED: dict(summary="backward is once_differentiable"),
        Outcome.INCONCLUSIVE: dict(summary="finite differences disagree (kink?)"),
        Outcome.XFAILED: dict(expected_failure="surrogate gradient", summary="mismatch"),
        Outcome.XPASSED: dict(expected_failure="surrogate gradient"),
    }.get(outcome, {})
    return CheckResult(name=name, outcome=outcome, duration_s=0.25, **{**defaults, **kw})


def make_report(check_list: list[CheckResult], target: str = "specs/m.py:MulConstant",
                rejected: tuple[Rejected, ...] = (), **config) -> Report:
    case = CaseResult(label="case0", seed=0, inputs=(InputInfo("tensor", "3x3", True),),
                      checks=tuple(check_list), reproduce=f"gradtool check {target} --seed 0")
    result = TargetResult(target=target, kind="function", qualname="MulConstant",
                          source="specs/m.py:5", cases=(case,))
    return Report(targets=(result,), config={"seed": 0, "dtype": "float64", **config},
                  versions={"torch": "2.13.0", "gradtool": "0.1.0"}, rejected=rejected,
                  duration_s=1.5)


def every_outcome_report(**config) -> Report:
    checks = [make_check(o, name=f"check_{o.value}") for o in Outcome]
    return make_report(checks, rejected=(Rejected("specs/bad.yaml:3", "unknown key 'shpe'"),),
                       **config)


def parse(xml: str) -> ET.Element:
    SCHEMA.validate(xml)
    return ET.fromstring(xml.encode("utf-8"))


def find_case(root: ET.Element, name_suffix: str) -> ET.Element:
    [case] = [c for c in root.iter("testcase") if c.get("name").endswith(name_suffix)]
    return case


def test_every_outcome_validates_against_the_schema():
    assert SCHEMA.is_valid(render_junit(every_outcome_report()))
    assert SCHEMA.is_valid(render_junit(every_outcome_report(strict=True)))


@pytest.mark.parametrize("strict", [False, True])
def test_counts_in_attributes_match_the_testcases(strict):
    root = parse(render_junit(every_outcome_report(strict=strict)))
    cases = list(root.iter("testcase"))
    for element in [root, *root.iter("testsuite")]:
        inside = list(element.iter("testcase"))
        assert int(element.get("tests")) == len(inside)
        for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            assert int(element.get(attr)) == sum(c.find(tag) is not None for c in inside)
    # 7 outcomes + 1 rejected; failed, xpassed (and inconclusive under strict) are failures.
    assert len(cases) == 8
    assert root.get("failures") == ("3" if strict else "2")
    assert root.get("errors") == "2"          # the error check and the rejected spec
    assert root.get("skipped") == "2"         # skipped and xfailed


@pytest.mark.parametrize("outcome, tag", [
    (Outcome.PASSED, None), (Outcome.FAILED, "failure"), (Outcome.ERROR, "error"),
    (Outcome.SKIPPED, "skipped"), (Outcome.XFAILED, "skipped"), (Outcome.XPASSED, "failure"),
    (Outcome.INCONCLUSIVE, "system-out"),
])
def test_outcome_mapping(outcome, tag):
    case = find_case(parse(render_junit(make_report([make_check(outcome)]))), "::gradient")
    assert [child.tag for child in case] == ([tag] if tag else [])


def test_inconclusive_is_a_failure_under_strict():
    case = find_case(parse(render_junit(make_report([make_check(Outcome.INCONCLUSIVE)],
                                                   strict=True))), "::gradient")
    assert [child.tag for child in case] == ["failure"]
    assert case.find("failure").get("message").startswith("inconclusive")


def test_names_and_classname():
    root = parse(render_junit(make_report([make_check(Outcome.PASSED, name="contract")])))
    [case] = root.iter("testcase")
    assert case.get("classname") == "specs/m.py:MulConstant"
    assert case.get("name") == "case0::contract"
    assert case.get("time") == "0.250"
    assert root.find("testsuite").get("name") == "specs/m.py:MulConstant"


def test_failure_carries_the_fallback_plain_text():
    case = find_case(parse(render_junit(make_report([make_check(Outcome.FAILED)]))), "::gradient")
    failure = case.find("failure")
    assert failure.get("message") == "9 / 81 elements mismatched"
    text = failure.text
    # The terminal's words (render/words.py), the one vocabulary of every report.
    assert "FAIL specs/m.py:MulConstant   gradient" in text
    assert "(1,2)->(1,2): analytical 1, numerical 5" in text
    assert "mismatched elements 9 / 81" in text and "constant factor 5" in text
    assert "atol 1e-05" in text and "look at: specs/m.py:12" in text
    assert text.rstrip().endswith("reproduce: gradtool check specs/m.py:MulConstant --seed 0")


def test_failure_uses_the_supplied_plain_text():
    seen = []

    def plain(target, case, check):
        seen.append((target.target, case.label, check.name))
        return f"custom report for {check.name}"

    report = make_report([make_check(Outcome.FAILED), make_check(Outcome.PASSED, name="contract")])
    root = parse(render_junit(report, plain_text=plain))
    assert find_case(root, "::gradient").find("failure").text == "custom report for gradient"
    assert seen == [("specs/m.py:MulConstant", "case0", "gradient")]   # only for what failed


def test_error_carries_the_traceback_and_xpassed_says_stale():
    report = make_report([make_check(Outcome.ERROR), make_check(Outcome.XPASSED, name="db")])
    root = parse(render_junit(report))
    assert "RuntimeError: boom" in find_case(root, "::gradient").find("error").text
    message = find_case(root, "::db").find("failure").get("message")
    assert "declared expected to fail (surrogate gradient) but passed" in message


def test_skipped_and_xfailed_messages():
    report = make_report([make_check(Outcome.SKIPPED, name="double_backward"),
                          make_check(Outcome.XFAILED)])
    root = parse(render_junit(report))
    assert find_case(root, "::double_backward").find("skipped").get("message") == \
        "backward is once_differentiable"
    assert find_case(root, "::gradient").find("skipped").get("message") == \
        "xfailed: surrogate gradient; mismatch"


def test_rejected_becomes_an_error_testcase():
    rejected = (Rejected("pkg.mod:Nope", "no 'Nope'\n  hint: x"),)
    root = parse(render_junit(make_report([], rejected=rejected)))
    suite = [s for s in root.iter("testsuite") if s.get("name") == "rejected"][0]
    [case] = suite.iter("testcase")
    assert case.get("classname") == "pkg.mod:Nope"
    error = case.find("error")
    assert error.get("message") == "no 'Nope'" and "hint: x" in error.text


def test_empty_report_is_valid():
    root = parse(render_junit(Report(targets=(), config={}, versions={})))
    assert root.get("tests") == "0" and len(root.findall("testsuite")) == 1


def test_nasty_strings_are_escaped_and_stripped():
    check = make_check(Outcome.FAILED, summary=NASTY, details=(NASTY,))
    report = make_report([check], target=NASTY, rejected=(Rejected(NASTY, NASTY),))
    xml = render_junit(report)
    root = parse(xml)                       # parses and validates: nothing illegal left
    assert "\x00" not in xml and "\x1b" not in xml and "\ud800" not in xml
    case = next(root.iter("testcase"))
    assert case.get("classname") == xml_safe(NASTY)      # attributes round-trip exactly
    assert case.find("failure").get("message") == xml_safe(NASTY)
    assert "#x1B[31mansi#x07" in case.find("failure").text
    assert "漢 🙂" in case.find("failure").text
    xml.encode("utf-8")                     # no lone surrogate survives


def test_xml_safe():
    assert xml_safe("a\x00b\x1fc\td\ne\rf") == "a#x00b#x1Fc\td\ne\rf"
    assert xml_safe("\ud800\ufffe\uffff") == "#xD800#xFFFE#xFFFF"
    assert xml_safe("é漢🙂") == "é漢🙂"


def test_long_messages_are_clipped_but_the_body_is_whole():
    check = make_check(Outcome.FAILED, summary="x" * 5000)
    failure = find_case(parse(render_junit(make_report([check]))), "::gradient").find("failure")
    assert len(failure.get("message")) == 1000 and failure.get("message").endswith("...")
    assert "x" * 5000 in failure.text


def test_deterministic():
    assert render_junit(every_outcome_report()) == render_junit(every_outcome_report())
    assert "timestamp" not in render_junit(every_outcome_report())


def test_properties_record_config_and_versions():
    root = parse(render_junit(make_report([make_check(Outcome.PASSED)],
                                          checks=["contract", "gradient"])))
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["config.seed"] == "0"
    assert props["config.checks"] == "contract,gradient"
    assert props["version.torch"] == "2.13.0"


def test_check_text_for_an_inconclusive_element():
    element = Element("x", (0,), "out", (), 0.0, 0.5, 0.5, 1.0, inconclusive=True)
    block = Block("x", (4,), "out", (), 4, 1, 0.5, 1.0, worst=(element,), exhaustive=False)
    check = make_check(Outcome.INCONCLUSIVE, blocks=(block,), mode="probe", mode_reason="large")
    report = make_report([check])
    text = check_text(report.targets[0], report.targets[0].cases[0], check)
    assert "input 'x' (4,) -> out ()" in text and "by bisection" in text
    assert "(0)->(): analytical 0, numerical 0.5" in text and "finite differences disagree" in text
    assert "mode: probe (large)" in text


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40))
def test_any_text_gives_valid_xml(text):
    check = make_check(Outcome.FAILED, summary=text, details=(text,))
    report = make_report([check], target=text or "t", rejected=(Rejected(text, text),))
    root = parse(render_junit(report))
    assert next(root.iter("testcase")).get("classname") == xml_safe(text or "t")
