"""contract: forward and backward keep autograd's rules (arity, shapes, linearity, purity)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics.problem import Problem, function_nodes, tensor_outputs
from ..results import CheckResult, Outcome
from ..targets.cases import Case
from ..targets.load import Target
from ..tracebacks import calls_user_code
from ._common import Context, calls_since, error_result

LEAF_INPLACE = "leaf Variable that requires grad is being used in an in-place operation"


def check_contract(case: Case, target: Target, config: CheckConfig) -> CheckResult:
    """Run forward and backward once or twice and list every broken rule."""
    start = time.perf_counter()
    problem = case.problem
    before = dict(problem.calls)
    try:
        violations, notes = _violations(case, target, config)
    except Exception as exc:  # the user's forward or backward raised (sys.exit: the runner)
        return error_result("contract", exc, target, start, problem, before)
    outcome = Outcome.FAILED if violations else Outcome.PASSED
    summary = violations[0] if violations else "forward and backward keep autograd's contract"
    return CheckResult(
        "contract", outcome, summary, tuple(violations[1:] + notes),
        source=_where(target, violations), calls=calls_since(problem, before),
        duration_s=time.perf_counter() - start, tolerance={"nondet_tol": config.nondet_tol})


def _where(target: Target, violations: list[str]) -> str | None:
    """The code to look at: forward's line when forward returned no tensor, else backward's."""
    if not violations:
        return None
    if violations[0].startswith("forward returned") and target.forward_source:
        return target.forward_source
    return target.source


def _violations(case: Case, target: Target, config: CheckConfig) -> tuple[list[str], list[str]]:
    problem = case.problem
    # Purity first, on copies: it learns whether forward writes to its inputs, so that the
    # stochastic probe's two forwards copy them instead of compounding the write.
    violations = _forward_purity(problem, target)
    notes = _detect_stochastic(case, config)
    leaves, result = _forward(problem)
    if not tensor_outputs(result):
        return violations + [not_a_tensor(result)], notes
    outs = [t for t in tensor_outputs(result) if t.is_floating_point() or t.is_complex()]
    problem.has_functions = bool(function_nodes([o for o in outs if o.requires_grad]))
    violations += _finite("forward output", outs)
    diff_outs = [o for o in outs if o.requires_grad]
    if not diff_outs:
        return violations + ["no output requires grad: forward detaches its result from the "
                             "inputs (or marks every output non-differentiable)"], notes
    backward = _backward_caller(problem, target, leaves, result, violations)
    if backward is None:
        return violations, notes
    gen = torch.Generator().manual_seed(case.seed + 101)
    g1 = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff_outs]
    g2 = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff_outs]
    violations += _grad_output_untouched(backward, g1)
    violations += _outputs_used(problem, target, leaves, diff_outs, g1, config)
    r1 = backward(g1)
    violations += _finite("gradient", [r for r in r1 if r is not None])
    violations += _linearity(backward, g1, g2, r1, problem, config)
    violations += _deterministic(backward, g1, r1, problem, config)
    return violations, notes


@calls_user_code
def _forward(problem: Problem) -> tuple[list[torch.Tensor], Any]:
    """A graph forward returning the raw result; learns whether forward writes to its inputs."""
    leaves = [v.detach().clone().requires_grad_(True) for v in problem.inputs]
    for attempt in range(2):
        passed = [leaf.clone() for leaf in leaves] if problem.mutates else leaves
        try:
            with torch.enable_grad(), problem.rng():
                problem.calls["forward"] += 1
                return leaves, problem.fn(*problem.with_inputs(passed))
        except RuntimeError as exc:
            if LEAF_INPLACE not in str(exc) or attempt:
                raise
            problem.mutates = True  # mark_dirty Functions need non-leaf inputs
    raise AssertionError("unreachable")


@calls_user_code
def _forward_purity(problem: Problem, target: Target) -> list[str]:
    """An input changed by forward must be marked dirty (and so returned as an output)."""
    originals = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in problem.args]
    args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in problem.args]
    with torch.no_grad(), problem.rng():
        problem.calls["forward"] += 1
        result = problem.fn(*args)
    outputs = tensor_outputs(result)
    problems = []
    for name, arg, original in zip(problem.names, args, originals):
        if original is None or _equal(arg, original) or _both_nan(arg, original):
            continue
        problem.mutates = True
        if any(t is arg for t in outputs):
            continue  # returned itself: marked dirty (Function.apply) or a plain in-place op
        # Function.apply hands back an unmarked input as a new alias of the same memory.
        if any(t.data_ptr() == arg.data_ptr() and t.shape == arg.shape for t in outputs):
            problems.append(f"forward modifies input '{name}' in place and returns it without "
                            f"ctx.mark_dirty({name})")
        else:
            problems.append(f"forward modifies input '{name}' in place without "
                            f"ctx.mark_dirty({name}) (and without returning it)")
    return problems


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """complex32 has no comparison kernels on the CPU: compare it exactly, as complex64."""
    return t.to(torch.complex64) if t.dtype == torch.complex32 else t


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_comparable(a), _comparable(b))


def _allclose(a: torch.Tensor, b: torch.Tensor, **tolerances: float) -> bool:
    return torch.allclose(_comparable(a), _comparable(b), equal_nan=True, **tolerances)


def _both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = _comparable(a), _comparable(b)
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))) and \
        bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))


def _detect_stochastic(case: Case, config: CheckConfig) -> list[str]:
    """Same inputs, different outputs: freeze the RNG around every evaluation from now on."""
    problem = case.problem
    first = problem.outputs(problem.inputs)
    second = problem.outputs(problem.inputs)
    if all(_equal(a, b) or _both_nan(a, b) for a, b in zip(first, second)):
        return []  # NaN != NaN: equal NaN positions are not randomness
    problem.freeze_seed = case.seed
    return [f"forward is stochastic (two calls on the same inputs differ): torch's RNG is "
            f"re-seeded with {case.seed} before every evaluation"]


def _finite(what: str, tensors: Sequence[torch.Tensor]) -> list[str]:
    bad = sum(int((~torch.isfinite(t)).sum()) for t in tensors)
    return [f"{what} has {bad} NaN/Inf value(s) on finite inputs"] if bad else []


def _backward_caller(problem: Problem, target: Target, leaves: list[torch.Tensor], result: Any,
                     violations: list[str]):
    """A function grad_outputs -> one gradient per differentiable input."""
    tensors = tensor_outputs(result)
    diff_outs = [t for t in tensors if (t.is_floating_point() or t.is_complex()) and t.requires_grad]
    node = diff_outs[0].grad_fn
    if target.kind == "function" and getattr(type(node), "_forward_cls", None) is target.obj:
        raw_call = _raw_backward(problem, node, tensors, diff_outs)
        violations += _arity_and_shapes(problem, raw_call, diff_outs)
        if any("gradient" in v and ("returned" in v or "shape" in v) for v in violations):
            return None  # the rest would only repeat the engine's error
        return lambda grads: _positions(problem, raw_call(grads))
    return lambda grads: problem.vjp(leaves, diff_outs, grads)


def _raw_backward(problem: Problem, node: Any, tensors: list[torch.Tensor],
                  diff_outs: list[torch.Tensor]):
    """Call the user's backward directly (via its node), bypassing the engine's fix-ups."""
    @calls_user_code
    def call(grads: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        it = iter(grads)
        full = [next(it) if any(t is d for d in diff_outs) else torch.zeros_like(t)
                for t in tensors]
        problem.calls["backward"] += 1
        out = node.apply(*full)
        return out if isinstance(out, tuple) else (out,)
    return call


def _positions(problem: Problem, raw: tuple[Any, ...]) -> list[torch.Tensor | None]:
    return [raw[p] if p < len(raw) else None for p in problem.diff]


def _arity_and_shapes(problem: Problem, raw_call, diff_outs: list[torch.Tensor]) -> list[str]:
    probe = raw_call([torch.ones_like(t) for t in diff_outs])
    n_args = len(problem.args)
    names = ", ".join(problem.names)
    problems = []
    extra = probe[n_args:]
    if len(probe) < n_args or any(g is not None for g in extra):
        problems.append(f"backward returned {len(probe)} gradient(s); forward takes {n_args} "
                        f"input(s) ({names}) — return exactly one per input, None for "
                        f"non-tensors")
    for name, arg, grad in zip(problem.names, problem.args, probe):
        problems += _one_gradient(name, arg, grad)
    return problems


def _one_gradient(name: str, arg: Any, grad: Any) -> list[str]:
    if grad is None:
        return []
    if not isinstance(arg, torch.Tensor):
        return [f"backward returned a gradient for '{name}', which is not a tensor "
                f"({type(arg).__name__}) — return None in its place"]
    if not isinstance(grad, torch.Tensor):
        return [f"backward returned a {type(grad).__name__} for '{name}', not a tensor or None"]
    if grad.shape != arg.shape:
        shapes = (f"gradient for '{name}' has shape {tuple(grad.shape)}, but '{name}' has shape "
                  f"{tuple(arg.shape)}")
        if _broadcastable(grad.shape, arg.shape):
            return [f"{shapes}: the engine would silently sum it — reduce it to the input's shape"]
        transposed = grad.dim() == 2 and tuple(grad.shape) == tuple(arg.shape)[::-1]
        return [f"{shapes}{' (transposed?)' if transposed else ''} — return a gradient of the "
                "input's shape"]
    if grad.dtype != arg.dtype:
        return [f"gradient for '{name}' has dtype {grad.dtype}, but '{name}' is {arg.dtype}"]
    if grad.device != arg.device:
        return [f"gradient for '{name}' is on {grad.device}, but '{name}' is on {arg.device}"]
    return []


def _broadcastable(grad: torch.Size, arg: torch.Size) -> bool:
    """The engine sums a gradient down only when the input broadcasts up to it."""
    try:
        return torch.broadcast_shapes(grad, arg) == grad
    except RuntimeError:
        return False


def _grad_output_untouched(backward, grads: list[torch.Tensor]) -> list[str]:
    copies = [g.clone() for g in grads]
    given = [g.clone() for g in grads]
    backward(given)
    if all(_equal(a, b) for a, b in zip(given, copies)):
        return []
    return ["backward modifies grad_output in place — use out-of-place ops "
            "(grad_output * c, not grad_output.mul_(c))"]


def _outputs_used(problem: Problem, target: Target, leaves: list[torch.Tensor],
                  diff_outs: list[torch.Tensor], g1: list[torch.Tensor],
                  config: CheckConfig) -> list[str]:
    """Backward through the engine as it runs when outputs go unused: a zero grad_output gives
    a zero gradient, an unused output (None gradient under set_materialize_grads(False)) acts
    as a zero one, and no differentiable output's gradient is ignored."""
    zeros = [torch.zeros_like(g) for g in g1]
    found = _zero_gives_zero(problem, problem.vjp(leaves, diff_outs, zeros), config.nondet_tol)
    if len(diff_outs) < 2:
        return found
    atol, rtol = config.tolerance("atol") + 2 * config.nondet_tol, config.tolerance("rtol")
    for k in range(len(diff_outs)):
        rest = [j for j in range(len(diff_outs)) if j != k]
        try:
            unused = problem.vjp(leaves, [diff_outs[j] for j in rest], [g1[j] for j in rest])
        except Exception as exc:  # noqa: BLE001 - the user's backward raising is the finding
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            return found + [f"backward fails when output {k} is unused (its gradient is None, "
                            f"as with ctx.set_materialize_grads(False)): "
                            f"{type(exc).__name__}: {first}"]
        zeroed = problem.vjp(leaves, diff_outs, [zeros[j] if j == k else g1[j]
                                                for j in range(len(g1))])
        for name, a, b in zip(problem.input_names, unused, zeroed):
            if not _allclose(a, b, atol=atol, rtol=rtol):
                return found + [f"backward gives '{name}' a different gradient when output {k} "
                                f"is unused (None gradient) than when its gradient is zero (by "
                                f"{(a - b).abs().max().item():.3g}): treat None as zero"]
        # An empty output has no gradient to ignore.
        if target.kind == "function" and diff_outs[k].numel() and \
                _ignored(problem, leaves, diff_outs, g1, k):
            found.append(f"backward ignores the gradient of output {k}: mark it with "
                         "ctx.mark_non_differentiable, or differentiate it")
    return found


def _zero_gives_zero(problem: Problem, grads: list[torch.Tensor], noise: float) -> list[str]:
    for name, grad in zip(problem.input_names, grads):
        nonzero = grad.abs() > noise  # a nondeterministic backward may wander by nondet_tol
        if bool(nonzero.any()):
            values = grad[nonzero]
            shown = (f"{values[0].item():.3g}" if bool((values == values[0]).all())
                     else f"up to {values.abs().max().item():.3g}")
            return [f"backward adds {shown} to {int(nonzero.sum())} of {grad.numel()} elements "
                    f"of the gradient of '{name}' even when grad_output is zero: a gradient "
                    "must be linear in grad_output (no constant term)"]
    return []


def _ignored(problem: Problem, leaves: list[torch.Tensor], diff_outs: list[torch.Tensor],
             g1: list[torch.Tensor], k: int) -> bool:
    """Only output k's gradient given, and every input's gradient is exactly zero."""
    only = [g if j == k else torch.zeros_like(g) for j, g in enumerate(g1)]
    return all(not bool(r.any()) for r in problem.vjp(leaves, diff_outs, only))


def _linearity(backward, g1, g2, r1, problem: Problem, config: CheckConfig) -> list[str]:
    r2 = backward(g2)
    mixed = backward([2 * a + 3 * b for a, b in zip(g1, g2)])
    # Each of the three calls may wander by nondet_tol: 2·a + 3·b + m can by 6·nondet_tol.
    atol, rtol = config.tolerance("atol") + 6 * config.nondet_tol, config.tolerance("rtol")
    for name, a, b, m in zip(problem.input_names, r1, r2, mixed):
        if a is None or b is None or m is None or a.shape != m.shape:
            continue
        expected = 2 * a + 3 * b
        if not _allclose(m, expected, atol=atol, rtol=rtol):
            diff = (m - expected).abs().max().item()
            return [f"backward is not linear in grad_output: for '{name}', "
                    f"backward(2·g1 + 3·g2) differs from 2·backward(g1) + 3·backward(g2) by "
                    f"{diff:.3g} — the gradient must be a linear map of grad_output"]
    return []


def _deterministic(backward, g1, r1, problem: Problem, config: CheckConfig) -> list[str]:
    again = backward(g1)
    for name, a, b in zip(problem.input_names, r1, again):
        if a is None or b is None or a.shape != b.shape:
            continue
        diff = (a - b).abs().max().item() if a.numel() else 0.0
        if diff > config.nondet_tol:
            return [f"backward is nondeterministic: two calls with the same grad_output give "
                    f"'{name}' gradients differing by {diff:.3g} (> nondet_tol "
                    f"{config.nondet_tol:g}; raise --nondet-tol if this is expected)"]
    return []


def run(case: Case, context: Context) -> CheckResult:
    """The registry's entry point."""
    return check_contract(case, context.target, context.config)


def not_a_tensor(result: object) -> str:
    """'forward returned str, not a tensor': what came back instead, and what to return."""
    what = type(result).__name__
    if isinstance(result, (tuple, list, dict)):
        what += " holding no tensor"
    return (f"forward returned {what}, not a tensor: return the output tensor "
            "(or a tuple, list or dict of tensors)")
