"""Where custom Functions sit on a model's graph: whether the model is one Function, which
inputs a Function's node reaches, whether the model calls a custom op of the user's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from ..numerics.problem import Problem
from ..results import CheckResult, Severity
from ..targets.load import source_of
from ..targets.resolve import make_target


# Nodes whose backward only moves gradients (views, copies): autograd's own, exact.
_MOVES = frozenset({"Select", "Slice", "View", "UnsafeView", "Reshape", "ReshapeAlias",
                    "Unbind", "Squeeze", "Unsqueeze", "T", "Transpose", "Permute", "Alias",
                    "Clone"})


def is_whole(app: Any, outs: Sequence[torch.Tensor], n_leaves: int) -> bool:
    """Whether the model is the application: every differentiable argument is a leaf of the
    forward, every leaf is one, and each output reaches its node through views only."""
    diff = [k for k, v in enumerate(app.args) if isinstance(v, torch.Tensor) and v.requires_grad]
    if not outs or any(k not in app.anchors for k in diff) or \
            {app.anchors[k] for k in diff} != set(range(n_leaves)):
        return False
    return all(moved_from(o.grad_fn, app.node) for o in outs)


def moved_from(node: Any, origin: Any) -> bool:
    """node is origin, or reaches it through a chain of _MOVES nodes, one input each."""
    while node is not None and node is not origin:
        name = type(node).__name__
        if name.rstrip("0123456789").removesuffix("Backward") not in _MOVES:
            return False
        inputs = [n for n, _ in node.next_functions if n is not None]
        node = inputs[0] if len(inputs) == 1 else None
    return node is origin


def calls_user_ops(problem: Problem) -> bool:
    """Whether the model calls a custom op of the user's (one forward, only once such an op is
    registered in the process): then a Function is not the only custom code on the path."""
    from .ops_inside import record_ops, user_ops_exist

    if not user_ops_exist():
        return False
    try:
        return bool(record_ops(problem))
    except Exception:  # noqa: BLE001 - not knowing is no evidence for a shortcut
        return True




def failing_inputs(result: CheckResult) -> set[str]:
    """The inputs whose gradient failed: the mismatched blocks', else those a failure finding
    names (gradient.forward_precision's, where every block is right at the forward's own
    precision)."""
    found = {b.input for b in result.blocks if b.mismatched}
    return found or {name for f in result.findings if f.severity is Severity.FAILURE
                     for name in f.data.get("inputs", ())}


def named_whole(result: CheckResult, problem: Problem, app: Any) -> CheckResult:
    """The model's failure is its one Function's, told without checking it again: its
    blocks are rows of the Function's Jacobian at the very arguments it received."""
    names = problem.input_names
    failing = failing_inputs(result)
    target = make_target(app.cls, f"{app.cls.__module__}:{app.cls.__qualname__}")
    # by forward's own argument name; one of its *args has none: the model's name for it,
    # as the model's blocks name it (not argN)
    wrong = [target.arg_names[k] if k < len(target.arg_names) else names[leaf]
             for k, leaf in sorted(app.anchors.items()) if names[leaf] in failing]
    causes = [b.diagnosis for b in result.blocks if b.mismatched and b.diagnosis]
    verdict = "is wrong"
    if not any(b.mismatched for b in result.blocks):  # no wrong element (the forward's own
        # precision, say): named by its rules, the words being the finding's, said once
        verdict = "fails " + ", ".join(dict.fromkeys(
            f.rule for f in result.findings if f.severity is Severity.FAILURE))
    source = source_of(app.cls.backward)
    name, where = app.cls.__qualname__, app.created_at or "an unknown line"
    text = (f"{name} at {where} {verdict} w.r.t. {', '.join(wrong) or '?'} (backward at "
            f"{source}){': ' + causes[0] if causes else ''}")
    why = (f"not re-checked alone: the model is {name} applied to its own inputs, each output "
           f"a view of {name}'s, so the model's check is {name}'s own")
    return replace(result, details=(*result.details, text, why),
                   source=source or result.source)


def reaches(app: Any) -> set[int]:
    """The positions of the forward's leaves (app.leaves) that an application's node depends
    on: an AccumulateGrad node holds its leaf."""
    index = {id(leaf): k for k, leaf in enumerate(app.leaves)}
    stack, seen, found = [app.node], set(), set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        leaf = getattr(node, "variable", None)
        if leaf is not None and id(leaf) in index:
            found.add(index[id(leaf)])
        stack.extend(n for n, _ in node.next_functions)
    return found
