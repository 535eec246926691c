"""Graph renderers: autograd graph data -> text tree, Graphviz DOT, Mermaid flowchart or JSON."""

from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any

from rich.text import Text

from .view import Item, View, details, header, item_style, more_label, out_label, summary

if TYPE_CHECKING:  # data classes only; render stays free of torch and of the recording code
    from .model import Graph

FORMATS = ("tree", "dot", "mermaid", "json")
JSON_FORMAT, JSON_VERSION = "gradtool-graph", 1
MAX_NEST = 16  # tree nesting past this goes on in a new top-level section (keeps lines short)


def render(graph: Graph, fmt: str, depth: int | None = None) -> str:
    """The graph as text in one of FORMATS; depth keeps that many levels below the outputs."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown graph format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, got {depth}")
    view = View.build(graph, depth)
    return {"tree": _tree_text, "dot": _dot, "mermaid": _mermaid, "json": _json}[fmt](graph, view)


# --- tree ----------------------------------------------------------------------------------------
# Drawn here rather than with rich.tree.Tree: rich lays out every label through its wrapping
# engine (about 0.5 ms a node), which puts a 10,000-node graph far past a few seconds.

_Line = tuple[str, str, str]  # guide, text, item_style


def styled_tree(graph: Graph, depth: int | None = None) -> Text:
    """The tree as rich Text for a terminal; print with soft_wrap=True. Colour adds nothing new."""
    text = Text(no_wrap=True)
    for i, (guide, body, style) in enumerate(_tree_lines(graph, View.build(graph, depth))):
        text.append(("\n" if i else "") + guide, style="dim")
        text.append(body, style=style)
    return text


def _tree_text(graph: Graph, view: View) -> str:
    return "".join(guide + body + "\n" for guide, body, _ in _tree_lines(graph, view))


def _tree_lines(graph: Graph, view: View) -> list[_Line]:
    lines: list[_Line] = [("", line, "bold red" if line.startswith("✗") else "bold")
                          for line in summary(graph, view)]
    state = _TreeState(view, lines)
    for i, out in enumerate(graph.outputs):
        last = i == len(graph.outputs) - 1
        lines.append(("└── " if last else "├── ", out_label(out), "bold cyan"))
        if out.node is not None:  # drawn under its own label, before the next output's
            state.place(view.owner[out.node], None, "    " if last else "│   ", 1)
            state.run(sections=False)
    state.run()  # the sections continued below the tree
    return lines


class _TreeState:
    """Iterative depth-first layout: a stack of entries to draw, and sections to continue later."""

    def __init__(self, view: View, lines: list[_Line]) -> None:
        self.view, self.lines = view, lines
        self.drawn: set[str] = set()
        # (kind, item id, drawn via, guide so far, nesting, last sibling)
        self.stack: list[tuple[str, str, str | None, str, int, bool]] = []
        self.sections: deque[str] = deque()

    def place(self, iid: str, via: str | None, rest: str, nest: int, last: bool = True) -> None:
        self.stack.append(("item", iid, via, rest, nest, last))

    def run(self, sections: bool = True) -> None:
        while self.stack or (sections and self.sections):
            if not self.stack:
                iid = self.sections.popleft()
                self.lines.append(("", f"⤷ {header(self.view.items[iid])} (continued)", "bold"))
                self._children(iid, "", 1)
                continue
            kind, iid, via, rest, nest, last = self.stack.pop()
            lead, rest = rest + ("└── " if last else "├── "), rest + ("    " if last else "│   ")
            if kind == "more":
                self.lines.append((lead, more_label(self.view, iid), "dim"))
            else:
                self._draw(iid, via, lead, rest, nest)

    def _draw(self, iid: str, via: str | None, lead: str, rest: str, nest: int) -> None:
        view, item = self.view, self.view.items[iid]
        if iid in self.drawn or view.parent.get(iid) != via:
            where = view.parent.get(iid, "an output")
            self.lines.append((lead, f"↪ {header(item)} (shared, drawn under {where})", "dim"))
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

    def _item_lines(self, item: Item, lead: str, rest: str, mark: str) -> None:
        self.drawn.add(item.id)
        self.lines.append((lead, mark + header(item), item_style(item)))
        pad = " " * len(mark)
        self.lines += [(rest, pad + line, "bold red" if line.startswith("✗") else "")
                       for line in details(item)]

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


def _dot(graph: Graph, view: View) -> str:
    out = ["digraph autograd {", "    rankdir=TB;",
           '    node [shape=box, fontname="monospace", fontsize=10];',
           f"    label={_dot_text(summary(graph, view))}; labelloc=t;"]
    for i, o in enumerate(graph.outputs):
        out.append(f"    out{i} [label={_dot_text([out_label(o)])}, shape=oval];")
        if o.node is not None:
            out.append(f"    out{i} -> {view.owner[o.node]};")
    for item in view.shown():
        style = _DOT_STYLE[item.members[0].kind]
        if item_style(item) == "bold red":
            style = 'style="bold,filled", fillcolor="#f7d4d4", color=red'
        label = f"label={_dot_text([header(item), *details(item)])}"
        attrs = f"{label}, {style}" if style else label
        out.append(f"    {item.id} [{attrs}];")
        out += [f"    {item.id} -> {c};" for c in item.children if view.visible(c)]
        if view.beyond(item.id):
            more = _dot_text([more_label(view, item.id)])
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


def _mermaid(graph: Graph, view: View) -> str:
    out = ["flowchart TB", *(f"    %% {line}" for line in summary(graph, view))]
    used: set[str] = {"output"}
    for i, o in enumerate(graph.outputs):
        out.append(f"    out{i}{{{{{_mermaid_text([out_label(o)])}}}}}:::output")
        if o.node is not None:
            out.append(f"    out{i} --> {view.owner[o.node]}")
    for item in view.shown():
        kind = item.members[0].kind
        cls = "problem" if item_style(item) == "bold red" else kind
        left, right = _MERMAID_SHAPE[kind]
        text = _mermaid_text([header(item)] + details(item))
        out.append(f"    {item.id}{left}{text}{right}" + (f":::{cls}" if cls != "op" else ""))
        used.add(cls)
        out += [f"    {item.id} --> {c}" for c in item.children if view.visible(c)]
        if view.beyond(item.id):
            out.append(f"    {item.id}_more[{_mermaid_text([more_label(view, item.id)])}]:::more")
            out.append(f"    {item.id} -.-> {item.id}_more")
            used.add("more")
    out += [f"    classDef {name} {css}" for name, css in _MERMAID_CLASSES.items() if name in used]
    return "\n".join(out) + "\n"


# --- json ----------------------------------------------------------------------------------------


def _json(graph: Graph, view: View) -> str:
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
