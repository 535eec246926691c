"""Graph renderers: autograd graph data -> text tree, Graphviz DOT, Mermaid flowchart or JSON."""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

if TYPE_CHECKING:  # data classes only; render stays free of torch and of the recording code
    from gradtool.graph import GradStat, Graph, Node, Saved

FORMATS = ("tree", "dot", "mermaid", "json")
JSON_FORMAT, JSON_VERSION = "gradtool-graph", 1
COLLAPSE_MIN = 8  # a pattern repeated this often along a path is drawn as one "Name ×N" box
MAX_PERIOD = 4  # longest pattern looked for: (MulBackward0 → AddBackward0) ×N and the like
MAX_NEST = 16  # tree nesting past this goes on in a new top-level section (keeps lines short)


def render(graph: Graph, fmt: str, depth: int | None = None) -> str:
    """The graph as text in one of FORMATS; depth keeps that many levels below the outputs."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown graph format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, got {depth}")
    view = _View.build(graph, depth)
    return {"tree": _tree_text, "dot": _dot, "mermaid": _mermaid, "json": _json}[fmt](graph, view)


# --- the view shared by every format: chains collapsed, depth applied ---------------------------


@dataclass(frozen=True)
class _Item:
    """What is drawn as one box: a single node, or a collapsed chain repeating an op pattern."""

    id: str
    members: tuple[Node, ...]
    children: tuple[str, ...]  # item ids, distinct, in next_functions order
    period: int = 1  # length of the repeated pattern (chains only)


@dataclass(frozen=True)
class _View:
    items: dict[str, _Item]  # in walk order
    owner: dict[str, str]  # node id -> id of the item that draws it
    depth: dict[str, int]  # item id -> levels below the outputs (breadth first)
    parent: dict[str, str]  # item id -> the item it is drawn under in the tree
    limit: int | None

    @staticmethod
    def build(graph: Graph, limit: int | None) -> _View:
        nodes = {n.id: n for n in graph.nodes}
        kids = {n.id: tuple(dict.fromkeys(c for c in n.next if c is not None)) for n in graph.nodes}
        runs = _chains(graph, nodes, kids)
        owner = {n.id: n.id for n in graph.nodes}
        owner.update({m.id: head for head, (run, _) in runs.items() for m in run})
        items: dict[str, _Item] = {}
        for n in graph.nodes:
            if owner[n.id] == n.id:
                members, period = runs.get(n.id, ([n], 1))
                inner = dict.fromkeys(owner[c] for m in members for c in kids[m.id])
                inner.pop(n.id, None)
                items[n.id] = _Item(n.id, tuple(members), tuple(inner), period)
        roots = [owner[o.node] for o in graph.outputs if o.node is not None]
        depth, parent = _breadth_first(items, roots)
        return _View(items, owner, depth, parent, limit)

    def visible(self, iid: str) -> bool:
        return self.limit is None or self.depth[iid] < self.limit

    def beyond(self, iid: str) -> int:
        """How many inputs of a drawn item lie beyond the depth limit."""
        return sum(not self.visible(c) for c in self.items[iid].children)

    def shown(self) -> list[_Item]:
        return [item for item in self.items.values() if self.visible(item.id)]

    def hidden(self) -> int:
        return sum(len(i.members) for i in self.items.values() if not self.visible(i.id))


def _notable(node: Node) -> bool:
    """Nodes never folded into a chain: what they carry must stay visible."""
    return bool(node.hooks or (node.grad and node.grad.problems))


def _chains(graph: Graph, nodes: dict[str, Node], kids: dict[str, tuple[str, ...]]
            ) -> dict[str, tuple[list[Node], int]]:
    """Repeated op patterns along linear paths: head id -> (members, pattern length)."""
    parents = Counter(c for cs in kids.values() for c in cs)
    roots = {o.node for o in graph.outputs}
    link: dict[str, str] = {}  # a node -> its one inner input that nothing else uses
    for n in graph.nodes:
        inner = [c for c in kids[n.id] if nodes[c].kind != "leaf"]
        if (len(inner) == 1 and parents[inner[0]] == 1 and inner[0] not in roots
                and not _notable(n) and not _notable(nodes[inner[0]])):
            link[n.id] = inner[0]
    targets = set(link.values())
    found: dict[str, tuple[list[Node], int]] = {}
    for head in (h for h in link if h not in targets):
        path = [nodes[head]]
        while path[-1].id in link:
            path.append(nodes[link[path[-1].id]])
        if len(path) >= COLLAPSE_MIN:
            found.update(_repeats(path))
    return found


def _repeats(path: list[Node]) -> dict[str, tuple[list[Node], int]]:
    """Cut a linear path into stretches that repeat a pattern of 1-4 ops COLLAPSE_MIN+ times."""
    names = [n.name for n in path]
    found: dict[str, tuple[list[Node], int]] = {}
    i = 0
    while i < len(path):
        best = (0, 1)  # (nodes covered, pattern length)
        for period in range(1, MAX_PERIOD + 1):
            j = i + period
            while j < len(names) and names[j] == names[j - period]:
                j += 1
            covered = (j - i) // period * period
            if covered // period >= COLLAPSE_MIN and covered > best[0]:
                best = (covered, period)
        if best[0]:
            found[path[i].id] = (path[i:i + best[0]], best[1])
        i += best[0] or 1
    return found


def _breadth_first(items: dict[str, _Item], roots: list[str]
                   ) -> tuple[dict[str, int], dict[str, str]]:
    """Depth of every item and the item that first reaches it (its place in the tree)."""
    depth = {r: 0 for r in roots}
    parent: dict[str, str] = {}
    queue = deque(dict.fromkeys(roots))
    while queue:
        iid = queue.popleft()
        for child in items[iid].children:
            if child not in depth:
                depth[child], parent[child] = depth[iid] + 1, iid
                queue.append(child)
    return depth, parent


# --- labels: the same lines in every text format ------------------------------------------------


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _header(item: _Item) -> str:
    first = item.members[0]
    if len(item.members) > 1:
        pattern = " → ".join(m.name for m in item.members[:item.period])
        pattern = f"({pattern})" if item.period > 1 else pattern
        return f"{first.id}…{item.members[-1].id} {pattern} ×{len(item.members) // item.period}"
    text = f"{first.id} {first.name}"
    if first.leaf:
        leaf = first.leaf
        text += (f" · {leaf.name} {_shape(leaf.shape)} {leaf.dtype}"
                 f" requires_grad={leaf.requires_grad}")
    if first.function:
        text += f" · custom Function {first.function}"
    return text


def _details(item: _Item) -> list[str]:
    """Lines under the header: source, saved values, hooks, gradients, problems."""
    node, lines = item.members[0], []
    sources = {m.source for m in item.members}
    if node.source:
        src = node.source
        where = f"at {src.file}:{src.line} in {src.function}"
        where += f": {src.code}" if src.code else ""
        lines.append(where if len(sources) == 1 else where + " (and other lines)")
    if len(item.members) > 1:  # a chain: how the gradient changes from its first to last node
        first, last = item.members[0].grad, item.members[-1].grad
        if first and last:
            lines.append(f"grad norm in {_stats(first.received)} … out {_stats(last.produced)}")
        return lines
    tensors = [f"{s.name} {_shape(s.shape)} {s.dtype}" + _of(s) for s in node.saved
               if s.shape is not None]
    values = [f"{s.name}={s.value}" for s in node.saved if s.shape is None]
    lines += [f"saved tensors: {', '.join(tensors)}"] if tensors else []
    lines += [f"saved values: {', '.join(values)}"] if values else []
    lines += [f"hooks: {', '.join(node.hooks)}"] if node.hooks else []
    if node.grad:
        lines.append(f"grad norm in {_stats(node.grad.received)}"
                     + (f" → out {_stats(node.grad.produced)}" if node.grad.produced else ""))
        lines += [f"✗ {p.what}" for p in node.grad.problems]
    return lines


def _of(saved: Saved) -> str:
    """Where a saved tensor comes from: an argument by name, or a node's output by id."""
    if saved.arg is not None:
        return f" = {saved.arg}"
    return f" = output of {saved.output_of}" if saved.output_of else ""


def _stats(stats: tuple[GradStat | None, ...]) -> str:
    return "[" + ", ".join(_stat(s) for s in stats) + "]"


def _stat(stat: GradStat | None) -> str:
    if stat is None:
        return "—"
    if stat.nan or stat.inf:
        return "NaN" if stat.nan else "Inf"
    return "0" if stat.zero else f"{stat.norm:.4g}"


def _style(item: _Item) -> str:
    node = item.members[0]
    if node.grad and node.grad.problems:
        return "bold red"
    return {"leaf": "green", "custom": "bold magenta"}.get(node.kind, "bold")


def _out_label(out: Any) -> str:
    return f"{out.name} {_shape(out.shape)} {out.dtype}" + ("" if out.node else " · no gradient")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _more(view: _View, iid: str) -> str:
    return f"… {_plural(view.beyond(iid), 'input')} beyond depth {view.limit}"


def _summary(graph: Graph, view: _View) -> list[str]:
    counts = f"{_plural(len(graph.nodes), 'node')} · {_plural(len(graph.outputs), 'output')}"
    lines = [f"autograd graph · {counts}"]
    if view.limit is not None and view.hidden():
        lines[0] += f" · depth {view.limit}: {view.hidden()} nodes hidden"
    lines += [f"✗ {p.message}" for p in graph.problems]
    lines += [f"✗ backward raised {graph.backward_error}"] if graph.backward_error else []
    return lines


# --- tree ----------------------------------------------------------------------------------------
# Drawn here rather than with rich.tree.Tree: rich lays out every label through its wrapping
# engine (about 0.5 ms a node), which puts a 10,000-node graph far past a few seconds.

_Line = tuple[str, str, str]  # guide, text, style


def styled_tree(graph: Graph, depth: int | None = None) -> Text:
    """The tree as rich Text for a terminal; print with soft_wrap=True. Colour adds nothing new."""
    text = Text(no_wrap=True)
    for i, (guide, body, style) in enumerate(_tree_lines(graph, _View.build(graph, depth))):
        text.append(("\n" if i else "") + guide, style="dim")
        text.append(body, style=style)
    return text


def _tree_text(graph: Graph, view: _View) -> str:
    return "".join(guide + body + "\n" for guide, body, _ in _tree_lines(graph, view))


def _tree_lines(graph: Graph, view: _View) -> list[_Line]:
    lines: list[_Line] = [("", line, "bold red" if line.startswith("✗") else "bold")
                          for line in _summary(graph, view)]
    state = _TreeState(view, lines)
    for i, out in enumerate(graph.outputs):
        last = i == len(graph.outputs) - 1
        lines.append(("└── " if last else "├── ", _out_label(out), "bold cyan"))
        if out.node is not None:
            state.place(view.owner[out.node], None, "    " if last else "│   ", 1)
    state.run()
    return lines


class _TreeState:
    """Iterative depth-first layout: a stack of entries to draw, and sections to continue later."""

    def __init__(self, view: _View, lines: list[_Line]) -> None:
        self.view, self.lines = view, lines
        self.drawn: set[str] = set()
        # (kind, item id, drawn via, guide so far, nesting, last sibling)
        self.stack: list[tuple[str, str, str | None, str, int, bool]] = []
        self.sections: deque[str] = deque()

    def place(self, iid: str, via: str | None, rest: str, nest: int, last: bool = True) -> None:
        self.stack.append(("item", iid, via, rest, nest, last))

    def run(self) -> None:
        while self.stack or self.sections:
            if not self.stack:
                iid = self.sections.popleft()
                self.lines.append(("", f"⤷ {_header(self.view.items[iid])} (continued)", "bold"))
                self._children(iid, "", 1)
                continue
            kind, iid, via, rest, nest, last = self.stack.pop()
            lead, rest = rest + ("└── " if last else "├── "), rest + ("    " if last else "│   ")
            if kind == "more":
                self.lines.append((lead, _more(self.view, iid), "dim"))
            else:
                self._draw(iid, via, lead, rest, nest)

    def _draw(self, iid: str, via: str | None, lead: str, rest: str, nest: int) -> None:
        view, item = self.view, self.view.items[iid]
        if iid in self.drawn or view.parent.get(iid) != via:
            where = view.parent.get(iid, "an output")
            self.lines.append((lead, f"↪ {_header(item)} (shared, drawn under {where})", "dim"))
            return
        self._item_lines(item, lead, rest, "")
        while (nxt := self._flattened(iid)) is not None:  # a linear run reads downwards, unindented
            self._item_lines(view.items[nxt], rest, rest, "↓ ")
            iid = nxt
        if nest >= MAX_NEST and any(view.visible(c) for c in view.items[iid].children):
            self.lines.append((rest, f"⤵ inputs continue below, at ⤷ {iid}", "dim"))
            self.sections.append(iid)
            return
        self._children(iid, rest, nest + 1)

    def _item_lines(self, item: _Item, lead: str, rest: str, mark: str) -> None:
        self.drawn.add(item.id)
        self.lines.append((lead, mark + _header(item), _style(item)))
        pad = " " * len(mark)
        self.lines += [(rest, pad + line, "bold red" if line.startswith("✗") else "")
                       for line in _details(item)]

    def _flattened(self, iid: str) -> str | None:
        """The only input of iid when it, too, has a single input: drawn as a continuation."""
        view = self.view
        shown = [c for c in view.items[iid].children if view.visible(c)]
        if len(shown) != 1 or view.beyond(iid) or view.parent.get(shown[0]) != iid:
            return None
        child = shown[0]
        grand = [c for c in view.items[child].children if view.visible(c)]
        if len(grand) != 1 or view.beyond(child) or child in self.drawn:
            return None
        return child

    def _children(self, iid: str, rest: str, nest: int) -> None:
        """Queue the inputs of iid (reversed: the stack pops the first input first)."""
        view = self.view
        shown = [c for c in view.items[iid].children if view.visible(c)]
        more = view.beyond(iid) > 0
        if more:
            self.stack.append(("more", iid, None, rest, nest, True))
        for i in reversed(range(len(shown))):
            self.place(shown[i], iid, rest, nest, i == len(shown) - 1 and not more)


# --- dot -----------------------------------------------------------------------------------------


def _dot_text(lines: list[str]) -> str:
    """A quoted label of left-justified lines (each ends in \\l); \\ and " escaped."""
    escaped = [line.replace("\\", "\\\\").replace('"', '\\"') for line in lines]
    return '"' + "".join(line + "\\l" for line in escaped) + '"'


_DOT_STYLE = {"leaf": 'style="rounded,filled", fillcolor="#e3f2e3"',
              "custom": 'style="bold,filled", fillcolor="#efe3f7"', "op": ""}


def _dot(graph: Graph, view: _View) -> str:
    out = ["digraph autograd {", "    rankdir=TB;",
           '    node [shape=box, fontname="monospace", fontsize=10];',
           f"    label={_dot_text(_summary(graph, view))}; labelloc=t;"]
    for i, o in enumerate(graph.outputs):
        out.append(f"    out{i} [label={_dot_text([_out_label(o)])}, shape=oval];")
        if o.node is not None:
            out.append(f"    out{i} -> {view.owner[o.node]};")
    for item in view.shown():
        style = _DOT_STYLE[item.members[0].kind]
        if _style(item) == "bold red":
            style = 'style="bold,filled", fillcolor="#f7d4d4", color=red'
        label = f"label={_dot_text([_header(item), *_details(item)])}"
        attrs = f"{label}, {style}" if style else label
        out.append(f"    {item.id} [{attrs}];")
        out += [f"    {item.id} -> {c};" for c in item.children if view.visible(c)]
        if view.beyond(item.id):
            more = _dot_text([_more(view, item.id)])
            out.append(f"    {item.id}_more [label={more}, shape=plaintext];")
            out.append(f"    {item.id} -> {item.id}_more [style=dashed];")
    return "\n".join(out + ["}"]) + "\n"


# --- mermaid -------------------------------------------------------------------------------------


def _mermaid_text(lines: list[str]) -> str:
    """A quoted label: Mermaid's entity codes for what would end or mark up the text."""
    escaped = (line.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;")
               .replace(">", "#gt;") for line in lines)
    return '"' + "<br>".join(escaped) + '"'


_MERMAID_SHAPE = {"leaf": ("([", "])"), "custom": ("[[", "]]"), "op": ("[", "]")}
_MERMAID_CLASSES = {"leaf": "fill:#e3f2e3", "custom": "fill:#efe3f7,stroke-width:2px",
                    "problem": "fill:#f7d4d4,stroke:#c00,stroke-width:2px",
                    "more": "fill:none,stroke-dasharray:3", "output": "fill:#e3ecf7"}


def _mermaid(graph: Graph, view: _View) -> str:
    out = ["flowchart TB", *(f"    %% {line}" for line in _summary(graph, view))]
    used: set[str] = {"output"}
    for i, o in enumerate(graph.outputs):
        out.append(f"    out{i}{{{{{_mermaid_text([_out_label(o)])}}}}}:::output")
        if o.node is not None:
            out.append(f"    out{i} --> {view.owner[o.node]}")
    for item in view.shown():
        kind = item.members[0].kind
        cls = "problem" if _style(item) == "bold red" else kind
        left, right = _MERMAID_SHAPE[kind]
        text = _mermaid_text([_header(item)] + _details(item))
        out.append(f"    {item.id}{left}{text}{right}" + (f":::{cls}" if cls != "op" else ""))
        used.add(cls)
        out += [f"    {item.id} --> {c}" for c in item.children if view.visible(c)]
        if view.beyond(item.id):
            out.append(f"    {item.id}_more[{_mermaid_text([_more(view, item.id)])}]:::more")
            out.append(f"    {item.id} -.-> {item.id}_more")
            used.add("more")
    out += [f"    classDef {name} {css}" for name, css in _MERMAID_CLASSES.items() if name in used]
    return "\n".join(out) + "\n"


# --- json ----------------------------------------------------------------------------------------


def _json(graph: Graph, view: _View) -> str:
    """Every drawn node in full (chains unfolded), in the shape of schemas/graph.schema.json."""
    doc = {
        "format": JSON_FORMAT, "version": JSON_VERSION, "grads": graph.grads,
        "depth_limit": view.limit, "hidden_nodes": view.hidden(),
        "outputs": _plain(graph.outputs),
        "nodes": [{**_plain(m), "truncated": view.beyond(item.id) > 0} for item in view.shown()
                  for m in item.members],
        "chains": [{"pattern": [m.name for m in i.members[:i.period]],
                    "repeat": len(i.members) // i.period, "nodes": [m.id for m in i.members]}
                   for i in view.shown() if len(i.members) > 1],
        "problems": _plain(graph.problems),
        "backward_error": graph.backward_error,
    }
    return _dump(doc)


def _dump(doc: dict[str, Any]) -> str:
    """One key a line and one node a line: readable, diffable, and fast (json's indent=... path
    is pure Python, several times slower on a 10,000-node graph)."""
    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)

    fields = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            value_text = "[\n" + ",\n".join("  " + one(v) for v in value) + "\n ]"
        else:
            value_text = one(value)
        fields.append(f" {one(key)}: {value_text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def _plain(value: Any) -> Any:
    """Graph dataclasses as JSON values, field for field (the schema names the same fields)."""
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name in fields}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
