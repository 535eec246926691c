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
    {"testing", "dropin"},
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


# --- findings all the way down: logic reads rule ids and data, never the words -------------------

TEXT_FIELDS = {"summary", "message", "details", "diagnosis"}  # what renderers show, made of words


def _text_field(node: ast.AST) -> bool:
    """node is `<something>.summary` (or .message, .details, .diagnosis), subscripted or not."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr in TEXT_FIELDS


def _reads_text(tree: ast.AST) -> list[int]:
    """Lines deciding on words: `"x" in c.summary`, `f.message.startswith(...)`, `c.summary ==`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            pairs = zip([node.left, *node.comparators], node.comparators, node.ops)
            for left, right, op in pairs:
                if isinstance(op, (ast.In, ast.NotIn)) and _text_field(right) or \
                        isinstance(op, (ast.Eq, ast.NotEq)) and (_text_field(left)
                                                                 or _text_field(right)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith", "find", "index", "count") and \
                _text_field(node.func.value):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_logic_reads_a_message_summary_or_detail(name):
    found = _reads_text(ast.parse(MODULES[name].read_text()))
    assert not found, f"{name} decides on report words at lines {found}: read rule ids and data"


def test_the_text_rule_catches_what_it_forbids():
    for bad in ('"mark_dirty" in f.message', 'c.summary == d.summary', 'x.message.startswith("a")',
                '"words" not in c.details[0]'):
        assert _reads_text(ast.parse(bad)), bad
    for fine in ('f.rule in ignore', 'f.data.get("input") == b.input', 'c.summary.split(":")'):
        assert not _reads_text(ast.parse(fine)), fine


# The line openings of render/words.py: the vocabulary of reports, never a check's.
RENDERER_WORDS = ("diagnosis: ", "rules broken: ", "look at: ", "reproduce: ", "mode: ",
                  "traceback (user code)", "declared expected failure: ")


@pytest.mark.parametrize("name", sorted(n for n in MODULES if room(n) == "checks"))
def test_checks_write_no_renderer_wording(name):
    tree = ast.parse(MODULES[name].read_text())
    assert not any(room(m) == "render" for m in imports(name)), f"{name} imports a renderer"
    said = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value.startswith(RENDERER_WORDS)]
    assert not said, f"{name} writes a report's own words at lines {said}"


def _literal_tail(node: ast.AST) -> str | None:
    """A rule id written in code: the constant, or an f-string's text after its last field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and isinstance(node.values[-1], ast.Constant):
        return node.values[-1].value
    return None


def test_every_finding_and_diagnosis_written_in_code_names_a_registered_rule():
    from gradtool.config.registry import RULE_IDS

    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("Finding", "Diagnosis") and node.args):
                continue
            text = _literal_tail(node.args[0])
            if text is None:
                continue  # a rule carried over from another finding (f.rule)
            if node.func.id == "Diagnosis":  # a kind: some Jacobian check's rule
                assert any(r.endswith(f".{text}") for r in RULE_IDS), (name, node.lineno, text)
            elif isinstance(node.args[0], ast.Constant):
                assert text in RULE_IDS, (name, node.lineno, text)
            else:  # f"{name}.mismatch": a rule every check that names it declares
                assert any(r.endswith(text) for r in RULE_IDS), (name, node.lineno, text)


# --- kinds and check names are switched on in one place each ---------------------------------
# A target's kind is asked of its adapter (targets/kinds.py), a check's traits of its registry
# entry (config/registry.py): comparing their names anywhere else is the scattering that made a
# new kind touch twelve modules and a new check four tests.
KIND_HOME = "targets.kinds"
NAME_HOME = "config.registry"


def _strings(node: ast.AST) -> set[str]:
    """A string literal's value, or those of a tuple/list/set of literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def _is_kind(node: ast.AST) -> bool:
    """`kind`, `x.kind`, `x["kind"]`, `target_kind`: an expression naming a kind."""
    if isinstance(node, ast.Name):
        return node.id == "kind" or node.id.endswith("_kind")
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return _strings(node.slice) == {"kind"}
    return False


def switches(source: str, kinds: set[str], checks: set[str]) -> list[str]:
    """Where source compares a kind with a kind's name, or anything with a check's name (or
    tests a prefix of one, `startswith("op_")`), or spells a set of check names."""
    prefixes = {name[:k + 1] for name in checks for k, c in enumerate(name) if c == "_"}
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = set().union(*(_strings(o) for o in operands))
            if literals & kinds and any(_is_kind(o) for o in operands):
                found.append(f"{where}: kind compared with {sorted(literals & kinds)}")
            if literals & checks:
                found.append(f"{where}: check name compared: {sorted(literals & checks)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and node.args and \
                _strings(node.args[0]) & (checks | prefixes):
            found.append(f"{where}: check name tested by {node.func.attr}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
                len(_strings(node) & checks) >= 2 and len(_strings(node)) == len(node.elts):
            found.append(f"{where}: a set of check names {sorted(_strings(node) & checks)}")
    return found


def _vocabulary() -> tuple[set[str], set[str]]:
    from gradtool.config.registry import CHECK_NAMES
    from gradtool.targets.kinds import NAMES

    return set(NAMES), set(CHECK_NAMES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_kinds_and_check_names_are_switched_on_only_at_home(name):
    kinds, checks = _vocabulary()
    found = switches(MODULES[name].read_text(), kinds if name != KIND_HOME else set(),
                     checks if name != NAME_HOME else set())
    assert not found, f"{name}: ask the kind adapter or the registry instead: {found}"


@pytest.mark.parametrize("planted", [
    'if target.kind == "op": pass',
    'if job.target.kind in ("module", "callable"): pass',
    'if entry["kind"] != "function": pass',
    'x = [c for c in checks if c.name == "contract"]',
    'if check.startswith("op_"): pass',
    'NEEDS = ("gradient", "double_backward")\nok = name in NEEDS',
    'if "double_backward" in config.checks: pass',
])
def test_the_switch_rule_finds_a_planted_switch(planted):
    kinds, checks = _vocabulary()
    assert switches(planted, kinds, checks)


@pytest.mark.parametrize("innocent", [
    'if target.kind.op: pass',                     # asking the adapter
    'if domain.kind == "integer": pass',           # another vocabulary's kind
    'if kind != "forward": pass',
    'result = CheckResult("gradient", outcome)',   # naming, not switching
    'info = BY_NAME["op_schema"]',
])
def test_the_switch_rule_lets_the_adapter_and_registry_questions_pass(innocent):
    kinds, checks = _vocabulary()
    assert not switches(innocent, kinds, checks)
