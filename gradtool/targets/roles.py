"""What a forward does with each argument: called (a callable), indexed by a string or .get()
(an options dict), compared with a string (a method name), read from its annotations and its
source.

Inference samples tensors only. An annotation (`scale: Callable`) decides at once: that
argument gets no tensor candidates and no `-i 3x4` hint (an ODE solver's Function.apply(func,
y0, t, method, options) would otherwise be tried with 400 tensors). A role read from the
source is a hint only: an argument may take a tensor or a callable (`scale(x) if
callable(scale) else scale`), so inference tries tensors first and names the role only when
forward then refuses them all; a use behind a `callable(...)` or `isinstance(...)` guard does
not count."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

CALLABLE, MAPPING, STRING = "a callable", "a dict", "a string"
_MAPPING_METHODS = {"get", "items", "keys", "values", "setdefault", "pop", "update"}
_ANNOTATIONS = {CALLABLE: ("Callable", "callable"), MAPPING: ("dict", "Dict", "Mapping"),
                STRING: ("str",)}
_GUARDS = {"callable", "isinstance", "hasattr"}  # a test that an argument may be of two kinds
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


@dataclass(frozen=True)
class Role:
    """What an argument is used as (CALLABLE, MAPPING, STRING); `declared`: by an annotation
    (a verdict), else read from the source (a hint, until forward refuses tensors)."""

    words: str
    declared: bool


def argument_roles(target: Any) -> dict[str, Role]:
    """{argument name: Role} for forward's non-tensor arguments that its annotations or its
    source show; empty where neither says (a lambda, a builtin)."""
    params = list(target.signature.parameters.values()) if target.signature else []
    roles = {p.name: Role(words, True) for p in params if (words := _annotated(p.annotation))}
    tree = _forward_tree(target)
    if tree is None:
        return roles
    names = {p.name for p in params} - set(roles)
    found: dict[str, str] = {}
    _walk(tree, frozenset(), found)
    return roles | {name: Role(words, False) for name, words in found.items() if name in names}


def _annotated(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                   repr(annotation))
    if "Tensor" in text:
        return None
    head = text.replace("typing.", "").replace("collections.abc.", "").split("[")[0].strip()
    return next((role for role, words in _ANNOTATIONS.items() if head in words), None)


def _forward_tree(target: Any) -> ast.AST | None:
    fn = getattr(target.function_cls, "forward", None) if target.function_cls else None
    fn = fn or getattr(target.obj, "forward", None) or target.obj
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None


def _walk(node: ast.AST, guarded: frozenset[str], found: dict[str, str]) -> None:
    """Collect the uses under `node` into `found`, leaving out those of a guarded name: inside
    an if/while/conditional expression whose test guards it (either branch: `if not
    callable(f)` guards the else), after a guard in an `and`/`or`, and after an `if guard:
    return` in the same block."""
    if isinstance(node, (ast.If, ast.IfExp, ast.While)):
        _walk(node.test, guarded, found)
        inner = guarded | _guarded(node.test)
        for branch in (node.body, node.orelse):
            _walk_block(branch if isinstance(branch, list) else [branch], inner, found)
        return
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _walk(value, guarded, found)
            guarded = guarded | _guarded(value)
        return
    for name, role in _uses(node):
        if name not in guarded:
            found.setdefault(name, role)
    for _, value in ast.iter_fields(node):
        if isinstance(value, ast.AST):
            _walk(value, guarded, found)
        elif isinstance(value, list):
            _walk_block(value, guarded, found)


def _walk_block(items: list[Any], guarded: frozenset[str], found: dict[str, str]) -> None:
    for item in items:
        if not isinstance(item, ast.AST):
            continue
        _walk(item, guarded, found)
        if isinstance(item, ast.If) and item.body and isinstance(item.body[-1], _EXITS):
            guarded = guarded | _guarded(item.test)  # the rest is the guard's other branch


def _guarded(test: ast.AST) -> frozenset[str]:
    """Names a test asks the kind of: callable(x), isinstance(x, ...), hasattr(x, ...)."""
    return frozenset(node.args[0].id for node in ast.walk(test)
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                     and node.func.id in _GUARDS and node.args
                     and isinstance(node.args[0], ast.Name))


def _uses(node: ast.AST) -> list[tuple[str, str]]:
    """(name, role) for the argument uses one AST node shows."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return [(node.func.id, CALLABLE)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and node.func.attr in _MAPPING_METHODS:
        return [(node.func.value.id, MAPPING)]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
            and _is_str(node.slice):
        return [(node.value.id, MAPPING)]
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        if any(_is_str(s) or _all_str(s) for s in sides):
            return [(s.id, STRING) for s in sides if isinstance(s, ast.Name)]
    return []


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _all_str(node: ast.AST) -> bool:
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) \
        and all(_is_str(e) for e in node.elts)


def role_hint(name: str, role: Role, target: Any) -> str:
    """How to give such an argument, or why -i cannot (in the words of the target's kind)."""
    if role.words == CALLABLE:
        return (f"{name} takes {role.words}, which --input cannot give: {_caller(target)}, or "
                f"call gradtool.check({_short(target)}, inputs=(...)) from Python with your "
                "own callable")
    example = "\"{}\"" if role.words == MAPPING else "\"'NAME'\""
    return f"{name} takes {role.words}: give it as a literal, e.g. -i {example}"


def _caller(target: Any) -> str:
    """Where such an argument is given already: the code that calls the target."""
    if target.kind.function_class:
        return "check the module that calls this Function"
    if target.kind.parameters:
        return "check the model that calls this module"
    return f"check the module or function that calls {_short(target)}"


def _short(target: Any) -> str:
    return target.name.rsplit(":", 1)[-1].rsplit(".", 1)[-1] or "the target"
