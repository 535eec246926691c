"""The layout of ARCHITECTURE.md: rooms on layers, pure renderers, no import circle, small modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gradtool"

# Each room may import rooms on lower layers only (and itself). Function-level imports count.
LAYERS = [
    {"errors", "results", "tracebacks", "_version", "heartbeat"},
    {"config"},
    {"numerics", "diagnosis", "graph", "render"},
    {"targets"},
    {"spec", "checks"},
    {"run"},
    {"api"},
    {"testing"},
    {"cli", "pytest_plugin"},
    {"__main__", "__init__"},
]
LAYER = {room: k for k, rooms in enumerate(LAYERS) for room in rooms}
# Narrower than their layer allows: renderers only read results; the graph room stands alone.
ONLY = {"render": {"results", "errors"}, "graph": set(), "diagnosis": set()}


def modules() -> dict[str, Path]:
    """Dotted module name below gradtool ('run.runner', 'api', '__init__') -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if len(parts) > 1 and parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(name: str) -> set[str]:
    """The gradtool modules a module imports anywhere in its body (resolved to files we have)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else \
        name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            stem = base + (node.module.split(".") if node.module else [])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gradtool"):
            stem = node.module.split(".")[1:]
        else:
            continue
        for alias in node.names:
            for candidate in (stem + [alias.name], stem):
                dotted = ".".join(candidate) or "__init__"
                if dotted in MODULES and dotted != name:
                    found.add(dotted)
                    break
    return found


def room(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_rooms_import_only_lower_layers(name):
    mine = room(name)
    for other in imports(name):
        theirs = room(other)
        if theirs == mine:
            continue
        assert LAYER[theirs] < LAYER[mine], f"{name} imports {other}: {theirs} is not below {mine}"
        if mine in ONLY:
            assert theirs in ONLY[mine], f"{name} may not import {other}"


def test_no_import_circle():
    graph = {name: imports(name) for name in MODULES}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                raise AssertionError("import circle: " + " -> ".join(path + [name, other]))
            if other not in state:
                visit(other, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_room_is_on_a_layer_and_few_modules_sit_at_the_top():
    rooms = {room(name) for name in MODULES} - {"schemas"}
    assert rooms <= set(LAYER), rooms - set(LAYER)
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 10, sorted(p.name for p in top)
    assert len([p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]) >= 6


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= 450, f"{name} has {lines} lines: split it by responsibility"


def test_architecture_names_every_room():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    missing = {r for r in rooms if not re.search(rf"`{r}/`", text)}
    assert not missing, f"ARCHITECTURE.md does not describe: {sorted(missing)}"


def test_every_module_opens_with_a_docstring():
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{name} needs a one-line docstring saying its job"
