"""Problem: a target bound to sampled arguments, with counted forward evaluations and VJPs."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.variable import Variable

from ..heartbeat import Calls
from ..tracebacks import calls_user_code
from .facts import Facts, output_names  # noqa: F401 - output_names re-exported
from .handed import served
from .ledger import Ledger, graph_key  # noqa: F401 - graph_key re-exported
from .placement import same_devices
from .rng import frozen_rng  # noqa: F401 - re-exported: probe.py imports it from here
from .sparse import Encoding, dense_output


@dataclass
class Cache:
    """A Problem's performance memos: how to evaluate it fast, never what it is. One typed slot
    per memo, each written by the code that learns it; a later check of the same case reads it."""

    vmap_ok: bool | None = None         # fn batches under vmap (numerics/steps.py, on first use)
    unbatched: str | None = None        # why batching was dropped as slower than plain calls
    # The inputs (None: all at once) whose batches were checked against plain calls: a batching
    # rule may be wrong for one argument only (torch's _cdist_backward, batched grad_output).
    vmap_checked: set[int | None] = field(default_factory=set)
    batched_vjp_ok: bool | None = None  # backward batches under vmap (numerics/steps.py)
    batched_jvp_ok: bool | None = None  # jvps batch under torch.func.vmap (numerics/forward.py)
    plan: Any = None                    # what choose_mode learnt, for check_full to reuse
    forward_seconds: float = 0.0        # the priming forward's time, for predictions
    # The probe's graph forward, handed out once (to the contract, else the gradient's prime).
    first_graph: tuple[list[torch.Tensor], Any] | None = None
    # The gradient check's graph forward, kept when double backward runs: G derives from it.
    gradient_graph: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    # backward's gradients at a zero grad_output, per differentiable input (a diagnosis's).
    zero_cotangent: list[Any] | None = None
    # The gradient check's outcome in this run: double backward of a backward already wrong
    # at first order stops at its first failing input (checks/double_backward.py).
    first_order: Any = None
    # The contract's linearity test in this run: backward linear in grad_output (None: not run).
    linear: bool | None = None
    # ... deferred to read the gradient check's one-hot rows (checks/linear_rows.py): the
    # runner asks for it (defer_linearity), the contract leaves what it needs (pending).
    defer_linearity: bool = False
    pending_linearity: Any = None
    # The analytical Jacobian full mode computed (rows of backward): double backward's G along
    # grad_output is linear, and these are its exact columns there (numerics/jacobian.py).
    jacobian: Any = None
    # ... and the inputs (positions) whose first-order block failed: swept first by then.
    first_order_failing: tuple[int, ...] = ()
    # The gradient check's forwards evaluated call by call, with their graphs, when double
    # backward runs next: its G at the same point runs backward through one (_Backward there).
    # graph_key(values) -> (leaves, outputs with a graph); None: not recorded (see recording).
    graphs: dict | None = None
    recording: bool = False  # the gradient check's sweep is running: record its forwards
    recorded_bytes: int = 0  # their inputs' and outputs' bytes: a budget (RECORDED_BYTES)
    # run/culprit.py:record's Function applications, shared by the contract's inner check, the
    # culprit search and double backward's (one recording forward, not three).
    applications: Any = None
    applications_s: float = 0.0  # that recording forward's seconds: the culprit's budget gate
    # The dtype the forward computes in where coarser than its inputs', learnt once by
    # numerics/coarse.py:forward_dtype ((None,): not coarser; None: not learnt yet).
    forward_dtype: tuple[Any] | None = None
    # The case's evaluations recorded by the check that paid them, read by the checks after
    # it (numerics/ledger.py: the contract's graph and backwards, for the layout check's
    # baseline and the gradient diagnosis's zero grad_output).
    ledger: Ledger = field(default_factory=Ledger)
    # The caller takes a pass or nothing (the drop-in's lean path): a sweep gives up at its
    # first failing comparison (columns.NotAPass), paying no failure's evidence.
    pass_only: bool = False

    def take_first_graph(self) -> tuple[list[torch.Tensor], Any] | None:
        first, self.first_graph = self.first_graph, None
        return first

    def take_gradient_graph(self) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        graph, self.gradient_graph = self.gradient_graph, None
        return graph

    def take_graphs(self) -> dict:
        graphs, self.graphs = self.graphs, None
        return graphs or {}


@dataclass(frozen=True)
class Problem:
    """fn(*args) with the differentiable argument positions named; every evaluation is counted.

    Frozen once built: a derived problem (double backward's, the float64 reference, a Function
    captured inside a model) is a new Problem, made complete by its constructor (or
    dataclasses.replace). What is learnt later lives in two explicit places: `facts`, replaced
    whole by learn() (the probe phase), and `cache`, the performance memos.

    calls counts evaluations, not Python calls: a batched call over B perturbations adds B, so
    the counts compare directly with gradcheck's (2 n_in forwards, n_out backwards).
    """

    fn: Callable[..., Any]
    args: list[Any]
    names: list[str]                  # one per positional argument
    diff: list[int]                   # positions of the arguments whose gradients are checked
    output_labels: list[str] | None = None  # names to give the outputs instead of 'output k'
    batched_fn: Callable[..., Any] | None = None  # fn that vmap can batch (None: unknown)
    facts: Facts = field(default_factory=Facts)  # learnt once by the probe phase, then read
    calls: Counter[str] = field(default_factory=Calls)
    keep_all_outputs: bool = False    # compare untracked outputs too (a derived backward's)
    cache: Cache = field(default_factory=Cache)  # performance memos only
    # scope(args): a context binding the target's parameters to args' values (a module's), so
    # that a backward which re-runs forward (checkpointing, adjoints) sees what forward saw.
    scope: Callable[[Sequence[Any]], contextlib.AbstractContextManager[None]] | None = None
    # Indices of the inputs (as in `inputs`) fn is linear in (double backward's grad_outputs, as
    # the contract's linearity test found): f(x - d) = 2 f(x) - f(x + d), so a difference
    # along them evaluates one side.
    linear_in: tuple[int, ...] = ()
    # Exact derivative columns already known along an input (as in `inputs`): known[i](cols)
    # -> (n_out, len(cols)). Double backward's G along grad_output is linear, its columns
    # the gradient check's analytical rows: its sweep reads them instead of evaluating.
    known: dict[int, Callable[[Any], Any]] = field(default_factory=dict)
    # Sparse arguments by position (in args), held as strided values and rebuilt in their
    # layout inside fn (numerics/sparse.py): a check that needs the layout itself skips them.
    sparse: dict[int, Encoding] = field(default_factory=dict)

    def learn(self, facts: Facts) -> None:
        """Replace the facts whole (the probe phase, or the first forward of a Problem the
        probe never saw): the one thing about a Problem learnt after it is built."""
        object.__setattr__(self, "facts", facts)

    # The facts, read where the engine needs them (set only by replacing `facts` whole).
    @property
    def mutates(self) -> bool:
        return self.facts.mutates

    @property
    def freeze_seed(self) -> int | None:
        return self.facts.seed

    @property
    def output_mask(self) -> list[bool] | None:
        mask = self.facts.output_mask
        return None if mask is None else list(mask)

    @property
    def output_names(self) -> list[str]:
        return list(self.facts.output_names)

    @property
    def left_out(self) -> list[str]:
        return list(self.facts.left_out)

    @property
    def complex(self) -> bool | None:
        return self.facts.complex

    @property
    def has_functions(self) -> bool:
        return self.facts.has_functions

    def take_first_graph(self) -> tuple[list[torch.Tensor], Any] | None:
        """The probe's graph forward (leaves, raw result), handed out once (to the contract)."""
        return self.cache.take_first_graph()

    @property
    def inputs(self) -> list[torch.Tensor]:
        return [self.args[i] for i in self.diff]

    @property
    def input_names(self) -> list[str]:
        return [self.names[i] for i in self.diff]

    def given_args(self) -> list[Any]:
        """The arguments as the target receives them (sparse ones rebuilt): what to save."""
        return [self.sparse[k].rebuild(a).detach() if k in self.sparse else a
                for k, a in enumerate(self.args)]

    def with_inputs(self, values: Sequence[torch.Tensor]) -> list[Any]:
        """The full argument list with the differentiable ones replaced; the other tensors are
        fresh copies, so a forward that marks, resizes or keeps them cannot change the case."""
        given = dict(zip(self.diff, values))  # not copied only to be replaced (every call)
        return [given[k] if k in given else _fresh(a) if isinstance(a, torch.Tensor) else a
                for k, a in enumerate(self.args)]

    @calls_user_code
    def outputs(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Differentiable outputs of a forward at `values`, without building a graph."""
        # Fresh tensors every call: the forward may mark them (requires_grad_), resize or keep
        # them, and gradtool writes into its own buffers afterwards (the failing path does).
        self.placed(values)
        kept = None if self.cache.recording else \
            served(self.fn, self.diff, values, self.output_mask)  # the drop-in's, handed over
        if kept is not None:
            return kept
        values = [_fresh(v) for v in values]
        if self.cache.recording and len(self.cache.graphs) < RECORDED:
            return self._recorded(values)
        with torch.no_grad(), self.rng():
            self.calls["forward"] += 1
            outs = select_outputs(self.fn(*self.with_inputs(values)), self.output_mask)
        # Values only: a forward that turns grad on itself (a kernel wrapper recomputing under
        # enable_grad) returns outputs with a graph, which would flow into gradtool's buffers.
        return [o.detach() for o in outs]

    def placed(self, values: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """values, once each is shown to be on its argument's device: a value gradtool made
        elsewhere is gradtool's bug, caught here before the target sees it, never an error
        blamed on the target."""
        same_devices(values, self.inputs, "value of input")
        return values

    def recording(self, on: bool) -> None:
        """Record (on) the graphs of the forwards evaluated call by call from now on, for double
        backward to run backward through (outputs' values unchanged): only where they can
        stand for a fresh forward there (no parameters to bind, inputs not written to, no
        randomness), custom Functions inside (an expensive forward, the graph cheap), and
        few inputs (each graph is kept until double backward takes them)."""
        if not on:
            self.cache.recording = False
        elif (self.scope is None and not self.mutates and self.freeze_seed is None
                and self.has_functions and sum(v.numel() for v in self.inputs) <= RECORDED // 2):
            self.cache.graphs, self.cache.recording, self.cache.recorded_bytes = {}, True, 0

    def _recorded(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """outputs() with a graph, kept in cache.graphs under the values' key."""
        key = graph_key(values)
        leaves = [v.requires_grad_(True) for v in values]
        with torch.enable_grad():
            self.calls["forward"] += 1
            outs = select_outputs(self.fn(*self.with_inputs(leaves)), self.output_mask)
        self.cache.graphs[key] = (leaves, [o for o in outs if o.requires_grad])
        # What a graph holds is mostly tensors of its inputs' and outputs' sizes: past the
        # budget, the rest of the sweep runs without one.
        self.cache.recorded_bytes += sum(t.numel() * t.element_size() for t in leaves + outs)
        if self.cache.recorded_bytes > RECORDED_BYTES:
            self.cache.recording = False
        return [o.detach() for o in outs]

    @calls_user_code
    def graph(self, values: Sequence[torch.Tensor] | None = None
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(leaves, outputs) of a forward that records the autograd graph."""
        source = self.inputs if values is None else self.placed(values)
        # Fresh leaves: a forward that writes to its inputs cannot corrupt the case.
        leaves = [v.detach().clone().requires_grad_(True) for v in source]
        with torch.enable_grad(), self.rng():
            self.calls["forward"] += 1
            passed = [leaf.clone() for leaf in leaves] if self.mutates else leaves
            outs = select_outputs(self.fn(*self.with_inputs(passed)), self.output_mask)
        return leaves, outs

    def recordable(self) -> tuple[Callable[..., Any], list[Any], list[str]]:
        """(fn, its arguments with the differentiable ones as leaves requiring grad, their
        names): a forward for `gradtool graph` to record."""
        args = [a.detach().requires_grad_(True) if i in self.diff else a
                for i, a in enumerate(self.args)]
        return self.fn, args, self.names

    def bind(self, args: Sequence[Any]) -> contextlib.AbstractContextManager[None]:
        """The parameters bound to args' values (a no-op for targets without parameters)."""
        return contextlib.nullcontext() if self.scope is None else self.scope(args)

    def bound_to(self, leaves: Sequence[torch.Tensor]) -> contextlib.AbstractContextManager[None]:
        """bind() at these leaves; without a scope, no argument list is built (with_inputs
        copies the other tensors, which a backward without parameters never needs: double
        backward's evaluations call it once or twice each)."""
        if self.scope is None:
            return contextlib.nullcontext()
        return self.scope(self.with_inputs(leaves))

    def rng(self) -> contextlib.AbstractContextManager[None]:
        """Re-seed torch's RNG around a call of a stochastic forward (a no-op otherwise)."""
        if self.freeze_seed is None:
            return contextlib.nullcontext()  # the common case: no generator frame per call
        return frozen_rng(self.freeze_seed)

    def vjp(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            grads: Sequence[torch.Tensor], create_graph: bool = False) -> list[torch.Tensor]:
        """vᵀJ for every leaf (zeros where unused), straight through autograd's engine."""
        self.calls["backward"] += 1
        same_devices(grads, outs, "grad_output")
        with self.bound_to(leaves):
            return vjp(outs, leaves, own_storage(grads), create_graph=create_graph)

    def vjp_batched(self, leaves: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                    grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Many VJPs at once: each grads[k] has a leading batch dimension."""
        from torch._vmap_internals import _vmap

        from .batching import quiet_batching

        same_devices(grads, outs, "grad_output")

        # The legacy vmap batches the engine itself (autograd.grad's is_grads_batched path).
        with self.bound_to(leaves), quiet_batching(legacy=True):
            result = [r.detach() for r in _vmap(
                lambda *g: tuple(vjp(outs, leaves, g, batched=True)), 0, 0)(*grads)]
        self.calls["backward"] += int(grads[0].shape[0]) if grads else 0
        return result


RECORDED = 512  # graphs recorded for double backward at most (2 per input element)
RECORDED_BYTES = 64 * 2**20


def own_storage(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor a new one, alone in a storage of its own, offset 0, as the user would pass it.

    A perturbed value is a row of a batch (a view at some storage offset); ops that address the
    storage itself (as_strided, as_strided_scatter) would read the neighbouring rows. And a new
    tensor every time: user code may keep, resize or write to what it receives (a backward's
    grad_output too), and gradtool reuses its buffers. clone() keeps a graph (double backward).
    """
    return [_copy(t) for t in tensors]


def _copy(t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided:  # sparse and other layouts: no storage offset to drop
        return t.clone()
    return t.clone(memory_format=torch.contiguous_format)


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of t's value with no history: its own identity, storage and autograd state."""
    return _copy(t.detach())


@calls_user_code
def vjp(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor], create_graph: bool = False,
        batched: bool = False) -> list[torch.Tensor]:
    """autograd.grad without its grad_outputs validation, which imports sympy (~0.3 s).
    `batched`: inside the legacy vmap, which has no batching rule for detach: the caller
    detaches the results once out of it."""
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(leaf) for leaf in leaves]
    roots, seeds = tuple(o for o, _ in pairs), tuple(g for _, g in pairs)
    try:
        result = Variable._execution_engine.run_backward(
            roots, seeds, True, create_graph, tuple(leaves), True, False)
    except RuntimeError as exc:
        if REENTRANT not in str(exc):
            raise
        result = _into_grad(roots, seeds, leaves, create_graph)
    return [torch.zeros_like(leaf) if r is None else _gradient(r, create_graph or batched)
            for leaf, r in zip(leaves, result)]


def _gradient(r: torch.Tensor, create_graph: bool) -> torch.Tensor:
    """A leaf's gradient as the engine compares it: dense (a sparse gradient of a dense input
    is legal: nn.Embedding(sparse=True)) and, without create_graph, free of any graph a backward
    that turns grad on itself attached to it."""
    if r.layout != torch.strided:
        r = r.to_dense()
    return r if create_graph else r.detach()


REENTRANT = "incompatible with .grad()"  # torch.utils.checkpoint(use_reentrant=True)


def _into_grad(roots: tuple[torch.Tensor, ...], seeds: tuple[torch.Tensor, ...],
               leaves: Sequence[torch.Tensor], create_graph: bool) -> list[Any]:
    """The VJP as .backward() computes it, read from the leaves' .grad (restored after): for
    graphs that refuse autograd.grad, such as reentrant checkpointing."""
    saved = [leaf.grad for leaf in leaves]
    try:
        for leaf in leaves:
            leaf.grad = None
            if not leaf.is_leaf:
                leaf.retain_grad()
        Variable._execution_engine.run_backward(roots, seeds, True, create_graph, (), True, True)
        return [None if leaf.grad is None else _gradient(leaf.grad, create_graph)
                for leaf in leaves]
    finally:
        for leaf, grad in zip(leaves, saved):
            leaf.grad = grad


def function_nodes(outputs: Sequence[torch.Tensor]) -> dict[int, Any]:
    """Every custom Function node reachable from the outputs, by id (an iterative walk)."""
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    visited: dict[int, Any] = {}  # holds the nodes too, so their ids stay unique
    found: dict[int, Any] = {}
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited[id(node)] = node
        if getattr(type(node), "_forward_cls", None) is not None:
            found[id(node)] = node
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return found


def tensor_outputs(result: Any) -> list[Any]:
    """Flatten a forward's result into its tensors, in order (non-tensors dropped)."""
    if isinstance(result, torch.Tensor):
        return [dense_output(result)]  # a sparse output is compared as its dense tensor
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in tensor_outputs(item)]
    if isinstance(result, dict):
        return [t for item in result.values() for t in tensor_outputs(item)]
    return []


def select_outputs(result: Any, mask: list[bool] | None) -> list[torch.Tensor]:
    tensors = tensor_outputs(result)
    if mask is None:
        return tensors
    return [t for t, keep in zip(tensors, mask) if keep]


def flat_cat(tensors: Sequence[torch.Tensor], batch: bool = False) -> torch.Tensor:
    """Concatenate flattened tensors (keeping a leading batch dimension when batch=True)."""
    if batch:
        flat = [t.reshape(t.shape[0], -1) for t in tensors]
    else:
        flat = [t.reshape(-1) for t in tensors]
    # One tensor: a view, not a copy (callers only read it).
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1 if batch else 0)


def vjp_rows(problem: Problem, vjp: Callable[[list[Any], list[torch.Tensor]], Sequence[Any]]
             ) -> Callable[[torch.Tensor], torch.Tensor]:
    """rows(grad_rows): a Jacobian given as a VJP of the whole argument list (a spec's declared
    surrogate) in the analytical rows' layout: one row per grad_output row, over the
    differentiable inputs, zeros where the VJP gives no gradient."""
    def rows(grad_rows: torch.Tensor) -> torch.Tensor:
        outs = problem.outputs(problem.inputs)
        out = []
        for row in grad_rows:
            given = vjp(problem.args, split_flat(row, [o.shape for o in outs]))
            picked = [given[p] if p < len(given) and given[p] is not None
                      else torch.zeros_like(problem.args[p]) for p in problem.diff]
            out.append(flat_cat(picked))
        return torch.stack(out)

    return rows


def split_flat(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Inverse of flat_cat for a leading batch dimension (or none; a 0-d shape: reshape(()))."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    batch = flat.shape[:-1]
    return [p.reshape((*batch, *s)) for p, s in zip(flat.split(sizes, dim=-1), shapes)]
