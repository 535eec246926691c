"""The view every graph format draws: repeated chains collapsed into one box, depth applied, labels."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # data classes only: the view stays free of torch and of the recording code
    from .model import GradStat, Graph, Node, Saved

COLLAPSE_MIN = 8  # a pattern repeated this often along a path is drawn as one "Name ×N" box
MAX_PERIOD = 4  # longest pattern looked for: (MulBackward0 → AddBackward0) ×N and the like


@dataclass(frozen=True)
class Item:
    """What is drawn as one box: a single node, or a collapsed chain repeating an op pattern."""

    id: str
    members: tuple[Node, ...]
    children: tuple[str, ...]  # item ids, distinct, in next_functions order
    period: int = 1  # length of the repeated pattern (chains only)


@dataclass(frozen=True)
class View:
    items: dict[str, Item]  # in walk order
    owner: dict[str, str]  # node id -> id of the item that draws it
    depth: dict[str, int]  # item id -> levels below the outputs (breadth first)
    parent: dict[str, str]  # item id -> the item it is drawn under in the tree
    limit: int | None

    @staticmethod
    def build(graph: Graph, limit: int | None) -> View:
        nodes = {n.id: n for n in graph.nodes}
        kids = {n.id: tuple(dict.fromkeys(c for c in n.next if c is not None)) for n in graph.nodes}
        runs = _chains(graph, nodes, kids)
        owner = {n.id: n.id for n in graph.nodes}
        owner.update({m.id: head for head, (run, _) in runs.items() for m in run})
        items: dict[str, Item] = {}
        for n in graph.nodes:
            if owner[n.id] == n.id:
                members, period = runs.get(n.id, ([n], 1))
                inner = dict.fromkeys(owner[c] for m in members for c in kids[m.id])
                inner.pop(n.id, None)
                items[n.id] = Item(n.id, tuple(members), tuple(inner), period)
        roots = [owner[o.node] for o in graph.outputs if o.node is not None]
        depth, parent = _breadth_first(items, roots)
        return View(items, owner, depth, parent, limit)

    def visible(self, iid: str) -> bool:
        return self.limit is None or self.depth[iid] < self.limit

    def beyond(self, iid: str) -> int:
        """How many inputs of a drawn item lie beyond the depth limit."""
        return sum(not self.visible(c) for c in self.items[iid].children)

    def shown(self) -> list[Item]:
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


def _breadth_first(items: dict[str, Item], roots: list[str]
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


def header(item: Item) -> str:
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


def details(item: Item) -> list[str]:
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


def item_style(item: Item) -> str:
    node = item.members[0]
    if node.grad and node.grad.problems:
        return "bold red"
    return {"leaf": "green", "custom": "bold magenta"}.get(node.kind, "bold")


def out_label(out: Any) -> str:
    return f"{out.name} {_shape(out.shape)} {out.dtype}" + ("" if out.node else " · no gradient")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def more_label(view: View, iid: str) -> str:
    return f"… {_plural(view.beyond(iid), 'input')} beyond depth {view.limit}"


def summary(graph: Graph, view: View) -> list[str]:
    counts = f"{_plural(len(graph.nodes), 'node')} · {_plural(len(graph.outputs), 'output')}"
    lines = [f"autograd graph · {counts}"]
    if view.limit is not None and view.hidden():
        lines[0] += f" · depth {view.limit}: {view.hidden()} nodes hidden"
    lines += [f"✗ {p.message}" for p in graph.problems]
    lines += [f"✗ backward raised {graph.backward_error}"] if graph.backward_error else []
    return lines
