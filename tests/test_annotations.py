"""GitHub Actions annotations: outcome mapping, locations, escaping, auto-detection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradtool.errors import ConfigError
from gradtool.render.annotations import (annotations_enabled, escape_data, escape_property,
                                         relative_path, render_github, split_location,
                                         workflow_command)
from gradtool.results import (Block, CaseResult, CheckResult, Element, InputInfo, Outcome,
                              Rejected, Report, TargetResult)

_COMMAND = re.compile(r"^::(?P<cmd>[a-z]+)(?: (?P<props>[^:]*))?::(?P<msg>.*)$")


def unescape(text: str) -> str:
    """The runner's decoding (the inverse of actions/toolkit's escaping)."""
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def parse(line: str) -> tuple[str, dict[str, str], str]:
    """Split one workflow command as the runner does: command, properties, message."""
    match = _COMMAND.match(line)
    assert match, line
    props = {}
    for pair in filter(None, (match["props"] or "").split(",")):
        key, _, value = pair.partition("=")
        props[key] = unescape(value)
    return match["cmd"], props, unescape(match["msg"])


def make_report(outcomes, source="specs/m.py:12", target_source="specs/m.py:5",
                rejected=(), **config) -> Report:
    element = Element("tensor", (1, 2), "output 0", (1, 2), 1.0, 5.0, 4.0, 0.8)
    block = Block("tensor", (3, 3), "output 0", (3, 3), 81, 9, 4.0, 0.8, worst=(element,),
                  diagnosis="backward misses a constant factor 5")
    checks = tuple(CheckResult(name=f"c_{o.value}", outcome=o, summary=f"{o.value} summary",
                               blocks=(block,) if o is Outcome.FAILED else (), source=source,
                               traceback="Traceback\nValueError: bad" if o is Outcome.ERROR
                               else None, expected_failure="surrogate"
                               if o in (Outcome.XPASSED, Outcome.XFAILED) else None)
                   for o in outcomes)
    case = CaseResult("case0", 0, (InputInfo("tensor", "3x3", True),), checks,
                      reproduce="gradtool check specs/m.py:MulConstant --seed 0")
    target = TargetResult("specs/m.py:MulConstant", "function", "MulConstant", target_source,
                          (case,))
    return Report((target,), config=dict(config), versions={}, rejected=tuple(rejected))


def commands(report: Report, cwd: Path = Path("/nowhere")) -> list[tuple[str, dict, str]]:
    return [parse(line) for line in render_github(report, cwd=cwd).splitlines()]


@pytest.mark.parametrize("flag, env, expected", [
    ("github", {}, True), ("none", {"GITHUB_ACTIONS": "true"}, False),
    (None, {"GITHUB_ACTIONS": "true"}, True), ("auto", {"GITHUB_ACTIONS": "true"}, True),
    (None, {"GITHUB_ACTIONS": "false"}, False), (None, {}, False), (None, {"CI": "true"}, False),
])
def test_annotations_enabled(flag, env, expected):
    assert annotations_enabled(flag, env) is expected


def test_annotations_enabled_rejects_unknown_flag():
    with pytest.raises(ConfigError, match="'githb'") as info:
        annotations_enabled("githb", {})
    assert "did you mean 'github'" in str(info.value)


@pytest.mark.parametrize("outcome, command", [
    (Outcome.FAILED, "error"), (Outcome.ERROR, "error"), (Outcome.XPASSED, "error"),
    (Outcome.INCONCLUSIVE, "warning"), (Outcome.PASSED, None), (Outcome.SKIPPED, None),
    (Outcome.XFAILED, None),
])
def test_outcome_mapping(outcome, command):
    found = commands(make_report([outcome]))
    assert [c for c, _, _ in found] == ([command] if command else [])


def test_inconclusive_is_an_error_under_strict():
    found = commands(make_report([Outcome.INCONCLUSIVE], strict=True))
    assert [c for c, _, _ in found] == ["error"]


def test_failure_annotation_points_at_the_source_and_says_why():
    [(cmd, props, message)] = commands(make_report([Outcome.FAILED]))
    assert props == {"file": "specs/m.py", "line": "12",
                     "title": "gradtool c_failed failed: specs/m.py:MulConstant"}
    assert message.splitlines()[0] == "failed summary"
    assert "(1,2)->(1,2): analytical 1, numerical 5" in message  # render/words.py's words
    assert "backward misses a constant factor 5" in message
    assert message.endswith("reproduce: gradtool check specs/m.py:MulConstant --seed 0")


def test_error_and_xpassed_messages():
    found = commands(make_report([Outcome.ERROR, Outcome.XPASSED]))
    assert "ValueError: bad" in found[0][2]
    assert "declared expected to fail (surrogate) but passed" in found[1][2]


def test_each_annotation_is_one_line_with_escaped_newlines():
    text = render_github(make_report([Outcome.FAILED, Outcome.ERROR]), cwd=Path("/nowhere"))
    lines = text.splitlines()
    assert len(lines) == 2 and all(line.startswith("::error ") for line in lines)
    assert "%0A" in lines[0] and "\n" not in lines[0]
    assert "title=gradtool c_failed failed%3A specs/m.py%3AMulConstant" in lines[0]


def test_falls_back_to_the_target_source():
    [(_, props, _)] = commands(make_report([Outcome.FAILED], source=None))
    assert props["file"] == "specs/m.py" and props["line"] == "5"


def test_no_location_gives_no_file_property():
    [(_, props, _)] = commands(make_report([Outcome.FAILED], source=None, target_source=None))
    assert "file" not in props and "line" not in props and "title" in props


def test_absolute_path_inside_cwd_becomes_relative(tmp_path):
    source = f"{tmp_path / 'pkg' / 'ops.py'}:42"
    [(_, props, _)] = commands(make_report([Outcome.FAILED], source=source), cwd=tmp_path)
    assert props["file"] == "pkg/ops.py" and props["line"] == "42"


def test_absolute_path_outside_cwd_is_kept(tmp_path):
    [(_, props, _)] = commands(make_report([Outcome.FAILED], source="/elsewhere/ops.py:7"),
                               cwd=tmp_path)
    assert props["file"] == "/elsewhere/ops.py"


@pytest.mark.parametrize("source, expected", [
    ("specs/m.py:42", ("specs/m.py", 42)),
    ("./specs/../specs/m.py:3", ("specs/m.py", 3)),
    ("specs/m.py:42:7", ("specs/m.py", 42)),
    ("specs/m.py:MulConstant", ("specs/m.py", None)),
    ("specs/op.yaml", ("specs/op.yaml", None)),
    ("pkg.mod:Name", (None, None)),
    ("pkg.mod", (None, None)),
    ("", (None, None)),
    (None, (None, None)),
    ("C:/work/m.py:9", ("C:/work/m.py", 9)),
])
def test_split_location(source, expected):
    assert split_location(source, Path("/nowhere")) == expected


def test_relative_path_resolves_symlinked_cwd(tmp_path):
    real = tmp_path / "real"
    (real / "pkg").mkdir(parents=True)
    (real / "pkg" / "f.py").write_text("")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert relative_path(str(real / "pkg" / "f.py"), link) == "pkg/f.py"


def test_rejected_targets_are_errors():
    report = make_report([], rejected=[Rejected("specs/bad.yaml:3", "unknown key 'shpe'"),
                                       Rejected("pkg.mod:Nope", "no attribute 'Nope'")])
    found = commands(report)
    assert found[0] == ("error", {"file": "specs/bad.yaml", "line": "3",
                                  "title": "gradtool could not load specs/bad.yaml:3"},
                        "unknown key 'shpe'")
    assert "file" not in found[1][1] and found[1][2] == "no attribute 'Nope'"


def test_identical_annotations_are_not_repeated():
    report = make_report([Outcome.FAILED])
    twice = Report(report.targets * 2, report.config, report.versions)
    assert len(render_github(twice, cwd=Path("/nowhere")).splitlines()) == 1


def test_nothing_to_say_is_empty():
    assert render_github(make_report([Outcome.PASSED]), cwd=Path("/nowhere")) == ""


def test_escaping_rules():
    assert escape_data("100% done\r\nnext: a,b") == "100%25 done%0D%0Anext: a,b"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert workflow_command("warning", "m", file=None, line=None) == "::warning::m"
    assert workflow_command("error", "m", file="a.py", line=3) == "::error file=a.py,line=3::m"


NASTY = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)


@given(message=NASTY, title=NASTY, file=NASTY)
def test_any_text_round_trips_through_the_runner(message, title, file):
    line = workflow_command("error", message, file=file, title=title)
    assert "\n" not in line and "\r" not in line
    cmd, props, decoded = parse(line)
    assert (cmd, props, decoded) == ("error", {"file": file, "title": title}, message)
