"""README examples stay true: its spec example loads, its failure example matches real output."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from conftest import EXAMPLES, ROOT
from gradtool.cli.main import main
from gradtool.spec.schema import load_text

README = (ROOT / "README.md").read_text()


def test_readme_spec_example_is_valid():
    blocks = re.findall(r"```yaml\n(.*?)```", README, re.S)
    assert blocks, "README shows a spec example"
    specs = load_text(blocks[0], "README.md", base_dir=Path(EXAMPLES))
    assert len(specs) == 4 and specs[3].surrogate is not None


def test_readme_failure_example_matches_the_tool(monkeypatch):
    monkeypatch.chdir(ROOT)
    shown = re.search(r"### A failure reads like this\n\n```\n(.*?)```", README, re.S).group(1)
    command = re.search(r"reproduce: (gradtool check .*)", shown).group(1).split()[2:]
    result = CliRunner().invoke(main, ["check", *command, "--check", "gradient"])
    assert result.exit_code == 1
    for line in shown.splitlines():
        if "mode:" in line or "predicted" in line:
            continue  # timing-dependent wording
        assert line.rstrip() in result.output, line


def test_readme_sweep_example_finds_the_tail_block_bug(monkeypatch):
    monkeypatch.chdir(ROOT)
    shown = re.search(r"### Sizes and sweeps.*?```\n\$ (gradtool check .*?)\n(.*?)```", README,
                      re.S)
    command, output = shown.group(1).split()[2:], shown.group(2)
    result = CliRunner().invoke(main, ["check", *command, "--no-isolate"])
    assert result.exit_code == 1
    for line in output.strip().splitlines():
        assert line in result.output, line
    assert "reproduce: gradtool check tests/fixtures/layouts.py:RowSumTail -i 4x17 --seed 0" \
        in result.output
