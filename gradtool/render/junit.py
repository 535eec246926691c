"""JUnit XML: one testcase per (target, case, check), in the Ant/Jenkins format CI systems read."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from ..results import CaseResult, CheckResult, Outcome, Report, TargetResult
from .words import check_text

PlainText = Callable[[TargetResult, CaseResult, CheckResult], str]

# XML 1.0 allows only these characters (tab, newline, carriage return and the printable planes);
# anything else, lone surrogates included, makes the whole file unparseable by CI.
_ILLEGAL_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# Attribute values are meant for one-line summaries; the full text lives in the element body.
_MAX_MESSAGE = 1000

def xml_safe(text: Any) -> str:
    """Text with the characters XML 1.0 forbids replaced by a visible #xNN marker (as pytest)."""
    return _ILLEGAL_XML.sub(lambda m: f"#x{ord(m.group()):02X}", str(text))


def render_junit(report: Report, plain_text: PlainText | None = None,
                 html: str | None = None) -> str:
    """The whole report as a JUnit XML document (deterministic: no timestamp, no hostname);
    each failure's text is words.check_text (the terminal's words) unless plain_text is given;
    html: the path of the HTML report, linked from every suite (property html_report)."""
    describe = plain_text or check_text
    strict = bool(report.config.get("strict"))
    root = ET.Element("testsuites", name="gradtool")
    for target in report.targets:
        # The cases' time outside their checks (inputs, probe phase) is the suite's too.
        setup = {"time.setup": _seconds(sum(c.setup_s for c in target.cases))}
        suite = _suite(root, target.target, {**_properties(report, target), **setup,
                                             **({"html_report": html} if html else {})})
        for case in target.cases:
            for check in case.checks:
                _add_check(suite, target, case, check, describe, strict)
    if report.rejected:
        suite = _suite(root, "rejected", _properties(report, None))
        for rejected in report.rejected:
            case = _testcase(suite, rejected.source, "load", 0.0)
            _child(case, "error", rejected.message.splitlines()[0] if rejected.message else "",
                   f"could not load {rejected.source}\n{rejected.message}")
    if report.not_run:
        suite = _suite(root, "not run", _properties(report, None))
        for name in report.not_run:
            _child(_testcase(suite, name, "not run", 0.0), "skipped",
                   f"not run: the run was interrupted by {report.interrupted or 'a signal'}", "")
    if len(root) == 0:
        # An empty <testsuites/> confuses some CI readers; an empty suite reads as "0 tests".
        _suite(root, "gradtool", _properties(report, None))
    _total(root, report.duration_s)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(root: ET.Element, name: str, properties: dict[str, str]) -> ET.Element:
    suite = ET.SubElement(root, "testsuite", name=xml_safe(name))
    if properties:
        props = ET.SubElement(suite, "properties")
        for key, value in properties.items():
            ET.SubElement(props, "property", name=xml_safe(key), value=xml_safe(value))
    return suite


def _properties(report: Report, target: TargetResult | None) -> dict[str, str]:
    """Config and versions as suite properties, so a CI page says how to repeat the run."""
    props: dict[str, str] = {}
    if target is not None:
        props["kind"] = target.kind
        if target.source:
            props["source"] = target.source
        if target.spec:
            props["spec"] = target.spec
    for key in sorted(report.config):
        props[f"config.{key}"] = _plain_value(report.config[key])
    for key in sorted(report.versions):
        props[f"version.{key}"] = str(report.versions[key])
    return props


def _plain_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _add_check(suite: ET.Element, target: TargetResult, case: CaseResult, check: CheckResult,
               describe: PlainText, strict: bool) -> None:
    testcase = _testcase(suite, target.target, f"{case.label}::{check.name}", check.duration_s)
    _finding_properties(testcase, check)
    outcome = check.outcome
    if outcome is Outcome.PASSED and check.warnings and strict:
        _child(testcase, "failure", f"warning (--strict): {check.warnings[0].message}",
               describe(target, case, check))
        return
    if outcome is Outcome.PASSED:
        if check.warnings:  # told, not failed: the check passed
            out = ET.SubElement(testcase, "system-out")
            out.text = xml_safe(describe(target, case, check))
        return
    if outcome in (Outcome.SKIPPED, Outcome.XFAILED):
        _child(testcase, "skipped", _skip_message(check), None)
        return
    text = describe(target, case, check)
    if outcome is Outcome.INCONCLUSIVE and not strict:
        # Not a failure of the run, but it must not vanish into a green tick either.
        out = ET.SubElement(testcase, "system-out")
        out.text = xml_safe(text)
        return
    tag = "error" if outcome is Outcome.ERROR else "failure"
    _child(testcase, tag, _message(check), text)


def _finding_properties(testcase: ET.Element, check: CheckResult) -> None:
    """Each finding's rule id as a property (finding.<severity>), so CI can filter by rule."""
    if not check.findings:
        return
    props = ET.SubElement(testcase, "properties")
    for finding in check.findings:
        ET.SubElement(props, "property", name=f"finding.{finding.severity.value}",
                      value=xml_safe(finding.rule))


def _testcase(suite: ET.Element, classname: str, name: str, time: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=xml_safe(classname), name=xml_safe(name),
                         time=_seconds(time))


def _child(testcase: ET.Element, tag: str, message: str, text: str | None) -> None:
    element = ET.SubElement(testcase, tag, message=xml_safe(_clip(message)))
    if text:
        element.text = xml_safe(text)


def _message(check: CheckResult) -> str:
    summary = check.summary or check.outcome.value
    if check.outcome is Outcome.XPASSED:
        reason = f" ({check.expected_failure})" if check.expected_failure else ""
        return f"xpassed: declared expected to fail{reason} but passed; {summary}"
    if check.outcome is Outcome.INCONCLUSIVE:
        return f"inconclusive (--strict): {summary}"
    return summary


def _skip_message(check: CheckResult) -> str:
    if check.outcome is Outcome.XFAILED:
        reason = check.expected_failure or "declared expected failure"
        return f"xfailed: {reason}" + (f"; {check.summary}" if check.summary else "")
    return check.summary or check.mode_reason or "skipped"


def _clip(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."


def _seconds(value: float) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) \
        and value >= 0 else "0.000"


def _total(root: ET.Element, duration_s: float) -> None:
    """Write the count attributes of every suite and of the root from the elements themselves."""
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    time_total = 0.0
    for suite in root:
        counts = _counts(suite)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite_time = sum(float(c.get("time", "0")) for c in suite.iter("testcase")) + \
            sum(float(p.get("value", "0")) for p in suite.iter("property")
                if p.get("name") == "time.setup")
        suite.set("time", _seconds(suite_time))
        time_total += suite_time
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", _seconds(duration_s if duration_s else time_total))


def _counts(suite: ET.Element) -> dict[str, int]:
    cases = list(suite.iter("testcase"))
    return {
        "tests": len(cases),
        "failures": sum(1 for c in cases if c.find("failure") is not None),
        "errors": sum(1 for c in cases if c.find("error") is not None),
        "skipped": sum(1 for c in cases if c.find("skipped") is not None),
    }
