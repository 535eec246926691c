"""Tests of the autograd graph walk (gradtool.graph.build) and its renderers (gradtool.graph.render)."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from gradtool.graph.build import Graph, record
from gradtool.graph.render import FORMATS, render, styled_tree

HERE = Path(__file__).parent
ROOT = HERE.parent
GOLDEN = HERE / "golden" / "graph"
UPDATE = os.environ.get("GRADTOOL_UPDATE_GOLDEN") == "1"  # rewrite the golden files instead
SUFFIX = {"tree": "tree.txt", "dot": "dot", "mermaid": "mmd", "json": "json"}


def _load_fixtures() -> ModuleType:
    """Import tests/fixtures_graph.py under one fixed name: it is part of the golden output."""
    if "fixtures_graph" in sys.modules:
        return sys.modules["fixtures_graph"]
    spec = importlib.util.spec_from_file_location("fixtures_graph", HERE / "fixtures_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fixtures_graph"] = module
    spec.loader.exec_module(module)
    return module


fx = _load_fixtures()


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # source paths are shown relative to the working directory: fix it for golden output
    monkeypatch.chdir(ROOT)


def tensor(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=torch.float64).requires_grad_()


def square_cube() -> Graph:
    return record(fx.square_cube, [tensor(5, 5), tensor(5, 5, seed=1)], ["x", "y"])


def linear() -> Graph:
    args = [tensor(2, 3), tensor(4, 3, seed=1), tensor(4, seed=2)]
    return record(fx.linear, args, ["input", "weight", "bias"])


def deep(n: int = 2000) -> Graph:
    """A residual loop: 2n + 1 nodes, n levels deep, nothing repeats along a single path."""
    return record(fx.residual, [tensor(3), n], ["x", "n"])


@pytest.fixture(scope="module")
def deep_graph() -> Graph:
    """Recorded once for the tests that only read it (a few seconds under pytest's deep stack)."""
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        return deep()
    finally:
        os.chdir(before)


# --- format checks ------------------------------------------------------------------------------

_MERMAID_ID = r"(?:out\d+|n\d+(?:_more)?)"
_MERMAID_TEXT = r'"[^"]*"'
_MERMAID_LINE = re.compile("|".join([
    r"flowchart (?:TB|TD|BT|LR|RL)",
    r"    %% .*",
    (rf"    {_MERMAID_ID}(?:\[{_MERMAID_TEXT}\]|\[\[{_MERMAID_TEXT}\]\]|\(\[{_MERMAID_TEXT}\]\)"
     rf"|\{{\{{{_MERMAID_TEXT}\}}\}})(?::::\w+)?"),
    rf"    {_MERMAID_ID} (?:-->|-\.->) {_MERMAID_ID}",
    r"    classDef \w+ [\w#:,.%-]+",
]))


def check_mermaid(text: str) -> None:
    """Every line is a flowchart statement; every edge joins declared nodes."""
    lines = text.splitlines()
    assert lines[0] == "flowchart TB"
    bad = [line for line in lines if not _MERMAID_LINE.fullmatch(line)]
    assert not bad, f"not Mermaid flowchart syntax: {bad[:3]}"
    declared = set(re.findall(rf"^    ({_MERMAID_ID})[\[({{]", text, re.MULTILINE))
    edge = rf"^    ({_MERMAID_ID}) -\.?-> ({_MERMAID_ID})$"
    for src, dst in re.findall(edge, text, re.MULTILINE):
        assert {src, dst} <= declared


def parse_dot(text: str) -> Any:
    """Parse with pydot (a real DOT parser); returns the graph."""
    pydot = pytest.importorskip("pydot")
    graphs = pydot.graph_from_dot_data(text)
    assert graphs and len(graphs) == 1, "pydot could not parse the DOT output"
    return graphs[0]


def check_json(text: str) -> dict[str, Any]:
    """Strict JSON (no NaN) that validates against gradtool/schemas/graph.schema.json."""
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    schema_file = importlib.resources.files("gradtool") / "schemas" / "graph.schema.json"
    # jsonschema takes ~2 ms a node: a big graph is validated on its first and last nodes
    sample = {**doc, "nodes": doc["nodes"][:50] + doc["nodes"][-50:]}
    jsonschema.Draft202012Validator(json.loads(schema_file.read_text())).validate(sample)
    return doc


def check_all(graph: Graph, depth: int | None = None, parse: bool = True) -> dict[str, str]:
    """Render every format and check each against its grammar or schema."""
    out = {fmt: render(graph, fmt, depth) for fmt in FORMATS}
    check_mermaid(out["mermaid"])
    check_json(out["json"])
    if parse:
        parse_dot(out["dot"])
    return out


def drawn(tree: str) -> Counter[str]:
    """How many times each node is drawn in full in the tree (references start with ↪)."""
    return Counter(re.findall(r"^[│├└─ ]*(?:↓ )?(n\d+) ", tree, re.MULTILINE))


# --- golden outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["square_cube", "linear"])
def test_golden(case: str, fmt: str) -> None:
    text = render(globals()[case](), fmt)
    path = GOLDEN / f"{case}.{SUFFIX[fmt]}"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{path} differs (GRADTOOL_UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("case", ["square_cube", "linear"])
def test_golden_formats_are_valid(case: str) -> None:
    out = check_all(globals()[case]())
    assert not re.search(r"0x[0-9a-f]{6,}", "".join(out.values())), "memory address in output"


def test_user_text_is_escaped() -> None:
    out = check_all(record(fx.quoted, [tensor(3)], ["x"]))
    assert '\\"quoted\\"' in out["dot"] and "\\\\ backslash" in out["dot"]
    assert "#quot;quoted#quot; #lt;b#gt;label#lt;/b#gt; #35;1" in out["mermaid"]
    code = json.loads(out["json"])["nodes"][0]["source"]["code"]
    assert code.endswith('"quoted" <b>label</b> #1 with a \\ backslash {braces} [brackets] |pipe|')


def test_output_is_deterministic() -> None:
    assert render(square_cube(), "json") == render(square_cube(), "json")


# --- what the walk records ----------------------------------------------------------------------


def test_square_cube_structure() -> None:
    g = square_cube()
    add, pow_x, pow_y, leaf_x, leaf_y = g.nodes
    assert [n.name for n in g.nodes] == ["AddBackward0", "PowBackward0", "PowBackward0",
                                         "AccumulateGrad", "AccumulateGrad"]
    assert add.next == ("n1", "n2") and pow_x.next == ("n3",) and pow_y.next == ("n4",)
    assert (leaf_x.leaf.name, leaf_y.leaf.name) == ("x", "y")
    assert (leaf_x.leaf.shape, leaf_x.leaf.dtype) == ((5, 5), "float64")
    assert leaf_x.leaf.requires_grad
    assert {s.name: s.value for s in pow_y.saved if s.value}["exponent"] == "3"
    assert [(s.name, s.shape, s.arg) for s in pow_x.saved if s.shape] == [("self", (5, 5), "x")]
    assert add.source.code == "return x**2 + y**3" and add.source.file == "tests/fixtures_graph.py"
    assert g.outputs[0].node == "n0" and [n.depth for n in g.nodes] == [0, 1, 1, 2, 2]


def test_linear_function_is_marked_custom() -> None:
    g = linear()
    node = g.nodes[0]
    assert (node.name, node.kind, node.function) == (
        "LinearFunctionBackward", "custom", "fixtures_graph.LinearFunction")
    tensors = [(s.shape, s.arg) for s in node.saved if s.shape is not None]
    assert tensors == [((2, 3), "input"), ((4, 3), "weight"), ((4,), "bias")]
    assert {s.name: s.value for s in node.saved if s.shape is None} == {"has_bias": "True"}
    assert [n.leaf.name for n in g.nodes[1:]] == ["input", "weight", "bias"]
    assert node.source.code == "return LinearFunction.apply(input, weight, bias)"


def test_source_is_inside_the_forward_only() -> None:
    # torch.sin is called by record itself: no frame of the forward is user code, and the test
    # that called record did not create the node
    assert record(torch.sin, [tensor(3)], ["x"]).nodes[0].source is None
    # a Function applied directly gets the line its forward is defined on
    g = record(fx.LinearFunction.apply, [tensor(2, 3), tensor(4, 3)], ["x", "w"])
    source = g.nodes[0].source
    assert (source.file, source.function) == ("tests/fixtures_graph.py", "forward")
    assert source.code.startswith("def forward(ctx, input, weight, bias=None)")


def test_module_parameters_are_named_from_arg_names() -> None:
    layer = torch.nn.Linear(3, 2).double()
    weight, bias = (p.detach().clone().requires_grad_() for p in (layer.weight, layer.bias))

    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (x,))

    g = record(forward, [tensor(4, 3), weight, bias], ["input", "weight", "bias"])
    leaves = {n.leaf.name for n in g.nodes if n.leaf}
    assert leaves == {"input", "weight", "bias"}
    assert g.nodes[0].source.code.startswith("return torch.func.functional_call")  # not torch's


def test_leaf_made_inside_the_forward_gets_a_label() -> None:
    g = record(fx.made_inside, [tensor(3)], ["x"])
    leaves = [n.leaf for n in g.nodes if n.leaf]
    assert [(lf.name, lf.named) for lf in leaves] == [("x", True), ("<leaf n2>", False)]
    assert "<leaf n2>" in render(g, "tree")
    check_all(g)


def test_hooks_are_listed() -> None:
    x = tensor(3)
    x.register_hook(fx._double)
    g = record(fx.hooked, [x], ["x"])
    hooks = {n.name: n.hooks for n in g.nodes if n.hooks}
    assert hooks == {"ExpBackward0": ("_double",), "AccumulateGrad": ("_double",)}
    assert "hooks: _double" in render(g, "tree")


def test_outputs_that_are_leaves_or_need_no_gradient() -> None:
    g = record(lambda x, n: (x, n.sum()), [tensor(3), torch.ones(2)], ["x", "n"])
    assert [o.node for o in g.outputs] == ["n0", None]
    assert g.nodes[0].leaf.name == "x"
    assert "no gradient" in render(g, "tree")
    check_all(g)


def test_shared_node_appears_once() -> None:
    g = record(fx.shared, [tensor(4)], ["x"])
    assert [n.name for n in g.nodes].count("SinBackward0") == 1
    sin = next(n.id for n in g.nodes if n.name == "SinBackward0")
    out = check_all(g)
    assert drawn(out["tree"])[sin] == 1 and f"↪ {sin} SinBackward0" in out["tree"]
    assert len(re.findall(rf"^    {sin} \[", out["dot"], re.MULTILINE)) == 1
    assert len(re.findall(rf"-> {sin};", out["dot"])) == 2
    assert len(re.findall(rf"^    {sin}\[", out["mermaid"], re.MULTILINE)) == 1
    assert [n["id"] for n in json.loads(out["json"])["nodes"]].count(sin) == 1


def test_shared_output_node() -> None:
    g = record(fx.two_outputs, [tensor(3)], ["x"])
    assert len(g.nodes) == 3 and [o.name for o in g.outputs] == ["output[0]", "output[1]"]
    check_all(g)


def test_each_output_s_subtree_is_drawn_under_its_own_label() -> None:
    # pytorch_wavelets' two-level DWT (3 outputs): every label came first, then the subtrees
    # (the last output's first), under the wrong labels
    def three(x):
        a = x.sin()
        return a.exp(), x.cos(), a * 2
    tree = render(record(three, [tensor(3)], ["x"]), "tree").splitlines()
    labels = [i for i, line in enumerate(tree) if "output[" in line]
    assert len(labels) == 3 and labels[1] > labels[0] + 1 and labels[2] > labels[1] + 1, tree
    under = tree[labels[0] + 1:labels[1]]
    assert any("ExpBackward0" in line for line in under), tree
    assert any("CosBackward0" in line for line in tree[labels[1] + 1:labels[2]]), tree
    assert any("MulBackward0" in line for line in tree[labels[2] + 1:]), tree


# --- scale, depth, collapsing -------------------------------------------------------------------


def test_deeper_than_recursion_limit(deep_graph: Graph) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, whatever a plugin raised it to
    try:
        assert len(deep_graph.nodes) == 2 * 2000 + 1
        assert max(n.depth for n in deep_graph.nodes) > sys.getrecursionlimit()
        out = check_all(deep_graph, parse=False)
    finally:
        sys.setrecursionlimit(limit)
    assert len(json.loads(out["json"])["nodes"]) == len(deep_graph.nodes)
    tree = out["tree"]
    assert drawn(tree) == Counter(n.id for n in deep_graph.nodes)  # each node drawn exactly once
    assert max(len(line) for line in tree.splitlines()) < 200  # deep nesting goes on in sections
    assert len(re.findall(r"^    n\d+ \[", out["dot"], re.MULTILINE)) == len(deep_graph.nodes)


def test_deep_dot_parses(deep_graph: Graph) -> None:
    dot = parse_dot(render(deep_graph, "dot", depth=40))  # pydot is slow: a slice of it
    assert len(dot.get_edges()) > 40


def test_same_op_chain_collapses() -> None:
    g = record(fx.chain, [tensor(3), 3000], ["x", "n"])
    assert len(g.nodes) == 3001
    out = check_all(g)
    assert "n0…n2999 AddBackward0 ×3000" in out["tree"]
    assert len(out["tree"].splitlines()) < 10
    chains = json.loads(out["json"])["chains"]
    assert [(c["pattern"], c["repeat"], len(c["nodes"])) for c in chains] == [
        (["AddBackward0"], 3000, 3000)]


def test_repeated_pattern_collapses() -> None:
    g = record(fx.alternating, [tensor(3), 2000], ["x", "n"])
    assert len(g.nodes) == 2001
    out = check_all(g)
    assert "n0…n1999 (MulBackward0 → AddBackward0) ×1000" in out["tree"]


def test_depth_limit_shows_an_ellipsis() -> None:
    out = check_all(square_cube(), depth=1)
    assert "… 2 inputs beyond depth 1" in out["tree"] and "n1 " not in out["tree"]
    assert "n0_more" in out["dot"] and "n0_more" in out["mermaid"]
    doc = json.loads(out["json"])
    assert [n["id"] for n in doc["nodes"]] == ["n0"] and doc["nodes"][0]["truncated"]
    assert (doc["depth_limit"], doc["hidden_nodes"]) == (1, 4)


def test_depth_limit_on_a_deep_graph(deep_graph: Graph) -> None:
    out = check_all(deep_graph, depth=5)
    assert json.loads(out["json"])["hidden_nodes"] > 3900
    assert len(out["tree"].splitlines()) < 100


# --- gradients ----------------------------------------------------------------------------------


def test_grads_point_at_the_node_that_makes_nan() -> None:
    x, y = tensor(5, 5), tensor(5, 5, seed=1)
    g = record(fx.nan_then_sum, [x, y], ["x", "y"], grads=True)
    assert x.grad is None and y.grad is None  # .grad is left alone
    (problem,) = g.problems
    node = g.nodes[int(problem.node[1:])]
    assert (node.function, problem.kind, problem.input) == ("fixtures_graph.NanForSecond", "nan", 1)
    assert "(y)" in problem.message
    leaf_y = next(n for n in g.nodes if n.leaf and n.leaf.name == "y")
    assert leaf_y.grad.received[0].nan and not leaf_y.grad.problems  # downstream, not the origin
    out = check_all(g)
    assert re.search(rf"{node.id} NanForSecondBackward.*\n(.*\n)*?.*✗ produced a NaN gradient",
                     out["tree"])
    assert "✗" in out["mermaid"] and "color=red" in out["dot"]


def test_grads_flag_an_all_zero_gradient() -> None:
    g = record(fx.rounded, [tensor(4)], ["x"], grads=True)
    found = [(g.nodes[int(p.node[1:])].name, p.kind) for p in g.problems]
    assert found == [("RoundBackward0", "zero")]


def test_grads_flag_gradients_that_cancel() -> None:
    g = record(fx.cancels, [tensor(4)], ["x"], grads=True)
    (problem,) = g.problems
    assert g.nodes[int(problem.node[1:])].leaf.name == "x"
    assert (problem.kind, problem.input) == ("zero", None)


def test_grads_report_a_backward_that_raises() -> None:
    g = record(fx.raising, [tensor(3)], ["x"], grads=True)
    assert "backward is not implemented" in g.backward_error
    assert "✗ backward raised RuntimeError" in render(g, "tree")
    check_all(g)


def test_grads_annotate_norms() -> None:
    g = record(fx.square_cube, [tensor(2), tensor(2, seed=1)], ["x", "y"], grads=True, seed=3)
    assert not g.problems and all(n.grad for n in g.nodes)
    assert all(s.norm > 0 for n in g.nodes for s in n.grad.received)
    assert "grad norm in [" in render(g, "tree")
    check_all(g)


def test_grads_on_a_deep_graph() -> None:
    g = record(fx.alternating, [tensor(3), 1500], ["x", "n"], grads=True)
    assert sum(n.grad is not None for n in g.nodes) == 1501


# --- renderer API -------------------------------------------------------------------------------


def test_render_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown graph format 'png'"):
        render(square_cube(), "png")
    with pytest.raises(ValueError, match="depth"):
        render(square_cube(), "tree", depth=-1)


def test_styled_tree_has_the_same_text() -> None:
    g = square_cube()
    assert styled_tree(g).plain + "\n" == render(g, "tree")
