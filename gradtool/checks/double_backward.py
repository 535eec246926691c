"""double_backward: the gradient check applied to backward itself (what gradgradcheck does)."""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import replace
from collections.abc import Callable
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics.facts import Facts
from ..diagnosis.block import Diagnosis
from ..numerics.jacobian import Verdict
from ..numerics.coarse import forward_dtype
from ..numerics.problem import Problem, function_nodes, graph_key, select_outputs, vjp
from ..results import Block, CheckResult, Finding, Outcome, Severity
from ..targets.cases import Case
from ..targets.load import Target
from ..tracebacks import calls_user_code
from ._common import Context
from .gradient import as_numpy, jacobian_result

ONCE = "once_differentiable"
_UNSUPPORTED_NOTE = "torch has no derivative of an op this backward uses; gradgradcheck raises too"
# autograd's words when an op's backward has no derivative of its own (RuntimeError from
# ATen's not_implemented, NotImplementedError from the derivatives.yaml stubs).
SPARSE = ("sparse inputs: many of torch's sparse kernels have no correct second derivative, "
          "so a mismatch could not be told from torch's own")
NOT_IMPLEMENTED = re.compile(r"[^\n]*derivative for \S+ is not implemented[^\n]*")


def check_double_backward(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """Check the Jacobian of (inputs, grad_outputs) -> backward's gradients."""
    if target.once_differentiable:
        return CheckResult(
            "double_backward", Outcome.SKIPPED,
            f"backward is decorated with @once_differentiable ({target.source}): "
            "double backward is unsupported by design", source=target.source)
    if case.problem.sparse:
        return CheckResult("double_backward", Outcome.SKIPPED, SPARSE)
    problem, single = _derive(case.problem, case.seed)
    if single is not None:
        reason, source = single
        return CheckResult("double_backward", Outcome.SKIPPED,
                           f"{reason}: double backward is unsupported by design", source=source)
    if problem is None:
        return CheckResult("double_backward", Outcome.SKIPPED, "no differentiable output")
    engine = _Engine(case.problem)
    result = jacobian_result("double_backward", problem, target, config, case.seed, None, None,
                             _diagnose, engine, forward=case.problem)
    if engine.no_graph and result.outcome is Outcome.FAILED:
        result = replace(result, details=(*result.details, ONCE_HINT))
    case.problem.calls.update(problem.calls)
    if result.outcome is Outcome.ERROR and ONCE in (result.traceback or ""):
        return CheckResult("double_backward", Outcome.SKIPPED,
                           "a Function inside is decorated with @once_differentiable: "
                           "double backward is unsupported by design")
    unsupported = _not_implemented(result)
    if unsupported:
        return CheckResult("double_backward", Outcome.SKIPPED,
                           f"torch cannot differentiate this backward: {unsupported}",
                           (_UNSUPPORTED_NOTE,), calls=result.calls,
                           duration_s=result.duration_s)
    if result.outcome is Outcome.ERROR and _raises_differentiated(case.problem):
        return _undifferentiable(result)
    return result


def _weights(out: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """G's grad_output, ±[0.5, 1) (complex: each part, /√2): gradgradcheck's tolerance assumes
    weights in [-1, 1] (a normal draw's up to 3 pushed a solver's error past it; tiny hid one)."""
    def part() -> torch.Tensor:  # [0, .5) -> [-1, -.5); [.5, 1) stays
        r = torch.rand(out.shape, generator=gen, dtype=torch.float64, device="cpu")
        return torch.where(r < 0.5, r - 1, r)
    drawn = torch.complex(part(), part()) / 2 ** 0.5 if out.is_complex() else part()
    return drawn.to(out.device, out.dtype)


def _raises_differentiated(problem: Problem) -> bool:
    """Whether backward runs plainly but raises once differentiated (twice, through grad_output
    too, as the check's rows are): `.numpy()`, an op with no derivative, an in-place write."""
    try:
        leaves, outs = problem.graph()
        outs = [o for o in outs if o.requires_grad]
        problem.vjp(leaves, outs, [torch.ones_like(o) for o in outs])
    except Exception:  # noqa: BLE001 - backward itself raises: an error, reported as one
        return False
    try:
        with torch.enable_grad():
            leaves, outs = problem.graph()
            outs = [o for o in outs if o.requires_grad]
            # grad_outputs that require grad, as G's are: a backward may fail on them alone
            seeds = [torch.ones_like(o).requires_grad_() for o in outs]
            grads = [g.sum() for g in problem.vjp(leaves, outs, seeds, create_graph=True)
                     if g.requires_grad]
            with problem.bind(problem.with_inputs(leaves)):
                for _ in range(2):
                    vjp(grads, [*leaves, *seeds], [torch.ones_like(g) for g in grads])
    except Exception:  # noqa: BLE001 - raised only when differentiated
        return True
    return False


def _undifferentiable(error: CheckResult) -> CheckResult:
    """A backward that raises when differentiated: a warning naming the fix, not an error."""
    text = (f"double backward unsupported: backward raises when differentiated "
            f"({error.summary.replace(' raised:', ':')}); if it is not meant to be "
            "differentiated twice, decorate it with @once_differentiable (this check is then "
            "skipped, saying so), or leave this check out (checks=..., --check, or `checks` "
            "in [tool.gradtool])")
    return CheckResult("double_backward", Outcome.SKIPPED, text, source=error.source,
                       traceback=error.traceback, calls=error.calls,
                       duration_s=error.duration_s,
                       findings=(Finding("double_backward.unsupported", text,
                                         Severity.WARNING, source=error.source,
                                         data={"exception": error.exception, "summary": True}),))


# Second order of a backward already known wrong: the report needs one confirmed failure, the
# user's next step is the first-order fix, and after it a full run checks every input again.
STOP = ("backward is already wrong at first order (the gradient check failed), so double "
        "backward stopped at its first block with a confirmed failure, trying first the "
        "inputs whose first-order gradient failed; `--check double_backward` alone, or "
        "--exhaustive, checks every block")
# A backward computed without a graph (an adjoint solve, no_grad, detach) has a second
# derivative of zero everywhere: every block with nonzero finite differences fails alike.
NO_GRAPH = ("backward's gradients carry no graph (computed under no_grad, detached, or by a "
            "solver outside autograd, as adjoint methods are), so every second derivative it "
            "gives is zero and every block whose finite differences are nonzero fails the "
            "same way: double backward stopped at its first block with a confirmed failure, "
            "trying the grad_output columns first (--exhaustive checks every block)")
ONCE_HINT = ("backward returns its gradients without a graph: if it is not meant to be "
             "differentiated twice (an adjoint method, say), decorate it with "
             "@once_differentiable and this check is skipped, saying so; for a library's "
             "Function you cannot edit, leave this check out (--check contract --check "
             "gradient --check layout, or `checks` in [tool.gradtool])")


class _Engine:
    """Reverse mode, told to stop at the first failing block when backward's gradients have no
    graph (`no_graph`), sweeping first the grad_output columns (G is linear there: a backward
    each through one forward's graph), or else when the gradient check of this run failed,
    sweeping first the inputs whose gradient failed (where G's graph passes through the
    Function's output, the wrong first order shows in their columns). A second order that
    passes is still checked whole: no verdict changes."""

    def __init__(self, problem: Problem) -> None:
        self.problem, self.no_graph = problem, False

    def __call__(self, derived: Problem, config: CheckConfig, leaves: list[torch.Tensor],
                 outs: list[torch.Tensor], seed: int, reference: Any) -> Any:
        from .gradient import reverse_mode

        problem, stop, first = self.problem, None, ()
        self.no_graph = bool(outs) and not any(o.requires_grad for o in outs)
        # --exhaustive: every block, whatever the first order said
        if self.no_graph and not config.exhaustive:  # its columns are the cheapest
            stop, first = NO_GRAPH, tuple(range(len(problem.input_names), len(leaves)))
        elif problem.cache.first_order is Outcome.FAILED and not config.exhaustive:
            stop, first = STOP, problem.cache.first_order_failing
        known = "backward's gradients carry no graph, so no probe first" if stop is NO_GRAPH \
            else None
        return reverse_mode(derived, config, leaves, outs, seed, reference, stop, first, known)


def _not_implemented(result: CheckResult) -> str | None:
    """torch's own message when backward uses an op whose derivative torch does not implement."""
    if result.outcome is not Outcome.ERROR:
        return None
    found = NOT_IMPLEMENTED.search(result.traceback or result.summary)
    return found.group(0).split(": ", 1)[-1].strip() if found else None


def backward_problem(problem: Problem, seed: int) -> Problem | None:
    """G(x..., v...) = vᵀ∂f/∂x: a problem whose Jacobian is the second derivative."""
    return _derive(problem, seed)[0]


def first_order_only(outs: list[torch.Tensor]) -> tuple[str, str | None] | None:
    """(why, where) a Function in the graph cannot be differentiated twice, or None."""
    # Only a graph that used checkpoint holds its Function, and then it is imported; importing
    # it here would pull sympy in on torch before 2.7 (the cold start stays free of it).
    checkpoint = sys.modules.get("torch.utils.checkpoint")
    checkpoint_function = getattr(checkpoint, "CheckpointFunction", None)

    from ..targets.load import is_once_differentiable, source_of

    for node in function_nodes(outs).values():
        cls = node._forward_cls
        if is_once_differentiable(cls.backward):
            where = source_of(cls.backward)
            return f"{cls.__qualname__}.backward is decorated with @{ONCE} (at {where})", where
        if checkpoint_function is not None and cls is checkpoint_function:  # it differentiates its block with .backward(), no graph
            return ("torch.utils.checkpoint(use_reentrant=True) computes gradients without "
                    "a graph (use use_reentrant=False for double backward)", None)
    return None


def _derive(problem: Problem, seed: int
            ) -> tuple[Problem | None, tuple[str, str | None] | None]:
    """The derived problem G, or why backward cannot be differentiated."""
    with torch.enable_grad():  # the gradient check's graph forward, when it left one
        leaves, outs = problem.cache.take_gradient_graph() or problem.graph()
    single = first_order_only(outs)
    if single is not None:
        return None, single
    outs = [o for o in outs if (o.is_floating_point() or o.is_complex()) and o.requires_grad]
    if not outs:
        return None, None
    forward_dtype(problem, outs)  # learnt from these outputs, not a new forward
    gen = torch.Generator().manual_seed(seed + 202)
    grads = [_weights(o, gen) for o in outs]
    n = len(leaves)
    g = _Backward(problem, n, problem.cache.take_graphs())
    names = problem.input_names + [_grad_name(name) for name in problem.output_names or
                                   [f"output {k}" for k in range(len(outs))]]
    # No vmap-friendly forward, or one that writes to its inputs (the plain G copies them
    # first): finite differences loop.
    batched = _batchable_backward(problem, n) \
        if problem.batched_fn is not None and not problem.mutates else None
    # The outer backward runs through the inner one: the parameters are bound there too.
    scope = None if problem.scope is None else \
        (lambda args: problem.bind(problem.with_inputs(list(args[:n]))))
    derived = Problem(g, [x.detach() for x in leaves] + grads, names,
                      list(range(n + len(grads))),
                      [f"grad of {name}" for name in problem.input_names], batched,
                      facts=Facts(seed=problem.freeze_seed), keep_all_outputs=True,
                      scope=scope,  # keep_all_outputs: a detached gradient is wrong
                      linear_in=linear_inputs(problem, n, len(grads)),
                      known=_known_columns(problem, leaves, outs))
    g.calls = derived.calls
    return derived, None


def _known_columns(problem: Problem, leaves: list[torch.Tensor], outs: list[torch.Tensor]
                   ) -> dict[int, Any]:
    """G's exact columns along each grad_output, where G is linear there (the contract's
    linearity test passed in this run) and the gradient check computed backward's whole
    analytical Jacobian: row k of J is d G / d v_k, so the sweep evaluates no backward for them
    (an adjoint solve each, on the models where double backward costs most)."""
    jac = problem.cache.jacobian
    n_out, n_in = sum(o.numel() for o in outs), sum(x.numel() for x in leaves)
    if not problem.cache.linear or jac is None or tuple(jac.dense.shape) != (n_out, n_in):
        return {}
    known, start = {}, 0
    for j, o in enumerate(outs):
        known[len(leaves) + j] = functools.partial(_rows, jac.dense, start)
        start += o.numel()
    return known


def _rows(dense: torch.Tensor, start: int, cols: torch.Tensor) -> torch.Tensor:
    """Rows start + cols of backward's Jacobian, as G's columns (n_in, len(cols))."""
    return dense[start + cols].T


def linear_inputs(problem: Problem, n: int, k: int) -> tuple[int, ...]:
    """G's grad_output inputs, where the contract's linearity test showed G linear in them in
    this run: a difference along them needs the plus side only (numerics/columns.py)."""
    return tuple(range(n, n + k)) if problem.cache.linear else ()


class _Backward:
    """G(x..., v...) = vᵀ∂f/∂x, evaluated call by call.

    G is linear in v, and finite differences along a v column move v alone: every such
    evaluation runs the same forward at the same x. So a value-only evaluation at the x of the
    previous one runs backward through that forward's retained graph instead of a new forward
    (on an expensive Function, half of double backward's forwards). Likewise along x, the
    gradient check's sweep ran forward at the very same points: its graphs, recorded
    (`recorded`, Problem.recording), serve G's evaluations there. Each kind of reuse is trusted
    only once it gives bit for bit what a fresh forward gave; a backward that cannot run twice,
    or that reads state or randomness, then never reuses again. Numbers are unchanged either
    way."""

    def __init__(self, problem: Problem, n: int, recorded: dict | None = None) -> None:
        self.problem, self.n = problem, n
        self.calls: Any = None     # the derived problem's counter: a reused forward is not one
        self.last: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None
        self.recorded = recorded or {}  # graph_key(xs) -> (leaves, outputs): the sweep's
        # per kind ("again": the last forward's graph, "recorded"): None: not tried yet;
        # False: never again
        self.trusted: dict[str, bool | None] = {"again": None, "recorded": None}
        self.untracked: list | None = None  # the untracked diagnosis's saved tensors, once
        self.last_key: Any = None  # graph_key of last's xs, while graphs are recorded

    @calls_user_code
    def __call__(self, *xv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xs, vs = list(xv[:self.n]), xv[self.n:]
        if torch.is_grad_enabled() and any(t.requires_grad for t in xv):
            return self._fresh(xs, vs, create_graph=True)  # the analytical side: G's graph
        # Graphs recorded (few input elements, Problem.recording): one key per evaluation
        # serves both kinds of reuse; else the last point's values are compared on their device
        key = graph_key(xs) if self.recorded else None
        if self.trusted["again"] is not False and self.last is not None and (
                key == self.last_key if key is not None else _same(self.last[0], xs)):
            return self._reuse("again", xs, vs, self.last)
        found = self.recorded.pop(key, None) if key is not None else None
        if found is not None and self.trusted["recorded"] is not False:
            return self._reuse("recorded", xs, vs, (xs, *found))
        return self._fresh(xs, vs)

    def _reuse(self, kind: str, xs: list[torch.Tensor], vs: tuple[torch.Tensor, ...],
               graph: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]
               ) -> tuple[torch.Tensor, ...]:
        """Backward through a forward already run at xs, once trusted; the first time, a
        fresh evaluation beside it decides whether this kind of reuse is."""
        try:
            reused = self._again(vs, graph)
        except Exception:  # noqa: BLE001 - a backward that cannot run twice: run fresh
            self.trusted[kind] = False
            return self._fresh(xs, vs)
        if self.trusted[kind]:
            self.calls["forward"] -= 1
            return reused
        fresh = self._fresh(xs, vs)
        self.trusted[kind] = all(torch.equal(a, b) for a, b in zip(fresh, reused))
        return fresh

    def _fresh(self, xs: list[torch.Tensor], vs: tuple[torch.Tensor, ...],
               create_graph: bool = False) -> tuple[torch.Tensor, ...]:
        problem = self.problem
        with torch.enable_grad():
            inner = [x if x.requires_grad else x.detach().requires_grad_(True) for x in xs]
            passed = [x.clone() for x in inner] if problem.mutates else inner
            with problem.bound_to(inner):  # inner forward and its backward
                result = problem.fn(*problem.with_inputs(passed))
                fouts = [t for t in select_outputs(result, problem.output_mask)
                         if t.requires_grad]
                grads = tuple(vjp(fouts, inner, vs, create_graph=create_graph))
        if not create_graph and self.trusted["again"] is not False:
            self.last = ([x.detach().clone() for x in xs], inner, fouts)
            self.last_key = graph_key(xs) if self.recorded else None
        return grads

    def _again(self, vs: tuple[torch.Tensor, ...],
               graph: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]
               ) -> tuple[torch.Tensor, ...]:
        """Backward at new grad_outputs through a forward's retained graph."""
        _, inner, fouts = graph
        with torch.enable_grad(), self.problem.bound_to(inner):
            return tuple(vjp(fouts, inner, vs))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
               for x, y in zip(a, b))


def _batchable_backward(problem: Problem, n: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    """G for torch.func.vmap: the VJP by torch.func.vjp (which vmap can batch, where
    autograd.grad cannot run) through the target's own fn, so its own backward is what is
    differentiated. Trusted as G's batched twin only once it agrees with a plain call
    (numerics/steps.py checks the first batch); a Function vmap refuses is evaluated in a loop."""
    from ..numerics.transforms import func_vjp

    def outputs(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(select_outputs(problem.fn(*problem.with_inputs(list(xs))),
                                    problem.output_mask))

    @calls_user_code
    def g(*xv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xs, vs = xv[:n], xv[n:]
        with problem.bind(problem.with_inputs(list(xs))):  # inner forward and its backward
            return func_vjp(outputs, xs, vs)

    return g


def _grad_name(output: str) -> str:
    return "grad_output" if output == "output" else output.replace("output", "grad_output")


def _diagnose(problem: Problem, verdict: Verdict, block: Block, i: int, o: int,
              config: CheckConfig) -> Diagnosis | None:
    from ..diagnosis.classify import classify_double_backward

    # a block compared in part (a zero analytical block, cut at its first confirmed failure)
    # is diagnosed from the columns compared, as a whole block is from all of them
    pair = verdict.dense.get((i, o)) or verdict.partial.get((i, o))
    if pair is None:  # located elements only: what they show alone
        sample = [e for e in block.worst if not e.inconclusive]
        if len(sample) < 2 or any(e.analytical != 0 for e in sample):
            return None
        return _untracked(problem) or Diagnosis(
            "untracked", f"second derivative is zero at the {len(sample)} elements shown while "
            "numerical is not: backward uses a tensor without a graph to the inputs (saved in "
            "forward, detached, or computed under no_grad)", {"count": len(sample)})

    analytical, numerical = pair
    found = classify_double_backward(as_numpy(analytical), as_numpy(numerical),
                                     atol=config.tolerance("atol"), rtol=config.tolerance("rtol"),
                                     shapes=(block.input_shape, block.output_shape))
    # only where no pattern is seen (a zero second derivative already says untracked): two
    # forwards, once per check, name the saved tensor with no graph
    if found is None or found.kind == "no_pattern":
        return _untracked(problem) or found
    return found


def _untracked(derived: Problem) -> Diagnosis | None:
    """double_backward.untracked naming the tensor: a saved one with no graph to the inputs it
    depends on (the commonest cause: an intermediate of forward, rstd say, saved as is)."""
    from ..numerics.saved import untracked_saved

    inner = getattr(derived.fn, "problem", None)  # G's own problem: the target's
    if inner is None or inner.cache.first_order is Outcome.FAILED:
        return None  # wrong at first order already: that explains its second order
    found = getattr(derived.fn, "untracked", None)  # once per check, for every block
    if found is None:
        before = inner.calls["forward"]
        try:
            found = untracked_saved(inner)
        except Exception:  # noqa: BLE001 - the diagnosis is best effort; the verdict stands
            found = []
        finally:  # its forwards are this check's (the runner merges G's count into the case's)
            ran = inner.calls["forward"] - before
            inner.calls["forward"] -= ran
            derived.calls["forward"] += ran
        derived.fn.untracked = found
    if not found:
        return None
    first = found[0]
    which = ", ".join(f"{f['function']}'s saved tensor {f['saved'] + 1} of {f['of']} "
                      f"(shape {tuple(f['shape'])})" for f in found[:3])
    return Diagnosis("untracked", f"the second derivative misses every term through {which}: "
                     "computed in forward, where autograd is off, and saved with no graph to "
                     "the inputs it depends on; fix: save the inputs (or outputs) and recompute "
                     "it in backward, so differentiating backward reaches it (or decorate "
                     "backward with @once_differentiable if it is not meant to be "
                     "differentiated twice)", {**first, "tensors": len(found)})


def run(case: Case, context: Context) -> CheckResult:
    """The registry's entry point; complex targets are checked through their real parts."""
    from ..numerics.wirtinger import is_complex, realify

    if case.problem.sparse:  # before realify: the real view of a problem forgets its layouts
        return CheckResult("double_backward", Outcome.SKIPPED, SPARSE)
    if is_complex(case.problem):
        real = realify(case.problem)
        result = check_double_backward(replace(case, problem=real), context.target,
                                       context.config)
        case.problem.calls.update(real.calls)
        return result
    return check_double_backward(case, context.target, context.config)
