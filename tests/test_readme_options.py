"""Every command and every long option of the CLI is documented (README.md or docs/)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from gradtool.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Prose pages only: docs/cli.md is generated from the same options, so it cannot miss one.
PROSE = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]


def walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """(command path..., option) for every long option name, subcommands included."""
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                if name.startswith("--"):
                    yield (*path, name)
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


OPTIONS = sorted(set(walk(main)))
COMMANDS = sorted(main.commands)


@pytest.fixture(scope="module")
def readme() -> str:
    if not README.is_file():
        pytest.fail(f"{README} is missing")
    return "\n".join(path.read_text(encoding="utf-8") for path in PROSE)


def mentioned(text: str, word: str) -> bool:
    # Whole option only: --json must not count as documented because --json-xml is.
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_the_walk_finds_the_options():
    # Guards the walk itself: a refactor of the command tree must not make this test vacuous.
    assert ("--version",) in OPTIONS and ("check", "--junit-xml") in OPTIONS
    assert {"check", "graph", "list", "config"} <= set(COMMANDS)


@pytest.mark.parametrize("entry", OPTIONS, ids=" ".join)
def test_option_is_documented(readme, entry):
    *command, option = entry
    where = f"gradtool {' '.join(command)}".rstrip()
    assert mentioned(readme, option), f"{where} {option} is not explained in README.md or docs/"


@pytest.mark.parametrize("command", COMMANDS)
def test_command_is_documented(readme, command):
    assert mentioned(readme, f"gradtool {command}"), f"`gradtool {command}` is not in README.md or docs/"
