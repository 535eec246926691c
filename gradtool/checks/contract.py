"""contract: forward and backward keep autograd's rules (arity, shapes, linearity, purity)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..config.registry import BY_NAME
from ..config.settings import CheckConfig
from ..numerics.ledger import ZERO, Graph
from ..numerics.problem import Problem, select_outputs, tensor_outputs
from ..numerics.sparse import dense_output
from ..results import CheckResult, Finding, Outcome, Severity
from ..targets.cases import Case
from ..targets.load import Target
from ..targets.probe import _graph_forward, both_nan, equal, probe, stochastic_note
from ..tracebacks import calls_user_code
from ._common import Context, calls_since, declare, error_result
from .contract_rounding import allclose, deterministic, linearity
from .linear_rows import defer


def check_contract(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """Run forward and backward once or twice and list every broken rule."""
    start = time.perf_counter()
    problem = case.problem
    before = dict(problem.calls)
    probe(case)  # learnt already in a run; a case built elsewhere (a captured Function) here
    try:
        found, notes = _findings(case, target, config)
    except Exception as exc:  # the user's forward or backward raised (sys.exit: the runner)
        return error_result("contract", exc, target, start, problem, before)
    return contract_result(found, notes, target, config, calls_since(problem, before),
                           time.perf_counter() - start)


def contract_result(found: Sequence[Finding], notes: Sequence[str], target: Target,
                    config: CheckConfig, calls: dict[str, int] | None = None,
                    duration_s: float = 0.0) -> CheckResult:
    """The verdict from the findings: failed on a failure, else passed (warnings told). Rules
    the configuration ignores are dropped by the runner, for every check alike."""
    failures = [f for f in found if f.severity is Severity.FAILURE]
    warnings = [f for f in found if f.severity is Severity.WARNING]
    ordered = failures + warnings
    summary = failures[0].message if failures else "forward and backward keep autograd's contract"
    return CheckResult(
        "contract", Outcome.FAILED if failures else Outcome.PASSED, summary,
        tuple(notes), source=_where(target, failures), calls=calls or {},
        duration_s=duration_s, tolerance={"nondet_tol": config.nondet_tol},
        findings=tuple(ordered))


def _where(target: Target, failures: Sequence[Finding]) -> str | None:
    """The code to look at: the first failure's own (forward's line when forward returned no
    tensor), else backward's."""
    if not failures:
        return None
    return failures[0].source or target.source


def _findings(case: Case, target: Target, config: CheckConfig
              ) -> tuple[list[Finding], list[str]]:
    problem = case.problem
    found = list(problem.facts.findings)  # forward's purity, seen by the probe phase
    note = stochastic_note(problem.facts)
    notes = [note] if note else []
    first = problem.take_first_graph()  # the probe's graph: no forward of its own then
    declare(lambda: int(first is None) + _evaluations(problem, target, 1))
    leaves, result = first or _graph_forward(problem)
    if not tensor_outputs(result):
        return found + [not_a_tensor(result, target)], notes
    outs = [t for t in tensor_outputs(result) if t.is_floating_point() or t.is_complex()]
    found += _finite("contract.forward_nonfinite", "forward output", outs)
    diff_outs = [o for o in outs if o.requires_grad]
    if not diff_outs:
        return found + [Finding("contract.no_differentiable_output",
                                "no output requires grad: forward detaches its result from the "
                                "inputs (or marks every output non-differentiable)")], notes
    declare(lambda: _evaluations(problem, target, len(diff_outs)))  # outputs counted now
    saved = [leaf.detach().clone() for leaf in leaves]  # what forward was given (and saved)
    backward = _backward_caller(problem, target, leaves, result, found)
    if backward is None:
        return found, notes
    gen = torch.Generator().manual_seed(case.seed + 101)
    # drawn on the CPU from a CPU generator (the same on every device), then put by their output
    g1 = [torch.randn(o.shape, generator=gen, dtype=o.dtype, device="cpu").to(o.device)
          for o in diff_outs]
    g2 = [torch.randn(o.shape, generator=gen, dtype=o.dtype, device="cpu").to(o.device)
          for o in diff_outs]
    modified, r1 = _grad_output_untouched(backward, g1)
    found += modified
    found += _aliased(problem, leaves, r1)
    written = _inputs_written(problem, leaves, saved)
    if written:  # the graph now holds what backward wrote: the tests below would misname it
        return found + written, notes
    found += _outputs_used(problem, target, leaves, (outs, diff_outs), g1, config)
    if modified:  # what it wrote to is not g1: the linearity and determinism tests need g1's
        r1 = backward(g1)
    found += _finite("contract.gradient_nonfinite", "gradient", [r for r in r1 if r is not None])
    if modified or not defer(problem, backward, g1, g2, r1, result, diff_outs, config):
        found += linearity(backward, g1, g2, r1, problem, config)
    else:  # left for the gradient check's rows: determinism's backward is all that is left
        declare(lambda: 1)
    again = deterministic(backward, g1, r1, problem, config)
    # backward called again through this graph gave r1 again: later checks may read them
    if not (modified or again) and any(BY_NAME[name].reads_recorded for name in config.checks):
        _record(problem, leaves, result, diff_outs, g1, r1)  # g1 as drawn, r1 its backward
    return found + again, notes


def _evaluations(problem: Problem, target: Target, outputs: int) -> int:
    """The evaluations _findings makes after forward's graph on correct code with this many
    differentiable outputs: a Function's raw backward (arity and shapes), grad_output left
    untouched, a zero grad_output, linearity's two, determinism's one, and with several outputs
    each one unused and zeroed (and a Function's output ignored)."""
    function = target.kind.function_class and not problem.sparse
    each = (2 + int(function)) * outputs if outputs > 1 else 0
    return int(function) + 1 + 1 + each + 2 + 1


def _record(problem: Problem, leaves: list[torch.Tensor], result: Any,
            diff_outs: list[torch.Tensor], g1: list[torch.Tensor], r1: Sequence[Any]) -> None:
    """The graph and its backward at g1 in the case's ledger, for the checks after this one at
    the same point, cotangent and layout (the layout check's contiguous baseline): only where
    they are what those checks would compute — every differentiable output among the compared
    ones, a gradient of each input's shape, dtype and device (the raw backward's equals the
    engine's then)."""
    outs = select_outputs(result, problem.output_mask)
    if not all(any(d is o for o in outs) for d in diff_outs) or len(r1) != len(leaves):
        return
    if not all(isinstance(r, torch.Tensor) and r.layout == torch.strided and r.shape == v.shape
               and r.dtype == v.dtype and r.device == v.device for r, v in zip(r1, leaves)):
        return
    index = {id(d): k for k, d in enumerate(diff_outs)}
    grads = [g1[index[id(o)]] if id(o) in index else torch.zeros_like(o) for o in outs]
    problem.cache.ledger.record_graph(problem.inputs,
                                      Graph(leaves, outs, grads, list(r1), "contract"))


def _finite(rule: str, what: str, tensors: Sequence[torch.Tensor]) -> list[Finding]:
    bad = sum(int((~torch.isfinite(t)).sum()) for t in tensors)
    return [Finding(rule, f"{what} has {bad} NaN/Inf value(s) on finite inputs")] if bad else []


def _backward_caller(problem: Problem, target: Target, leaves: list[torch.Tensor], result: Any,
                     found: list[Finding]):
    """A function grad_outputs -> one gradient per differentiable input."""
    tensors = tensor_outputs(result)
    diff_outs = [t for t in tensors if (t.is_floating_point() or t.is_complex()) and t.requires_grad]
    node = diff_outs[0].grad_fn
    own_node = getattr(type(node), "_forward_cls", None) is target.obj
    # A sparse input reaches backward rebuilt from gradtool's strided value: only the engine
    # maps its gradient back (the raw one is in the sparse tensor's terms).
    if target.kind.function_class and own_node and not problem.sparse:
        raw_call = _raw_backward(problem, node, result, diff_outs)
        found += _arity_and_shapes(problem, raw_call, diff_outs)
        if any(f.rule in ENGINE_ERRORS for f in found):
            return None  # the rest would only repeat the engine's error
        return lambda grads: _positions(problem, raw_call(grads))
    return lambda grads: problem.vjp(leaves, diff_outs, grads)


def _raw_backward(problem: Problem, node: Any, result: Any, diff_outs: list[torch.Tensor]):
    """Call the user's backward directly (via its node), bypassing the engine's fix-ups, with
    the engine's arguments: one per forward output, zeros for a tensor output that is not
    differentiable, None for a non-tensor one."""
    outputs = result if isinstance(result, tuple) else (result,)

    @calls_user_code
    def call(grads: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        it = iter(grads)
        full = [next(it) if any(o is d for d in diff_outs) else
                torch.zeros_like(o) if isinstance(o, torch.Tensor) else None for o in outputs]
        problem.calls["backward"] += 1
        out = node.apply(*full)
        return out if isinstance(out, tuple) else (out,)
    return call


def _positions(problem: Problem, raw: tuple[Any, ...]) -> list[torch.Tensor | None]:
    """The gradient of each differentiable input (a sparse one densified: legal for a dense
    input, as nn.Embedding(sparse=True)'s)."""
    return [dense_output(raw[p]) if p < len(raw) and isinstance(raw[p], torch.Tensor)
            else raw[p] if p < len(raw) else None for p in problem.diff]


def _arity_and_shapes(problem: Problem, raw_call, diff_outs: list[torch.Tensor]
                      ) -> list[Finding]:
    probe = raw_call([torch.ones_like(t) for t in diff_outs])
    n_args = len(problem.args)
    names = ", ".join(problem.names)
    problems = []
    extra = probe[n_args:]
    if len(probe) < n_args or any(g is not None for g in extra):
        problems.append(Finding(
            "contract.gradient_count",
            f"backward returned {len(probe)} gradient(s); forward takes {n_args} input(s) "
            f"({names}) — return exactly one per input, None for non-tensors"))
    for name, arg, grad in zip(problem.names, problem.args, probe):
        problems += _one_gradient(name, arg, grad)
    return problems


def _one_gradient(name: str, arg: Any, grad: Any) -> list[Finding]:
    if grad is None:
        return []
    if not isinstance(arg, torch.Tensor):
        return [Finding("contract.gradient_for_non_tensor",
                        f"backward returned a gradient for '{name}', which is not a tensor "
                        f"({type(arg).__name__}) — return None in its place")]
    if not isinstance(grad, torch.Tensor):
        return [Finding("contract.gradient_type", f"backward returned a {type(grad).__name__} "
                                                  f"for '{name}', not a tensor or None")]
    if grad.shape != arg.shape:
        shapes = (f"gradient for '{name}' has shape {tuple(grad.shape)}, but '{name}' has shape "
                  f"{tuple(arg.shape)}")
        if _broadcastable(grad.shape, arg.shape):
            # Legal: autograd's engine sums it down to the input's shape (gradcheck agrees).
            return [Finding("contract.broadcast_gradient",
                            f"{shapes}: the engine sums it to the input's shape — legal, but "
                            "reducing it in backward saves the engine's sum and states intent",
                            Severity.WARNING)]
        transposed = grad.dim() == 2 and tuple(grad.shape) == tuple(arg.shape)[::-1]
        return [Finding("contract.gradient_shape",
                        f"{shapes}{' (transposed?)' if transposed else ''} — return a gradient "
                        "of the input's shape")]
    if grad.dtype != arg.dtype:
        return [Finding("contract.gradient_dtype", f"gradient for '{name}' has dtype "
                                                   f"{grad.dtype}, but '{name}' is {arg.dtype}")]
    if grad.device != arg.device:
        return [Finding("contract.gradient_device", f"gradient for '{name}' is on {grad.device}, "
                                                    f"but '{name}' is on {arg.device}")]
    return []


def _broadcastable(grad: torch.Size, arg: torch.Size) -> bool:
    """The engine sums a gradient down only when the input broadcasts up to it."""
    try:
        return torch.broadcast_shapes(grad, arg) == grad
    except RuntimeError:
        return False


def _grad_output_untouched(backward, grads: list[torch.Tensor]
                           ) -> tuple[list[Finding], list[Any]]:
    """The finding when backward writes to grad_output, and backward's result on a copy of
    `grads` (when it wrote nothing, the linearity and determinism tests' backward(grads))."""
    copies = [g.clone() for g in grads]
    given = [g.clone() for g in grads]
    result = backward(given)
    if all(equal(a, b) for a, b in zip(given, copies)):
        return [], result
    return [Finding("contract.grad_output_modified",
                    "backward modifies grad_output in place — use out-of-place ops "
                    "(grad_output * c, not grad_output.mul_(c))")], result


def _inputs_written(problem: Problem, leaves: list[torch.Tensor], saved: list[torch.Tensor]
                    ) -> list[Finding]:
    """Backward wrote to an input forward was given (a kernel reusing its saved inputs'
    memory for its gradients, through data pointers autograd's version counter never sees)."""
    for name, leaf, before in zip(problem.input_names, leaves, saved):
        if not (equal(leaf.detach(), before) or both_nan(leaf.detach(), before)):
            return [Finding(
                "contract.backward_writes_input",
                f"backward writes to input '{name}' in place (a tensor forward saved: the "
                "caller's own memory): the caller's tensor changes, and a second backward "
                "through the same graph reads what the first wrote — write gradients to new "
                "tensors", data={"inputs": [name]})]
    return []


def _aliased(problem: Problem, leaves: list[torch.Tensor], grads: Sequence[Any]
             ) -> list[Finding]:
    """A gradient sharing memory with an input: the engine may accumulate into it in place."""
    found = []
    memory = {_address(leaf): name for name, leaf in zip(problem.input_names, leaves)}
    memory.pop(None, None)
    for name, grad in zip(problem.input_names, grads):
        if isinstance(grad, torch.Tensor) and _address(grad) in memory:
            other = memory[_address(grad)]
            found.append(Finding(
                "contract.gradient_aliases_input",
                f"backward returns a gradient for '{name}' in the memory of input '{other}': "
                "the engine may accumulate into it in place, changing the caller's tensor — "
                "return a new tensor", Severity.WARNING, data={"inputs": [name, other]}))
    return found


def _address(t: torch.Tensor) -> int | None:
    """Where t's memory starts; None for no memory (empty, or a storage-less zero tensor)."""
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except RuntimeError:  # torch's efficient zeros carry no storage
        return None


def _outputs_used(problem: Problem, target: Target, leaves: list[torch.Tensor],
                  outputs: tuple[list[torch.Tensor], list[torch.Tensor]],
                  g1: list[torch.Tensor], config: CheckConfig) -> list[Finding]:
    """Backward through the engine as it runs when outputs go unused: a zero grad_output gives
    a zero gradient, an unused output (None gradient under set_materialize_grads(False)) acts
    as a zero one, and no differentiable output's gradient is ignored (outputs: the floating
    outputs, and those of them that require grad)."""
    outs, diff_outs = outputs
    zeros = [torch.zeros_like(g) for g in g1]
    at_zero = problem.vjp(leaves, diff_outs, zeros)
    problem.cache.ledger.record_backward(problem.inputs, ZERO, at_zero)  # a diagnosis's
    found = _zero_gives_zero(problem, at_zero, config.nondet_tol)
    if len(diff_outs) < 2:
        return found
    atol, rtol = config.tolerance("atol") + 2 * config.nondet_tol, config.tolerance("rtol")
    for k in range(len(diff_outs)):
        rest = [j for j in range(len(diff_outs)) if j != k]
        try:
            unused = problem.vjp(leaves, [diff_outs[j] for j in rest], [g1[j] for j in rest])
        except Exception as exc:  # noqa: BLE001 - the user's backward raising is the finding
            return found + [_unused_raises(problem, leaves, diff_outs, g1, k, exc)]
        zeroed = problem.vjp(leaves, diff_outs, [zeros[j] if j == k else g1[j]
                                                for j in range(len(g1))])
        for name, a, b in zip(problem.input_names, unused, zeroed):
            if not allclose(a, b, atol=atol, rtol=rtol):
                return found + [Finding(
                    "contract.unused_output_differs",
                    f"backward gives '{name}' a different gradient when output {k} is unused "
                    f"(None gradient) than when its gradient is zero (by "
                    f"{(a - b).abs().max().item():.3g}): treat None as zero")]
        # An empty output has no gradient to ignore.
        if target.kind.function_class and diff_outs[k].numel() and \
                _ignored(problem, leaves, diff_outs, g1, k) and \
                _depends_on_inputs(problem, outs, _position(outs, diff_outs[k])):
            found.append(Finding("contract.ignored_output",
                                 f"backward ignores the gradient of output {k}: mark it with "
                                 "ctx.mark_non_differentiable, or differentiate it"))
    return found


def _unused_raises(problem: Problem, leaves: list[torch.Tensor], diff_outs: list[torch.Tensor],
                   g1: list[torch.Tensor], k: int, exc: Exception) -> Finding:
    """Backward raised with output k unused. Where it runs with a zero gradient there, the
    engine handed it None: forward turned materialization off (the engine materializes zeros
    otherwise), and the finding says so and how to fix it."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    raised = f"{type(exc).__name__}: {first}"
    zeroed = [torch.zeros_like(g) if j == k else g for j, g in enumerate(g1)]
    try:
        problem.vjp(leaves, diff_outs, zeroed)
    except Exception:  # noqa: BLE001 - it fails on zeros too: not about None
        return Finding("contract.unused_output_raises",
                       f"backward fails when output {k} is unused (its gradient is None, as "
                       f"with ctx.set_materialize_grads(False)): {raised}",
                       data={"output": k, "materialized": None})
    return Finding("contract.unused_output_raises",
                   f"backward fails when output {k} is unused: forward turned materialization "
                   f"off (ctx.set_materialize_grads(False)), so that output's grad_output "
                   f"arrives as None, and backward uses it as a tensor ({raised}); treat a "
                   "None grad_output as zeros in backward, or keep materialization on (drop "
                   "ctx.set_materialize_grads(False))", data={"output": k, "materialized": False})


def _zero_gives_zero(problem: Problem, grads: list[torch.Tensor], noise: float
                     ) -> list[Finding]:
    for name, grad in zip(problem.input_names, grads):
        nonzero = grad.abs() > noise  # a nondeterministic backward may wander by nondet_tol
        if bool(nonzero.any()):
            values = grad[nonzero]
            shown = (f"{values[0].item():.3g}" if bool((values == values[0]).all())
                     else f"up to {values.abs().max().item():.3g}")
            return [Finding(
                "contract.constant_term",
                f"backward adds {shown} to {int(nonzero.sum())} of {grad.numel()} elements of "
                f"the gradient of '{name}' even when grad_output is zero: a gradient must be "
                "linear in grad_output (no constant term)")]
    return []


def _ignored(problem: Problem, leaves: list[torch.Tensor], diff_outs: list[torch.Tensor],
             g1: list[torch.Tensor], k: int) -> bool:
    """Only output k's gradient given, and every input's gradient is exactly zero."""
    only = [g if j == k else torch.zeros_like(g) for j, g in enumerate(g1)]
    return all(not bool(r.any()) for r in problem.vjp(leaves, diff_outs, only))


def _position(tensors: list[torch.Tensor], tensor: torch.Tensor) -> int:
    return next(i for i, t in enumerate(tensors) if t is tensor)


@calls_user_code
def _depends_on_inputs(problem: Problem, outs: list[torch.Tensor], index: int) -> bool:
    """Whether the index-th floating output moves when every input does: ignoring the gradient
    of one that does not (a constant placeholder, zeros) is right, its Jacobian being zero."""
    gen = torch.Generator().manual_seed(131)
    values = [v.detach() + 1e-3 * (1 + v.detach().abs()) *
              torch.randn(v.shape, generator=gen, dtype=v.dtype, device="cpu").to(v.device)
              for v in problem.inputs]
    with torch.no_grad(), problem.rng():
        problem.calls["forward"] += 1
        result = problem.fn(*problem.with_inputs(values))
    moved = [t for t in tensor_outputs(result) if t.is_floating_point() or t.is_complex()]
    return index >= len(moved) or not equal(moved[index], outs[index].detach())


def run(case: Case, context: Context) -> CheckResult:
    """The registry's entry point."""
    return check_contract(case, context.target, context.config)


def not_a_tensor(result: object, target: Target | None = None) -> Finding:
    """'forward returned str, not a tensor': what came back instead, and what to return (the
    code to look at is forward's)."""
    what = type(result).__name__
    if isinstance(result, (tuple, list, dict)):
        what += " holding no tensor"
    return Finding("contract.forward_not_tensor",
                   f"forward returned {what}, not a tensor: return the output tensor (or a "
                   "tuple, list or dict of tensors)",
                   source=target.forward_source if target is not None else None)


# Shapes and counts autograd's engine refuses: checking further would repeat its error.
ENGINE_ERRORS = frozenset({"contract.gradient_count", "contract.gradient_for_non_tensor",
                           "contract.gradient_type", "contract.gradient_shape"})
