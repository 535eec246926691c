"""The drop-in's budget for the culprit search (run/culprit.py) on a failing call.

Torch's failing gradcheck pays one sweep of the call's Jacobian, which the drop-in's lean path
has paid already; checking each custom Function inside alone is another sweep, and where a
Function's arguments are the model's own inputs each of its columns replays the whole forward
(entmax's losses: 81 more forwards, as many as the sweep). So in gradcheck's scope
(`module_parameters` off: the drop-in's setting), not exhaustive, the search runs only where
it is cheap; elsewhere the report names the Functions inside and how to check them alone
(`gradtool.check(..., exhaustive=True)`, the CLI's `--exhaustive`). The command line's and the
library's runs search as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics.handed import served_graph, served_seconds
from ..numerics.problem import Problem, function_nodes, select_outputs
from .paths import moved_from

# Cheap: few evaluations (each Function's columns and f(x), 2n + 1: Functions of 7 elements
# in all at most), their predicted time (each at most one forward of the model: the drop-in
# call's own, timed) within about what the report's own Python costs.
FEW, CHEAP_S = 16, 0.02


def over_budget(problem: Problem, config: CheckConfig, apps: Sequence[Any]) -> str | None:
    """For the drop-in (gradcheck's scope, not exhaustive), the report's line where checking
    each of the Function applications `apps` (the recording forward's, one per class and call
    site) alone is not cheap, saying how to get it; else None (the search runs)."""
    if not config.gradcheck_cost or not apps:
        return None
    columns = sum(2 * v.numel() + 1 for app in apps for v in app.args
                  if isinstance(v, torch.Tensor) and v.requires_grad)
    seconds = served_seconds()  # the drop-in's own forward, else the recording one's (hooked)
    per = problem.cache.applications_s if seconds is None else seconds
    if columns <= FEW and columns * per <= CHEAP_S:
        return None
    return _not_alone([app.cls for app in apps], columns)


def over_on_graph(problem: Problem, config: CheckConfig) -> str | None:
    """over_budget read off the drop-in call's own graph (numerics/handed.py), without the
    recording forward: where the model may be its one Function (the shortcut that names it
    free), or the graph does not tell the sizes, None (over_budget decides). Each class's
    cheapest node counts: the search checks each class and call site once."""
    if not config.gradcheck_cost:
        return None
    kept = served_graph(problem.fn, problem.diff, problem.inputs)
    if kept is None:
        return None
    try:
        outs = [o for o in select_outputs(kept[1], problem.output_mask) if o.requires_grad]
        nodes = [n for n in function_nodes(outs).values()
                 if n._forward_cls.__module__.split(".")[0] != "torch"]
        if not nodes or len(nodes) == 1 and all(moved_from(o.grad_fn, nodes[0]) for o in outs):
            return None
        least: dict[type, int] = {}
        for node in nodes:
            columns = 2 * sum(math.prod(f._input_metadata[k].shape)
                              for f, k in node.next_functions if f is not None) + 1
            least[node._forward_cls] = min(least.get(node._forward_cls, columns), columns)
    except Exception:  # noqa: BLE001 - an older torch's nodes (no _input_metadata): record
        return None
    return _not_alone(list(least), sum(least.values())) if sum(least.values()) > FEW else None


def _not_alone(classes: Sequence[type], columns: int) -> str:
    names = list(dict.fromkeys(cls.__qualname__ for cls in classes))
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return (f"the custom Function(s) inside ({listed}) not checked alone, for cost (about "
            f"{columns} more evaluations of the forward, beyond what torch's failing gradcheck "
            "pays): gradtool.check(..., exhaustive=True), or --exhaustive on the command line, "
            "checks each alone and names the wrong one")
