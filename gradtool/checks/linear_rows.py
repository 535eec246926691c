"""The contract's linearity test read from the gradient check's rows (issue 58).

backward is linear in grad_output: backward(g) = Σ_k g_k·backward(e_k), and the gradient check's
full mode computes every backward(e_k) (its analytical rows, one-hot grad_outputs). So the
contract, which has backward(g1) already, needs no backward of its own for the test: it leaves
(g1, g2, backward(g1)) here (`defer`), and once the gradient check has run the runner `settle`s
it: backward(g1) against the affine map the rows and backward at zero make (g·|g| is right at
every one-hot grad_output, wrong at a random g1), then the contract's own 2·g1 + 3·g2 test on
that map (a constant term, affine, is judged nonlinear where the contract's own two
backwards judged it so).

Only where that is the same test: float64 real tensors (below float64 the rounding model of
contract_rounding.linearity judges, and it needs backward's own calls), every row one-hot (a
decoded group assumes linearity), the whole Jacobian at the contract's point. Otherwise — the
gradient check probed, stopped before its last row, was skipped — the old test runs then,
through the contract's graph (it pays its two backwards), unless the run's exit code is
decided already: an expensive target whose gradient check failed (the linearity test is cut,
said under contract; --exhaustive keeps it). GRADTOOL_LEDGER=0 turns the deferral off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..numerics import ledger
from ..numerics.problem import Problem, select_outputs
from ..results import CheckResult, Finding, Outcome, Severity
from ..targets.load import Target
from ._common import calls_since, error_result

NONLINEAR = "contract.nonlinear"


@dataclass
class Pending:
    """What the contract leaves for the test: g1 and g2 (per differentiable output), backward
    at g1 (per differentiable input), backward itself (the fallback's), where each
    differentiable output sits among the compared ones, and the point."""

    g1: list[torch.Tensor]
    g2: list[torch.Tensor]
    r1: list[Any]
    backward: Callable[[list[torch.Tensor]], list[Any]]
    rows: list[tuple[int, int]]  # per differentiable output: (first row in J, numel)
    n_out: int
    point: Any
    config: CheckConfig


def defer(problem: Problem, backward: Callable, g1: list[torch.Tensor],
          g2: list[torch.Tensor], r1: Sequence[Any], result: Any,
          diff_outs: list[torch.Tensor], config: CheckConfig) -> bool:
    """Leave the linearity test for the gradient check's rows, where the runner asked for it
    and they would be the same test; False: the contract runs it now."""
    if not (problem.cache.defer_linearity and ledger.enabled()) or problem.sparse:
        return False
    outs = select_outputs(result, problem.output_mask)
    if not all(_float64(t) for t in [*problem.inputs, *outs]):
        return False
    if not all(r is None or (isinstance(r, torch.Tensor) and _float64(r)) for r in r1):
        return False
    starts, start = {}, 0
    for o in outs:
        starts[id(o)] = (start, o.numel())
        start += o.numel()
    if not all(id(d) in starts for d in diff_outs):
        return False
    problem.cache.pending_linearity = Pending(
        list(g1), list(g2), list(r1), backward, [starts[id(d)] for d in diff_outs], start,
        ledger.point_key(problem.inputs), config)
    return True


def _float64(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float64 and \
        t.layout == torch.strided


def rows_pair(names: Sequence[str]) -> tuple[str, str] | None:
    """(the check whose linearity test reads rows, the check computing them), where the one
    runs right after the other in this run (the registry's `rows_from`), or None."""
    from ..config.registry import BY_NAME

    for k, name in enumerate(names[:-1]):
        if name in BY_NAME and BY_NAME[name].rows_from == names[k + 1]:
            return name, names[k + 1]
    return None


def settled(problem: Problem, checks: list[CheckResult], config: CheckConfig,
            target: Target, expensive: bool) -> list[CheckResult]:
    """The run's results with the contract's linearity test settled (the runner's call once
    the gradient check ran, before any check after it). `expensive`: the probe's forward took
    the cost model's EXPENSIVE_S; the cut applies to the default run only, as for_cost's."""
    from ..config.registry import DEFAULT_CHECKS

    pair, by = rows_pair(config.checks), {c.name: k for k, c in enumerate(checks)}
    if pair is None or pair[0] not in by:
        problem.cache.pending_linearity = None
        return checks
    reader, rows = pair
    cut = expensive and config.checks == DEFAULT_CHECKS and not config.exhaustive
    checks = list(checks)
    checks[by[reader]] = settle(problem, checks[by[reader]],
                                checks[by[rows]] if rows in by else None, cut, config.ignore,
                                target)
    return checks


def settle(problem: Problem, contract: CheckResult, gradient: CheckResult | None,
           cut: bool, ignore: Sequence[str], target: Target) -> CheckResult:
    """The contract's result with its linearity test done: from the gradient check's rows,
    else by backward's own calls (cut, and said, on an expensive target whose gradient check
    failed)."""
    from .contract_rounding import linearity

    pending, problem.cache.pending_linearity = problem.cache.pending_linearity, None
    if pending is None or contract.outcome in (Outcome.ERROR, Outcome.SKIPPED):
        return contract
    start, before = time.perf_counter(), dict(problem.calls)
    found = _from_rows(problem, pending)
    read = found is not None
    if not read and cut and gradient is not None and gradient.outcome is Outcome.FAILED:
        problem.cache.linear = None  # not known: double backward derives its columns itself
        return replace(contract, details=(*contract.details, CUT))
    if read:
        problem.cache.linear = not found
    else:  # no rows: the contract's own test, as it ran before (it sets cache.linear)
        try:
            found = linearity(pending.backward, pending.g1, pending.g2, pending.r1, problem,
                              pending.config)
        except Exception as exc:  # noqa: BLE001 - the user's backward raising: as before
            return error_result("contract", exc, target, start, problem, before)
    calls = {"backward read": 2} if read else calls_since(problem, before)  # -v says which
    merged = {**contract.calls, **{k: contract.calls.get(k, 0) + n for k, n in calls.items()}}
    contract = replace(contract, calls=merged,
                       duration_s=contract.duration_s + time.perf_counter() - start)
    return _with(contract, [f for f in found if f.rule not in ignore], target.source)


CUT = ("not checked: linearity in grad_output, for cost: each evaluation is expensive and the "
       "gradient check failed (the run fails whatever this test says); --exhaustive runs it")


def _from_rows(problem: Problem, pending: Pending) -> list[Finding] | None:
    """The findings of the test from the rows R (backward at each e_k) and backward at a zero
    grad_output c, or None: no whole one-hot J at this point. backward(g1) is first compared
    with the affine map they make, (R − c)ᵀg1 + c: beyond it, backward is not even affine in
    grad_output (g·|g|). Within it, the contract's own test is judged on that map's
    backward(g2) and backward(2·g1 + 3·g2): the same verdict as its two backwards would give,
    a constant term told as nonlinear where it was (the zero test names it either way)."""
    jac = problem.cache.jacobian
    if jac is None or not jac.one_hot or jac.dense is None or jac.n_out != pending.n_out \
            or jac.dense.dtype != torch.float64 or ledger.point_key(problem.inputs) != pending.point:
        return None
    sizes = [r.numel() if isinstance(r, torch.Tensor) else None for r in pending.r1]
    zero = problem.cache.ledger.backward(problem.inputs, ledger.ZERO, count=False)
    if None in sizes or sum(sizes) != jac.n_in or zero is None or len(zero) != len(sizes):
        return None
    c = torch.cat([z.detach().reshape(-1).to(jac.dense) if isinstance(z, torch.Tensor)
                   else jac.dense.new_zeros(n) for z, n in zip(zero, sizes)])
    if c.numel() != jac.n_in:
        return None

    def affine(gs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        v = jac.dense.new_zeros(pending.n_out)
        for g, (first, n) in zip(gs, pending.rows):
            v[first:first + n] = g.detach().reshape(-1).to(v)
        return [t.reshape(r.shape) for t, r in
                zip((v @ jac.dense + c * (1 - v.sum())).split(sizes), pending.r1)]

    config = pending.config
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    spread = sum(float(g.detach().abs().sum()) for g in pending.g1)  # Σ|g1|: rows' wander
    for name, r, want in zip(problem.input_names, pending.r1, affine(pending.g1)):
        r = r.detach()
        if not torch.allclose(r, want.to(r.device), atol=atol + (1 + spread) * config.nondet_tol,
                              rtol=rtol, equal_nan=True):
            gap = (r - want.to(r.device)).abs().nan_to_num(0, 0, 0)
            return [_finding(name, f"backward(g) differs from the affine map of the gradient "
                             f"check's rows (backward at each one-hot grad_output) by "
                             f"{float(gap.max()):.3g}", gap, want)]
    g12 = [2 * a + 3 * b for a, b in zip(pending.g1, pending.g2)]
    for name, a, b, m in zip(problem.input_names, pending.r1, affine(pending.g2), affine(g12)):
        a, want = a.detach(), (2 * a.detach() + 3 * b.to(a.device))
        if not torch.allclose(m.to(a.device), want, atol=atol + 6 * config.nondet_tol,
                              rtol=rtol, equal_nan=True):
            gap = (m.to(a.device) - want).abs().nan_to_num(0, 0, 0)
            return [_finding(name, f"backward(2·g1 + 3·g2) differs from 2·backward(g1) + "
                             f"3·backward(g2) by {float(gap.max()):.3g} (the last two from the "
                             "gradient check's rows: backward is affine in grad_output, with a "
                             "constant term)", gap, want)]
    return []


def _finding(name: str, how: str, gap: torch.Tensor, want: torch.Tensor) -> Finding:
    scale = float(want.detach().abs().nan_to_num(0, 0, 0).max()) if want.numel() else 0.0
    return Finding(NONLINEAR, f"backward is not linear in grad_output: for '{name}', {how} — "
                   "the gradient must be a linear map of grad_output",
                   data={"input": name, "relative": float(gap.max()) / scale if scale else 0.0})


def _with(contract: CheckResult, found: list[Finding], source: str | None) -> CheckResult:
    """The contract's result with the linearity finding where the contract lists it: after the
    findings before it, before determinism's; a passing result now failed (an expected
    failure now as declared)."""
    if not found:
        return contract
    findings = list(contract.findings)
    at = next((k for k, f in enumerate(findings) if f.rule == "contract.nondeterministic"
               or f.severity is not Severity.FAILURE), len(findings))
    findings[at:at] = found
    failures = [f for f in findings if f.severity is Severity.FAILURE]
    changed = {Outcome.PASSED: Outcome.FAILED, Outcome.XPASSED: Outcome.XFAILED}
    outcome = changed.get(contract.outcome, contract.outcome)
    summary = failures[0].message if failures[0] is found[0] and not contract.blocks \
        else contract.summary
    if outcome is Outcome.XFAILED and contract.outcome is Outcome.XPASSED:
        summary = failures[0].message
    source = contract.source if contract.outcome is Outcome.FAILED else source  # backward's
    return replace(contract, outcome=outcome, findings=tuple(findings), summary=summary,
                   source=source)
