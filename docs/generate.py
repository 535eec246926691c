"""Regenerate the docs' generated blocks (option tables from click, rule and check tables from the
registry): `python docs/generate.py` rewrites them, `--check` exits 1 where one is stale."""

# A block is everything between `<!-- generated: NAME ... -->` and `<!-- end generated -->` in
# docs/*.md; NAME picks the generator below. tests/test_docs.py compares every block with what
# these functions produce from the installed code, so a new option or rule fails the suite until
# this script is run.

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import click

DOCS = Path(__file__).resolve().parent
BLOCK = re.compile(r"(<!-- generated: (\S+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def _cell(text: str) -> str:
    """Table-safe text: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def rules() -> str:
    from gradtool.config.registry import REGISTRY

    rows = [f"| `{rule.id}` | {rule.severity} | {_cell(rule.description)} |"
            for info in REGISTRY for rule in info.rules]
    return "\n".join(["| rule id | severity | what it means |", "|---|---|---|", *rows])


def checks() -> str:
    from gradtool.config.registry import REGISTRY

    rows = [f"| `{info.name}` | {'yes' if info.default else 'opt-in'} | {_cell(info.description)} |"
            for info in REGISTRY]
    return "\n".join(["| check | default | what it verifies |", "|---|---|---|", *rows])


def _option_row(param: click.Option) -> str:
    names = ", ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
    return f"| {names} | {_cell(param.help or '')} |"


def _command_section(name: str, command: click.Command) -> list[str]:
    summary = _cell((command.help or "").split("\n\n")[0])
    args = " ".join(p.human_readable_name for p in command.params
                    if isinstance(p, click.Argument))
    lines = [f"### `gradtool {name}{' ' + args if args else ''}`", "", summary, ""]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    if options:
        lines += ["| option | meaning |", "|---|---|", *map(_option_row, options)]
    else:
        lines.append("No options.")
    return [*lines, ""]


def options() -> str:
    from gradtool.cli.main import main

    lines = ["### `gradtool`", "", "| option | meaning |", "|---|---|",
             *(_option_row(p) for p in main.params if isinstance(p, click.Option)), ""]
    for name, command in sorted(main.commands.items()):
        lines += _command_section(name, command)
    return "\n".join(lines).rstrip("\n")


GENERATORS: dict[str, Callable[[], str]] = {"rules": rules, "checks": checks, "options": options}


def regenerate(text: str) -> str:
    """text with every generated block replaced by its generator's output."""

    def fill(match: re.Match) -> str:
        return f"{match[1]}{GENERATORS[match[2]]()}\n{match[4]}"

    return BLOCK.sub(fill, text)


def main(argv: list[str]) -> int:
    stale = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        new = regenerate(text)
        if new != text:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(new, encoding="utf-8")
    verb = "stale" if "--check" in argv else "regenerated"
    print(f"{verb}: {', '.join(stale)}" if stale else "docs up to date")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
