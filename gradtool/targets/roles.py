"""What a forward does with each argument, read from its source: called (a callable),
indexed by a string or .get() (an options dict), compared with a string (a method name).

Inference fills tensors only; an argument forward uses as one of these is not a tensor, so it
gets no `-i 3x4` hint and no tensor candidates (an ODE solver's Function.apply(func, y0, t,
method, options) would otherwise be tried with 400 tensors and hinted `-i 3x4` five times)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

CALLABLE, MAPPING, STRING = "a callable", "a dict", "a string"
_MAPPING_METHODS = {"get", "items", "keys", "values", "setdefault", "pop", "update"}
_ANNOTATIONS = {CALLABLE: ("Callable", "callable"), MAPPING: ("dict", "Dict", "Mapping"),
                STRING: ("str",)}


def argument_roles(target: Any) -> dict[str, str]:
    """{argument name: CALLABLE | MAPPING | STRING} for forward's non-tensor arguments that its
    annotations or its source show; empty where neither says (a lambda, a builtin)."""
    params = list(target.signature.parameters.values()) if target.signature else []
    roles = {p.name: role for p in params if (role := _annotated(p.annotation))}
    tree = _forward_tree(target)
    if tree is None:
        return roles
    names = {p.name for p in params} - set(roles)
    for node in ast.walk(tree):
        for name, role in _uses(node):
            if name in names:
                roles.setdefault(name, role)
    return roles


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


def role_hint(name: str, role: str) -> str:
    """How to give such an argument, or why -i cannot."""
    if role == CALLABLE:
        return (f"{name} takes {role}, which --input cannot give: check the module that calls "
                "this Function, or call gradtool.check(Target, inputs=(...)) from Python with "
                "your own callable")
    example = "\"{}\"" if role == MAPPING else "\"'NAME'\""
    return f"{name} takes {role}: give it as a literal, e.g. -i {example}"
