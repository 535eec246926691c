"""GitHub Actions workflow commands (::error / ::warning) that point at the user's failing code."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePath

from ..errors import ConfigError, did_you_mean
from ..results import CaseResult, CheckResult, Outcome, Report, TargetResult
from .words import block_lines, broken_rules, finding_lines, other_label, rules_text

ANNOTATION_CHOICES = ("auto", "github", "none")

# A location is "file:line"; anything else with a colon ("pkg.mod:Name") is a target, not a file.
_FILE_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::\d+)?$")
_SOURCE_SUFFIXES = (".py", ".yaml", ".yml")


def annotations_enabled(flag: str | None, env: Mapping[str, str]) -> bool:
    """--annotations github|none decides; without it (or 'auto'), GITHUB_ACTIONS=true does."""
    if flag is None or flag == "auto":
        return env.get("GITHUB_ACTIONS", "").strip().lower() == "true"
    if flag == "github":
        return True
    if flag == "none":
        return False
    raise ConfigError(f"--annotations {flag!r} is not one of {', '.join(ANNOTATION_CHOICES)}",
                      did_you_mean(flag, ANNOTATION_CHOICES))


def escape_data(text: str) -> str:
    """Escape a message the way actions/toolkit does, so newlines survive as one command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a property value: as a message, plus the ':' and ',' that delimit properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: str | int | None) -> str:
    """One '::command k=v,...::message' line; None properties are left out."""
    props = ",".join(f"{key}={escape_property(str(value))}"
                     for key, value in properties.items() if value is not None)
    return f"::{command}{' ' + props if props else ''}::{escape_data(message)}"


def render_github(report: Report, cwd: Path | None = None) -> str:
    """Workflow commands for every check that fails the run (and warnings for inconclusive ones)."""
    base = Path.cwd() if cwd is None else cwd
    strict = bool(report.config.get("strict"))
    lines: list[str] = []
    for target, case, check in report.checks():
        command = _command(check.outcome, strict)
        if command is None:
            continue
        file, line = split_location(check.source or target.source, base)
        title = f"gradtool {check.name} {check.outcome.value}: {target.target}"
        lines.append(workflow_command(command, annotation_message(target, case, check),
                                      file=file, line=line, title=title))
    for target, case, check in report.checks():
        lines += _warnings(target, case, check, base, strict)
    for rejected in report.rejected:
        file, line = split_location(rejected.source, base)
        lines.append(workflow_command("error", rejected.message, file=file, line=line,
                                      title=f"gradtool could not load {rejected.source}"))
    lines += [workflow_command("warning", f"{name} was not checked: the run was interrupted by "
                               f"{report.interrupted or 'a signal'}", title="gradtool: not run")
              for name in report.not_run]
    # Several cases of one target can fail identically; one annotation per distinct line is enough.
    unique = list(dict.fromkeys(lines))
    return "\n".join(unique) + ("\n" if unique else "")


def _warnings(target: TargetResult, case: CaseResult, check: CheckResult, base: Path,
              strict: bool) -> list[str]:
    """One ::warning per warning of a check that passed (::error under --strict)."""
    if check.outcome is not Outcome.PASSED:
        return []
    lines = []
    for finding in check.warnings:
        file, line = split_location(finding.source or check.source or target.source, base)
        title = f"gradtool {check.name} warning {finding.rule}: {target.target}"
        message = f"{finding.message}\ncase {case.label}, seed {case.seed}"
        lines.append(workflow_command("error" if strict else "warning", message, file=file,
                                      line=line, title=title))
    return lines


def _command(outcome: Outcome, strict: bool) -> str | None:
    if outcome in (Outcome.FAILED, Outcome.ERROR, Outcome.XPASSED):
        return "error"
    if outcome is Outcome.INCONCLUSIVE:
        return "error" if strict else "warning"
    return None


def annotation_message(target: TargetResult, case: CaseResult, check: CheckResult) -> str:
    """A short multi-line message: what failed, the worst elements, why, and how to reproduce."""
    lines = [check.summary or f"{check.name} {check.outcome.value}"]
    if check.outcome is Outcome.XPASSED:
        reason = f" ({check.expected_failure})" if check.expected_failure else ""
        lines.append(f"declared expected to fail{reason} but passed: remove the declaration")
    lines += [*check.details, *finding_lines(check)][:5]
    for block in check.blocks:
        if block.mismatched:
            lines += block_lines(block, check.tolerance, other_label(check), max_worst=3,
                                 mode=check.mode)
    if broken_rules(check):
        lines.append(rules_text(check))
    if check.traceback:
        # The last traceback line is the exception itself; the rest is in the log.
        lines.append(check.traceback.rstrip().splitlines()[-1])
    lines.append(f"case {case.label}, seed {case.seed}")
    if case.reproduce:
        lines.append(f"reproduce: {case.reproduce}")
    return "\n".join(lines)


def split_location(source: str | None, cwd: Path) -> tuple[str | None, int | None]:
    """'path/file.py:42' -> ('path/file.py', 42), the path made relative to cwd when inside it."""
    if not source:
        return None, None
    match = _FILE_LINE.match(source)
    if match:
        return relative_path(match["file"], cwd), int(match["line"])
    path_part = source.rsplit(":", 1)[0] if ":" in source[2:] else source
    if path_part.endswith(_SOURCE_SUFFIXES):
        return relative_path(path_part, cwd), None     # "path/file.py:Name": the file, no line
    return None, None                                   # "pkg.mod:Name": not a file GitHub can show


def relative_path(path: str, cwd: Path) -> str:
    """Posix path relative to cwd when it lies inside it (what GitHub expects), else unchanged."""
    pure = Path(path)
    if not pure.is_absolute():
        return PurePath(os.path.normpath(path)).as_posix()
    for base in _bases(cwd):
        for candidate in (pure, _resolved(pure)):
            try:
                return candidate.relative_to(base).as_posix()
            except ValueError:
                continue
    return pure.as_posix()


def _bases(cwd: Path) -> list[Path]:
    # Both the spelled and the resolved cwd: /tmp vs /private/tmp, symlinked checkouts.
    return list(dict.fromkeys([cwd.absolute(), _resolved(cwd)]))


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path
