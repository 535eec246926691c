"""The import rules of the design: leaves stay leaves, renderers only read results, no cycles to cli."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gradtool"
LEAVES = {"errors": set(), "config": {"errors"}, "results": set()}
# The command layer may use everything; core modules may not reach up into it.
COMMAND_LAYER = {"cli", "commands", "api", "testing", "pytest_plugin", "listing", "__main__"}
FACADES = {PACKAGE / "__init__.py"}  # the public API re-exports gradtool.api lazily


def gradtool_imports(path: Path) -> set[str]:
    """Top names of gradtool modules a file imports ('render.terminal' -> 'render')."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            folder = path.parent.relative_to(PACKAGE).parts
            base = folder[: len(folder) - node.level + 1]
            parts = list(base) + (node.module.split(".") if node.module else [])
            names = [parts[0]] if parts else [alias.name for alias in node.names]
            found.update(names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gradtool."):
            found.add(node.module.split(".")[1])
    return found


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("leaf, allowed", LEAVES.items())
def test_leaves_import_only_leaves(leaf, allowed):
    assert gradtool_imports(PACKAGE / f"{leaf}.py") <= allowed


def test_renderers_read_results_only():
    for path in (PACKAGE / "render").glob("*.py"):
        extra = gradtool_imports(path) - {"results", "config", "errors", "render"}
        # render/graph.py renders gradtool.graph's plain dataclasses (imported for typing only).
        assert extra <= ({"graph"} if path.name == "graph.py" else set()), (path.name, extra)


def test_core_never_imports_render_or_the_command_layer():
    for path in modules():
        name = path.stem if path.parent == PACKAGE else path.parent.name
        if name in COMMAND_LAYER or name == "render" or path in FACADES:
            continue
        bad = gradtool_imports(path) & (COMMAND_LAYER | {"render"})
        assert not bad, (str(path.relative_to(PACKAGE)), bad)


def test_nothing_imports_cli():
    for path in modules():
        if path.name in ("cli.py", "__main__.py"):
            continue
        assert "cli" not in gradtool_imports(path), path
