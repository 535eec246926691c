"""The docs stay true and single: generated tables match the code, no block is written twice,
links resolve, the README stays a README."""

from __future__ import annotations

import importlib.util
import re
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import ROOT

MARKDOWN = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md",
                   ROOT / "benchmarks" / "README.md", ROOT / "specs" / "README.md",
                   *(ROOT / "docs").glob("*.md")])


def load_generator():
    spec = importlib.util.spec_from_file_location("gradtool_docs_generate",
                                                  ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = load_generator()


def paragraphs(text: str) -> list[str]:
    """Blocks between blank lines, whitespace folded; a code fence is one block."""
    blocks, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            blocks.append(" ".join(" ".join(current).split()))
            current = []
        else:
            current.append(line)
    blocks.append(" ".join(" ".join(current).split()))
    return [block for block in blocks if block]


def test_every_markdown_file_is_there():
    missing = [str(path) for path in MARKDOWN if not path.is_file()]
    assert not missing and len(MARKDOWN) >= 10, missing


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_generated_blocks_match_the_code(path):
    # Stale after a new option, check or rule: run `python docs/generate.py`.
    text = path.read_text(encoding="utf-8")
    assert GENERATE.regenerate(text) == text, f"docs/{path.name} is stale: python docs/generate.py"


def test_the_generated_blocks_exist_and_carry_the_registry():
    from gradtool.config.registry import REGISTRY, RULE_IDS

    names = [m[2] for path in (ROOT / "docs").glob("*.md")
             for m in GENERATE.BLOCK.finditer(path.read_text(encoding="utf-8"))]
    assert sorted(names) == sorted(GENERATE.GENERATORS), names
    rules, checks = GENERATE.rules(), GENERATE.checks()
    assert all(f"| `{rule}` |" in rules for rule in RULE_IDS)
    assert all(f"| `{info.name}` |" in checks for info in REGISTRY)


def test_a_stale_block_is_rewritten_and_reported(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# x\n\n<!-- generated: rules -->\n| old |\n<!-- end generated -->\n")
    monkeypatch.setattr(GENERATE, "DOCS", tmp_path)
    assert GENERATE.main(["--check"]) == 1 and "| old |" in page.read_text()
    assert GENERATE.main([]) == 0 and "| old |" not in page.read_text()
    assert GENERATE.main(["--check"]) == 0


def test_no_paragraph_is_written_twice():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in MARKDOWN:
        for block in paragraphs(path.read_text(encoding="utf-8")):
            if len(block) >= 60 and not block.startswith("<!--"):
                seen[block].append(str(path.relative_to(ROOT)))
    repeated = {block[:80]: where for block, where in seen.items() if len(where) > 1}
    assert not repeated, repeated


def heading_paths(text: str) -> list[tuple[str, ...]]:
    """Each heading with the headings above it: CHANGELOG's '### Added' under two releases are
    two paths, a section pasted twice is one path twice."""
    fenced, stack, paths = False, [], []
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (found := re.match(r"(#+) (.*)", line)):
            level = len(found[1])
            stack = [*(h for h in stack if h[0] < level), (level, found[2].strip())]
            paths.append(tuple(title for _, title in stack))
    return paths


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_heading_is_repeated_in_a_file(path):
    paths = heading_paths(path.read_text(encoding="utf-8"))
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    assert not repeated, repeated


def test_the_duplicate_detectors_find_a_copy():
    text = "# a\n\nsome paragraph long enough to count as one, repeated word for word.\n\n"
    blocks = paragraphs(text * 2)
    assert blocks.count(blocks[1]) == 2
    assert heading_paths("# a\n## b\n## c\n## b\n") == [("a",), ("a", "b"), ("a", "c"),
                                                          ("a", "b")]
    assert heading_paths("# x\n## 1\n### Added\n## 2\n### Added\n")[3:] == [("x", "2"),
                                                                              ("x", "2", "Added")]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, broken


def test_readme_is_short_and_names_both_test_tiers():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert "pytest -n auto" in text and 'pytest -m "not slow" -n auto' in text


def test_ci_runs_the_readme_full_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pytest -n auto" in ci and "gradtool check specs/" in ci and "torch==2.13.0" in ci


def test_the_slow_list_names_existing_files_and_tests():
    from slow_tests import SLOW_FILES, SLOW_TESTS

    tests = ROOT / "tests"
    assert all((tests / name).is_file() for name in SLOW_FILES), SLOW_FILES
    for name, functions in SLOW_TESTS.items():
        source = (tests / name).read_text(encoding="utf-8")
        missing = [f for f in functions if not re.search(rf"^def {f}\(", source, re.M)]
        assert not missing, (name, missing)
