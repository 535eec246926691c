"""Autograd graph walk: run a forward, read the backward graph it recorded into plain data."""

from __future__ import annotations

import inspect
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .grads import annotate, run_backward
from .model import Graph, Leaf, Node, Output, Saved, Source

__all__ = ["record"]


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
    flows, error = run_backward(order, [t for _, t in outs], seed)
    nodes = annotate(nodes, [flows.get(id(n)) for n in order], outputs)
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
_SKIPPED = tuple(os.path.dirname(os.path.abspath(f)) + os.sep
                 for f in (torch.__file__, os.path.dirname(__file__)))  # torch/, gradtool/


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
