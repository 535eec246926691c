"""The plain data of an autograd graph: nodes, leaves, saved tensors, gradient flow and problems."""

from __future__ import annotations

from dataclasses import dataclass


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
