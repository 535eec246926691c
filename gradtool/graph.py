"""Autograd graph walk: run a forward, read the backward graph it recorded into plain data."""

from __future__ import annotations

import inspect
import math
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Source:
    """The forward line that created a node: the innermost frame outside torch and gradtool."""

    file: str
    line: int
    function: str
    code: str


@dataclass(frozen=True)
class Saved:
    """One saved value of a node: a tensor (shape, dtype) or a plain value (its short repr)."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    value: str | None = None
    arg: str | None = None  # the saved tensor is this argument
    output_of: str | None = None  # the saved tensor is an output of this node (id)


@dataclass(frozen=True)
class Leaf:
    """The tensor an AccumulateGrad node writes .grad into."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    named: bool  # False for a leaf that is none of the arguments (made inside the forward)


@dataclass(frozen=True)
class GradStat:
    """One gradient tensor seen during backward; norm is None when it is not finite."""

    norm: float | None
    nan: bool = False
    inf: bool = False
    zero: bool = False


@dataclass(frozen=True)
class Problem:
    """A node where a gradient goes bad (NaN, Inf or all-zero) although what it got was fine."""

    node: str
    kind: str  # "nan" | "inf" | "zero"
    input: int | None  # the input it produced the bad gradient for; None: bad on arrival (a sum)
    what: str  # what went wrong, said from the node: "produced a NaN gradient for input 1 (y) ..."
    message: str  # the same, naming the node: for a summary line


@dataclass(frozen=True)
class GradFlow:
    """Gradients a node received (one per forward output) and produced (one per next function)."""

    received: tuple[GradStat | None, ...]
    produced: tuple[GradStat | None, ...]
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class Node:
    """One backward node; `next` mirrors next_functions (None where an input needs no gradient)."""

    id: str
    name: str
    kind: str  # "op" | "custom" | "leaf"
    depth: int  # shortest distance from an output's node
    next: tuple[str | None, ...] = ()
    function: str | None = None  # custom Function: module.qualname of the Function class
    source: Source | None = None
    saved: tuple[Saved, ...] = ()
    hooks: tuple[str, ...] = ()
    leaf: Leaf | None = None
    grad: GradFlow | None = None


@dataclass(frozen=True)
class Output:
    """One tensor the forward returned and the node its backward starts from."""

    name: str
    node: str | None  # None when the output needs no gradient
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Graph:
    """The whole backward graph; nodes in breadth-first walk order, with ids n0, n1, ... by it."""

    outputs: tuple[Output, ...]
    nodes: tuple[Node, ...]
    grads: bool = False
    backward_error: str | None = None
    problems: tuple[Problem, ...] = ()


def record(fn: Callable[..., Any], args: list, arg_names: list[str], *,
           grads: bool = False, seed: int = 0) -> Graph:
    """Run fn(*args), walk the autograd graph of every tensor output and return plain data.

    With grads=True, also run backward from seeded random grad_outputs with a hook on every node,
    annotate each node with the norms it received and produced, and flag NaN/Inf and all-zero
    gradients at the node where they start. Leaves' .grad is left untouched.
    """
    spy = _HookSpy()
    # anomaly mode makes autograd keep each node's forward traceback (node.metadata)
    with torch.enable_grad(), torch.autograd.set_detect_anomaly(True, check_nan=False), spy:
        result = fn(*args)
    outs = _flatten(result)
    # an output that is itself a leaf starts backward at its accumulator (reached through a view)
    roots = [(t.grad_fn or t.view_as(t).grad_fn.next_functions[0][0]) if t.requires_grad
             else None for _, t in outs]
    order, depth = _walk([r for r in roots if r is not None])
    ids = {id(n): f"n{i}" for i, n in enumerate(order)}
    names = {id(a): n for a, n in reversed(list(zip(args, arg_names)))}  # first name wins
    info = _Context(ids, names, _collect_hooks(spy.calls, [t for _, t in outs], order))
    nodes = [_describe(n, depth[id(n)], info) for n in order]
    outputs = tuple(Output(name, ids[id(r)] if r is not None else None, tuple(t.shape),
                           _dtype(t.dtype)) for (name, t), r in zip(outs, roots))
    if not grads:
        return Graph(outputs, tuple(nodes))
    flows, error = _run_backward(order, [t for _, t in outs], seed)
    nodes = _annotate(nodes, [flows.get(id(n)) for n in order], outputs)
    problems = tuple(p for n in nodes if n.grad for p in n.grad.problems)
    return Graph(outputs, tuple(nodes), True, error, problems)


@dataclass(frozen=True)
class _Context:
    ids: dict[int, str]  # id() of an autograd node -> its node id
    names: dict[int, str]  # id() of an argument -> its name
    hooks: dict[int, list[tuple[str, Any]]]  # id() of a node -> (kind prefix, hook)


def _flatten(result: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensor outputs with names (output, output[0], output['loss']), nested containers included."""
    found: list[tuple[str, torch.Tensor]] = []
    stack: list[tuple[str, Any]] = [("output", result)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, (tuple, list)):
            stack.extend(reversed([(f"{name}[{i}]", v) for i, v in enumerate(value)]))
        elif isinstance(value, dict):
            stack.extend(reversed([(f"{name}[{k!r}]", v) for k, v in value.items()]))
    return found


def _walk(roots: list[Any]) -> tuple[list[Any], dict[int, int]]:
    """Breadth-first over next_functions, each node once; iterative so depth is unbounded."""
    order: list[Any] = []  # keeps every node alive, so id() stays unique during the walk
    depth: dict[int, int] = {}
    queue: deque[Any] = deque()
    for node in roots:
        if id(node) not in depth:
            depth[id(node)] = 0
            order.append(node)
            queue.append(node)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is not None and id(child) not in depth:
                depth[id(child)] = depth[id(node)] + 1
                order.append(child)
                queue.append(child)
    return order, depth


def _describe(node: Any, depth: int, info: _Context) -> Node:
    """Plain data for one autograd node."""
    nid, name = info.ids[id(node)], type(node).__name__
    nxt = tuple(info.ids[id(c)] if c is not None else None for c, _ in node.next_functions)
    hooks = info.hooks.get(id(node), [])
    if hasattr(node, "variable"):  # AccumulateGrad
        var = node.variable
        label = info.names.get(id(var))
        leaf = Leaf(label or f"<leaf {nid}>", tuple(var.shape), _dtype(var.dtype),
                    bool(var.requires_grad), label is not None)
        return Node(nid, name, "leaf", depth, nxt, hooks=_hook_names(hooks + _tensor_hooks(var)),
                    leaf=leaf)
    cls = getattr(node, "_forward_cls", None)  # set on the backward node of a custom Function
    return Node(nid, name, "custom" if cls else "op", depth, nxt,
                function=f"{cls.__module__}.{cls.__qualname__}" if cls else None,
                source=_source(node, cls), saved=_saved_of(node, cls is not None, info),
                hooks=_hook_names(hooks))


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n'
                    r'(?:[ \t]*(?P<code>[^\n]*))?')


_HERE = os.path.abspath(__file__)
_SKIPPED = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (torch.__file__, __file__))


def _source(node: Any, cls: type | None) -> Source | None:
    """The innermost frame of the anomaly-mode traceback that is user code inside the forward.

    Frames in torch and gradtool are skipped, and the search stops at record() itself: its callers
    (a test, the CLI) did not create the node. A custom Function applied by gradtool directly has
    no such frame; it gets the line its forward is defined on.
    """
    for entry in reversed(node.metadata.get("traceback_") or []):
        m = _FRAME.search(entry)
        if m is None:
            continue
        path = os.path.abspath(m["file"])
        if path == _HERE and m["func"] == "record":
            break
        if not path.startswith(_SKIPPED):
            return Source(_display_path(path), int(m["line"]), m["func"].strip(),
                          (m["code"] or "").strip())
    return _defined_at(cls) if cls is not None else None


def _defined_at(cls: type) -> Source | None:
    try:
        lines, start = inspect.getsourcelines(cls.forward)
        path = inspect.getsourcefile(cls.forward)
    except (OSError, TypeError):  # built in, or defined where no source file exists
        return None
    at = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), 0)
    return Source(_display_path(path or "?"), start + at, "forward", lines[at].strip())


def _display_path(path: str) -> str:
    """Relative to the working directory when under it: stable across checkouts."""
    full, cwd = os.path.abspath(path), os.getcwd()
    return os.path.relpath(full, cwd) if full.startswith(cwd + os.sep) else path


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SAVED_NAMES: dict[type, list[str]] = {}  # dir() is slow; a node class's saved slots never change


def _saved_of(node: Any, custom: bool, info: _Context) -> tuple[Saved, ...]:
    """Saved tensors (shape, dtype) and non-tensor saved values of a node."""
    if custom:
        items = [("saved_tensors", _try(lambda: node.saved_tensors))]
        items += [(k, v) for k, v in vars(node).items() if not k.startswith("__")]  # ctx.<attr>
    else:
        attrs = _SAVED_NAMES.get(type(node))
        if attrs is None:
            attrs = _SAVED_NAMES[type(node)] = [a for a in dir(node) if a.startswith("_saved_")]
        items = [(a[len("_saved_"):], _try(lambda a=a: getattr(node, a))) for a in attrs]
        items = [(k, v) for k, v in items if v is not None]  # None: not saved for this call
    return tuple(s for name, value in items for s in _saved_items(name, value, info))


def _saved_items(name: str, value: Any, info: _Context) -> list[Saved]:
    if isinstance(value, torch.Tensor):
        return [Saved(name, tuple(value.shape), _dtype(value.dtype),
                      arg=info.names.get(id(value)), output_of=info.ids.get(id(value.grad_fn)))]
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [s for i, v in enumerate(value) for s in _saved_items(f"{name}[{i}]", v, info)]
    # repr without memory addresses (output must be deterministic), cut short
    text = value if isinstance(value, _Unavailable) else _ADDRESS.sub("", repr(value))
    return [Saved(name, value=text if len(text) <= 60 else text[:59] + "…")]


class _Unavailable(str):
    """Why a saved value could not be read (freed by an earlier backward, for one)."""


def _try(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except Exception as exc:  # noqa: BLE001 - any failure here is a fact to show, not to raise
        return _Unavailable(f"<unavailable: {type(exc).__name__}>")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_WATCHED = {torch.Tensor.register_hook: "",
            torch.Tensor.register_post_accumulate_grad_hook: "post-accumulate "}


class _HookSpy(TorchFunctionMode):
    """Records Tensor.register_hook calls made during the forward: nodes do not list their hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, str, Any]] = []

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _WATCHED and args:
            hook = args[1] if len(args) > 1 else kwargs.get("hook")
            self.calls.append((args[0], _WATCHED[func], hook))
        return func(*args, **kwargs)


def _collect_hooks(calls: list[tuple[torch.Tensor, str, Any]], outs: list[torch.Tensor],
                   order: list[Any]) -> dict[int, list[tuple[str, Any]]]:
    """Hooks per node: tensor hooks registered during the forward and those on the outputs."""
    accumulators = {id(n.variable): n for n in order if hasattr(n, "variable")}
    pairs = list(calls) + [(t, "", h) for t in outs if t.grad_fn is not None
                           for h in (t._backward_hooks or {}).values()]
    found: dict[int, list[tuple[str, Any]]] = {}
    for tensor, prefix, hook in pairs:
        node = tensor.grad_fn or accumulators.get(id(tensor))
        if node is not None:
            found.setdefault(id(node), []).append((prefix, hook))
    return found


def _tensor_hooks(var: torch.Tensor) -> list[tuple[str, Any]]:
    """Hooks on a leaf tensor itself (those registered before record was called, too)."""
    post = getattr(var, "_post_accumulate_grad_hooks", None) or {}
    return ([("", h) for h in (var._backward_hooks or {}).values()]
            + [("post-accumulate ", h) for h in post.values()])


def _hook_names(hooks: list[tuple[str, Any]]) -> tuple[str, ...]:
    """Names of distinct hooks (one may be seen both registered and on the tensor)."""
    unique = {(prefix, id(hook)): (prefix, hook) for prefix, hook in hooks}
    return tuple(prefix + _hook_name(hook) for prefix, hook in unique.values())


def _hook_name(hook: Any) -> str:
    func = getattr(hook, "func", None)  # functools.partial
    if func is not None and not hasattr(hook, "__qualname__"):
        return f"partial({_hook_name(func)})"
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def _run_backward(order: list[Any], outs: list[torch.Tensor], seed: int
                  ) -> tuple[dict[int, GradFlow], str | None]:
    """Backward from seeded random grad_outputs with a hook on every node."""
    flows: dict[int, GradFlow] = {}

    def capture(key: int) -> Callable[[tuple, tuple], None]:
        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            flows[key] = GradFlow(tuple(map(_stat, grad_outputs)), tuple(map(_stat, grad_inputs)))
        return hook

    leaves = [n for n in order if hasattr(n, "variable")]
    handles = [n.register_hook(capture(id(n))) for n in order if not hasattr(n, "variable")]
    roots = [t for t in outs if t.requires_grad]
    if not roots:
        return flows, None
    generator = torch.Generator().manual_seed(seed)
    seeds = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in roots]
    error = None
    try:
        # autograd.grad, not backward: leaf gradients are returned instead of written to .grad
        got = torch.autograd.grad(roots, [n.variable for n in leaves], seeds, allow_unused=True)
        flows.update({id(n): GradFlow((_stat(g),), ()) for n, g in zip(leaves, got)})
    except Exception as exc:  # noqa: BLE001 - the user's backward failing is a finding to show
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for handle in handles:
            handle.remove()
    return flows, error


def _stat(grad: torch.Tensor | None) -> GradStat | None:
    """Norm and NaN/Inf/all-zero flags; one reduction in the common (finite) case."""
    if grad is None:
        return None
    grad = grad.detach()
    if grad.is_sparse:
        grad = grad.coalesce().values()
    norm = float(torch.linalg.vector_norm(grad.abs() if grad.is_complex() else grad,
                                          dtype=torch.float64))
    if math.isfinite(norm):
        # a norm can underflow to 0 for tiny values, so zero is decided on the elements
        return GradStat(norm, zero=norm == 0 and not bool(grad.any()))
    return GradStat(None, nan=bool(torch.isnan(grad).any()), inf=bool(torch.isinf(grad).any()))


_SEED = GradStat(1.0)  # what an output's node receives from outside: finite, non-zero
_ZERO = GradStat(0.0, zero=True)
_WORD = {"nan": "a NaN", "inf": "an Inf", "zero": "an all-zero"}


def _annotate(nodes: list[Node], flows: list[GradFlow | None], outputs: tuple[Output, ...]
              ) -> list[Node]:
    """Attach each node's gradient flow and the problems that start at it."""
    incoming: dict[str, list[GradStat | None]] = {o.node: [_SEED] for o in outputs if o.node}
    for node, flow in zip(nodes, flows):
        for child, stat in zip(node.next, flow.produced if flow else ()):
            if child is not None:
                incoming.setdefault(child, []).append(stat)
    result = []
    for node, flow in zip(nodes, flows):
        if flow is not None:
            found = (_arrival(node, flow, incoming.get(node.id, []))
                     or _production(node, flow, nodes))
            node = replace(node, grad=replace(flow, problems=found))
        result.append(node)
    return result


def _kind(stats: list[GradStat | None] | tuple[GradStat | None, ...]) -> str | None:
    """The worst thing about a set of gradients: nan, inf, zero (all of them zero) or None."""
    present = [s for s in stats if s is not None]
    if any(s.nan for s in present):
        return "nan"
    if any(s.inf for s in present):
        return "inf"
    return "zero" if present and all(s.zero for s in present) else None


def _arrival(node: Node, flow: GradFlow, incoming: list[GradStat | None]) -> tuple[Problem, ...]:
    """Bad on arrival though no single input was: the sum of incoming gradients went bad."""
    # an input that sent None sent nothing, which autograd treats as zeros
    got, sent = _kind(flow.received), _kind([s or _ZERO for s in incoming])
    if not incoming or got is None or got == sent or (got == "zero" and sent is not None):
        return ()
    how = "cancel to zero" if got == "zero" else f"sum to {_WORD[got].split()[1]}"
    return (_problem(node, got, None, f"the gradients it receives {how}"),)


def _production(node: Node, flow: GradFlow, nodes: list[Node]) -> tuple[Problem, ...]:
    """Bad gradients produced from good ones: NaN/Inf from finite, all-zero from non-zero."""
    if _kind(flow.received) in ("nan", "inf"):
        return ()
    live = any(s is not None and not s.zero for s in flow.received)
    found = []
    for i, stat in enumerate(flow.produced):
        kind = _kind([stat])
        if kind is None or (kind == "zero" and not live):
            continue
        target = nodes[int(node.next[i][1:])] if i < len(node.next) and node.next[i] else None
        name = target and (target.leaf.name if target.leaf else f"{target.name} {target.id}")
        came = "non-zero" if kind == "zero" else "finite"
        what = f"produced {_WORD[kind]} gradient for input {i}" + (f" ({name})" if name else "")
        found.append(_problem(node, kind, i, f"{what} from a {came} incoming gradient"))
    return tuple(found)


def _problem(node: Node, kind: str, i: int | None, what: str) -> Problem:
    custom = f", custom Function {node.function}" if node.function else ""
    return Problem(node.id, kind, i, what, f"{node.name} ({node.id}{custom}) {what}")
