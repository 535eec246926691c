"""gradient: the analytical Jacobian (from backward) against finite differences, block by block."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from ..config.registry import BY_NAME
from ..config.settings import CheckConfig
from ..numerics.coarse import (at_precision, forward_dtype, judged_note, reworded,
                               second_order_dtype, second_order_whose, with_finding)
from ..numerics.jacobian import Reference, Verdict, check_full, choose_mode, prime
from ..numerics.ledger import ZERO
from ..numerics.measured_words import SOLVER_CAUSE
from ..numerics.probe import check_probe
from ..numerics.problem import Problem
from ..numerics.sparse import in_place, masked_places
from ..results import Block, CheckResult, Finding, Outcome
from ..targets.cases import Case
from ..targets.load import Target
from ._common import Context, calls_since, error_result, expect_evaluations

if TYPE_CHECKING:
    from ..diagnosis.block import Diagnosis

Diagnoser = Callable[[Problem, Verdict, Block, int, int, CheckConfig], "Diagnosis | None"]
Engine = Callable[..., Verdict]  # (problem, config, leaves, outs, seed, reference) -> Verdict


def check_gradient(case: Case, target: Target, config: CheckConfig,
                   reference: Reference | None = None, surrogate: str | None = None) -> CheckResult:
    """First-order check of every (input, output) pair."""
    found = jacobian_result("gradient", case.problem, target, config, case.seed, reference,
                            surrogate, diagnose_first_order, first_order=True)
    return _masked_hint(found, case.problem, config)


def _masked_hint(found: CheckResult, problem: Problem, config: CheckConfig) -> CheckResult:
    """A sparse input compared at every element failed: say how to compare the specified ones
    (a gradient kept on the input's pattern, as torch.sparse.mm's, is right only there)."""
    names = {problem.names[p] for p in problem.sparse}
    if config.masked or not any(b.mismatched and b.input in names for b in found.blocks):
        return found
    hint = (f"{', '.join(sorted(names))}: sparse, compared at every element (gradcheck's "
            "default); a backward whose gradient keeps the input's pattern is right only on its "
            "specified elements: compare those with --masked (masked=True, a spec's masked: "
            "true)")
    return replace(found, details=(*found.details, hint))


def jacobian_result(name: str, problem: Problem, target: Target, config: CheckConfig, seed: int,
                    reference: Reference | None, surrogate: str | None,
                    diagnoser: Diagnoser, engine: Engine | None = None,
                    first_order: bool = False, forward: Problem | None = None) -> CheckResult:
    """Run the engine (reverse mode's unless another is given) and turn its Verdict into a
    CheckResult; `forward`: the target's own problem, whose forward's precision judges a
    derived one (double backward's)."""
    start = time.perf_counter()
    before = dict(problem.calls)
    if not problem.diff:
        return CheckResult(name, Outcome.SKIPPED, "no differentiable inputs to check")
    config = precision_config(config, problem)
    if first_order and problem.facts.drift:
        return drift_result(name, problem, target, start)
    try:
        leaves, outs = prime(problem)
        # double backward derives from this graph, except of sparse inputs (which it skips)
        if first_order and not problem.sparse and any(BY_NAME[check].reuses_graph
                                                      for check in config.checks):
            problem.cache.gradient_graph = (leaves, outs)  # double backward derives G from it
        if not outs:
            return CheckResult(name, Outcome.SKIPPED, "forward returns no differentiable output")
        if problem.complex:  # real finite differences cannot judge it: the complex check does
            return CheckResult(name, Outcome.SKIPPED, "complex inputs or outputs: the complex "
                               "check compares their real and imaginary parts")
        if not sum(v.numel() for v in leaves) or not sum(o.numel() for o in outs):
            return CheckResult(name, Outcome.SKIPPED, "empty tensors: no elements to compare")
        bad = sum(int((~torch.isfinite(o)).sum()) for o in outs)
        if bad:
            text = (f"forward returns NaN/Inf at {bad} output element(s) on these inputs, so no "
                    "gradient can be compared")
            return CheckResult(
                name, Outcome.FAILED, text, ("are the inputs outside forward's domain? pass "
                                             "them in it, e.g. -i 3x4:positive",),
                source=target.forward_source, duration_s=time.perf_counter() - start,
                findings=(Finding(f"{name}.forward_nonfinite", text, data={"elements": bad}),))
        # a forward coarser than its inputs (float64 given, float32 inside), learnt in every
        # mode before judging: judged at its precision, the same verdict whichever mode runs
        dtype = None
        if (first_order or forward is not None) and reference is None:
            dtype = (forward_dtype(problem, outs) if forward is None
                     else second_order_dtype(forward, problem, outs))
        if dtype is not None:
            config = at_precision(config, dtype)
        if not first_order and config.measured:  # the measured tolerance is first order's
            config = config.fixed()
        # double backward runs G's backward through this sweep's forwards where it can
        problem.recording(first_order and problem.cache.gradient_graph is not None)
        try:
            verdict = (engine or reverse_mode)(problem, config, leaves, outs, seed, reference)
        finally:
            problem.recording(False)
        coarse = None
        if dtype is not None:  # not a kink shown: the coarse dtype's rounding
            verdict = replace(verdict, details=reworded(verdict.details, dtype))
        if dtype is not None and forward is None:
            verdict, coarse = with_finding(problem, verdict, dtype)
        elif dtype is not None:
            verdict = replace(verdict, details=[*verdict.details, judged_note(
                dtype, second_order_whose(forward, dtype))])
    except MemoryError as exc:
        return CheckResult(name, Outcome.ERROR, str(exc),
                           details=("use --mode probe, or raise --max-memory",))
    except Exception as exc:  # the user's forward or backward raised (sys.exit: the runner)
        return error_result(name, exc, target, start, problem, before)
    diagnosed = [_with_diagnosis(problem, verdict, b, k, config, diagnoser, surrogate is not None)
                 for k, b in enumerate(verdict.blocks)]
    blocks = [with_grid(problem, verdict, b, k, config) for k, (b, _) in enumerate(diagnosed)]
    for sparse_input, (places, shape) in masked_places(problem).items():
        value_shape = tuple(problem.inputs[problem.input_names.index(sparse_input)].shape)
        blocks = [in_place(b, places, shape, value_shape) if b.input == sparse_input else b
                  for b in blocks]
    left_out = [f"{out} left out: it does not require grad after forward "
                "(ctx.mark_non_differentiable, or autograd does not differentiate it)"
                for out in problem.left_out]
    summary = (coarse.message if coarse is not None and not any(b.mismatched for b in blocks)
               else _summary(verdict, blocks, surrogate))
    if problem.left_out:
        summary += f" ({', '.join(problem.left_out)} left out: not differentiable)"
    return CheckResult(
        name, verdict.outcome, summary, (*verdict.details, *left_out),
        tuple(blocks), verdict.mode, _mode_reason(verdict, problem),
        tolerance={"eps": config.tolerance("eps"), **(verdict.tolerance or {
            k: config.tolerance(k) for k in ("atol", "rtol")})},
        calls=calls_since(problem, before), duration_s=time.perf_counter() - start,
        source=target.source if verdict.outcome is not Outcome.PASSED else None,
        findings=(*(() if coarse is None else (coarse,)),
                  *mismatch_findings(name, verdict.outcome, diagnosed, surrogate)))


def drift_result(name: str, problem: Problem, target: Target, start: float) -> CheckResult:
    """A forward whose outputs differ between calls on the same inputs, torch's RNG frozen:
    no gradient can be compared against its finite differences (gradcheck fails it too)."""
    where = "; ".join(f"{out} {how}" for out, how in problem.facts.drift)
    text = (f"forward returns different values on the same inputs with torch's RNG frozen "
            f"({where}), so no gradient can be compared")
    return CheckResult(
        name, Outcome.FAILED, text,
        ("no seed holds it still: does forward read uninitialised memory (torch.empty), "
         "a counter or other state that changes between calls?",),
        source=target.forward_source, duration_s=time.perf_counter() - start,
        findings=(Finding(f"{name}.forward_drift", text,
                          data={"outputs": [out for out, _ in problem.facts.drift]}),))


def _mode_reason(verdict: Verdict, problem: Problem) -> str | None:
    """The mode's reason, and why batching was dropped if it was (-v shows it on a pass)."""
    dropped = problem.cache.unbatched
    if not dropped or verdict.mode_reason is None:
        return verdict.mode_reason
    return f"{verdict.mode_reason}; {dropped}"


def mismatch_findings(name: str, outcome: Outcome,
                      diagnosed: list[tuple[Block, Diagnosis | None]],
                      surrogate: str | None = None) -> tuple[Finding, ...]:
    """A failed Jacobian check's findings: `<check>.mismatch` for each mismatched block, and
    the kind of mistake its diagnosis names (`<check>.factor`, ...), each with its data."""
    if outcome is not Outcome.FAILED:
        return ()
    found: list[Finding] = []
    for block, diagnosis in diagnosed:
        if not block.mismatched:
            continue
        where = {"input": block.input, "output": block.output}
        found.append(Finding(f"{name}.mismatch", mismatch_text(block, _against(surrogate)),
                             data={**where, "mismatched": block.mismatched,
                                   "checked": block.checked, "exhaustive": block.exhaustive,
                                   "surrogate": surrogate}))
        if diagnosis is not None:
            found.append(Finding(f"{name}.{diagnosis.kind}", block.diagnosis or diagnosis.text,
                                 data={**where, **diagnosis.data}))
    return tuple(found)


def _against(surrogate: str | None) -> str:
    return f"the declared surrogate ({surrogate})" if surrogate else "finite differences"


def mismatch_text(block: Block, against: str) -> str:
    """'gradient of output w.r.t. 'x' disagrees with finite differences at 3 of 9 elements'."""
    return (f"gradient of {block.output} w.r.t. '{block.input}' disagrees with {against} at "
            f"{_where(block)}")


def _where(block: Block) -> str:
    return (f"{block.mismatched} of {block.checked} elements" if block.exhaustive
            else f"{block.mismatched} located element(s)" if block.worst
            else "its probe (no single element located)")


def reverse_mode(problem: Problem, config: CheckConfig, leaves: list[torch.Tensor],
                 outs: list[torch.Tensor], seed: int, reference: Reference | None,
                 stop: str | None = None, first: Sequence[int] = (),
                 known_wrong: str | None = None) -> Verdict:
    """backward's Jacobian against finite differences (or a surrogate), full or probe mode;
    `stop`: why full mode may stop at the first block with a confirmed failure, sweeping
    inputs `first` first; `known_wrong`: why the analytical side is known wrong wherever the
    finite differences are not zero (a probe would only fail), so an expensive target goes
    to that sweep without probing first."""
    mode, reason = choose_mode(problem, config, leaves, outs)
    if mode == "probe" and known_wrong and stop and _fits(problem, config):
        # A probe could only fail, then turn to full mode: straight to the stopping sweep.
        mode, reason = "full", f"{reason}; {known_wrong}"
    expect_evaluations(problem, config, mode, leaves, outs)  # the progress line's time left
    if mode == "full":
        if stop is None and reference is None:
            from ..numerics.stopping import dropin_slow

            stop = dropin_slow(config)
        return check_full(problem, config, leaves, outs, reference, reason, stop, first)
    return check_probe(problem, config, leaves, outs, reference, reason, seed, stop, first)


def _fits(problem: Problem, config: CheckConfig) -> bool:
    """Whether full mode's plan (made by the mode choice) fits --max-memory."""
    plan = problem.cache.plan
    return plan is not None and plan.memory <= config.max_memory


def precision_config(config: CheckConfig, problem: Problem) -> CheckConfig:
    """Tolerances of the least precise floating input (an input pinned to float32, say)."""
    from ..config.settings import DEFAULT_TOLERANCES

    names = {str(v.dtype).replace("torch.", "") for v in problem.inputs if v.is_floating_point()}
    known = [n for n in names if n in DEFAULT_TOLERANCES]
    if not known:
        return config
    loosest = max(known, key=lambda n: DEFAULT_TOLERANCES[n]["eps"])
    if DEFAULT_TOLERANCES[loosest]["eps"] <= DEFAULT_TOLERANCES[config.dtype]["eps"]:
        return config
    return config.with_(dtype=loosest)


def _with_diagnosis(problem: Problem, verdict: Verdict, block: Block, k: int,
                    config: CheckConfig, diagnoser: Diagnoser, intended: bool = False
                    ) -> tuple[Block, Diagnosis | None]:
    """The block with its diagnosis's sentence, and the Diagnosis (kind and data) itself."""
    if not block.mismatched or verdict.outcome is Outcome.INCONCLUSIVE:
        return block, None  # a kink is not a mistake in backward: no diagnosis of one
    n_outputs = len(problem.output_names)
    i, o = divmod(k, n_outputs)
    found = diagnoser(problem, verdict, block, i, o, config)
    if found is None:
        return block, None
    text = found.words(other="intended") if intended else found.text
    return Block(**{**block.__dict__, "diagnosis": text}), found


def with_grid(problem: Problem, verdict: Verdict, block: Block, k: int,
              config: CheckConfig) -> Block:
    """A mismatched block evaluated whole gets its downsampled errors (for heat maps); a
    passing one, or one seen only through probes, pays nothing."""
    i, o = divmod(k, max(1, len(problem.output_names)))
    if not block.mismatched or (i, o) not in verdict.dense:
        return block
    from ..numerics.grid import error_grid

    analytical, numerical = verdict.dense[(i, o)]
    grid = error_grid(analytical, numerical, config.tolerance("atol"), config.tolerance("rtol"),
                      bad=verdict.mismatch.get((i, o)))
    return Block(**{**block.__dict__, "grid": grid})


def diagnose_first_order(problem: Problem, verdict: Verdict, block: Block, i: int, o: int,
                         config: CheckConfig) -> Diagnosis | None:
    """Name the kind of mistake from the dense blocks, else from the worst elements found."""
    if (i, o) not in verdict.dense:
        # a block compared in part is wholly zero in backward (numerics/stopping.py): no
        # permutation of a nonzero Jacobian, so no probes to pay for one
        found = (None if (i, o) in verdict.partial else _permuted(problem, block, i, o, config)) \
            or _diagnose_sample(block, config)
        if found is None:  # a sample shows no constant term; one zero-grad_output backward does
            from ..diagnosis.classify import constant_term

            return constant_term(_zero_cotangent(problem, i), block.input,
                                 config.tolerance("atol"))
        return found
    from ..diagnosis.classify import classify_block

    analytical, numerical = verdict.dense[(i, o)]
    pairs = [j for j in range(len(problem.input_names)) if j != i and (j, o) in verdict.dense]
    others = {problem.input_names[j]: as_numpy(verdict.dense[(j, o)][1]) for j in pairs}
    theirs = {problem.input_names[j]: as_numpy(verdict.dense[(j, o)][0]) for j in pairs}
    atol = verdict.tolerance.get("atol", config.tolerance("atol"))
    rtol = verdict.tolerance.get("rtol", config.tolerance("rtol"))
    if analytical.shape[0] == 1:
        # A one-row block (a scalar output) cannot show a constant term in its rows (it reads
        # as a factor or no pattern): one more backward, only here, settles it.
        from ..diagnosis.classify import constant_term

        constant = constant_term(_zero_cotangent(problem, i), block.input, atol)
        if constant:
            return constant
    return classify_block(
        as_numpy(analytical), as_numpy(numerical), input_name=block.input,
        input_shape=block.input_shape, output_shape=block.output_shape,
        input_values=as_numpy(problem.inputs[i].detach().reshape(-1)),
        atol=atol, rtol=rtol, other_inputs=others, other_analytical=theirs,
        mismatched=_judged(verdict, i, o),
        input_places=masked_places(problem).get(block.input, (None,))[0])


def _judged(verdict: Verdict, i: int, o: int) -> Any:
    """The elements the verdict judged wrong (numpy), so the diagnosis counts what it counted."""
    mask = verdict.mismatch.get((i, o))
    return None if mask is None else mask.cpu().numpy()


def _permuted(problem: Problem, block: Block, i: int, o: int, config: CheckConfig
              ) -> Diagnosis | None:
    """A roll, transpose or swap of a block too large to evaluate whole, from a few probes
    (not for a few wrong elements counted exhaustively: a permutation moves many)."""
    if block.exhaustive and block.mismatched <= 3:
        return None
    from ..diagnosis.structure import permuted_probes
    from ..numerics.permuted import probes

    try:
        found = probes(problem, config, i, o, config.seed)
    except Exception:  # noqa: BLE001 - the diagnosis is best effort; the verdict stands
        return None
    return permuted_probes(found, block.input_shape, block.output_shape, block.input,
                           config.tolerance("rtol") / 10)


def _zero_cotangent(problem: Problem, i: int) -> Any:
    """Backward's gradient of input i for an all-zero grad_output (None if it raises); one
    forward and backward serve every failing input of the problem."""
    memo = problem.cache.zero_cotangent
    if not memo:
        try:  # the contract's, read from the ledger where it ran at this point
            grads = problem.cache.ledger.backward(problem.inputs, ZERO)
            if grads is None:
                leaves, outs = _graph(problem)
                grads = problem.vjp(leaves, outs, [torch.zeros_like(t) for t in outs])
            memo = [as_numpy(g.detach().reshape(-1).double()) for g in grads]
        except Exception:  # noqa: BLE001 - the diagnosis is best effort; the verdict stands
            memo = [None] * len(problem.diff)
        problem.cache.zero_cotangent = memo
    return memo[i]


def _graph(problem: Problem) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(leaves, outputs) of a forward with its graph at the case's point: the drop-in call's
    own where it is handed over (numerics/handed.py), else a forward."""
    from ..numerics.handed import served_graph
    from ..numerics.problem import select_outputs

    kept = served_graph(problem.fn, problem.diff, problem.inputs)
    if kept is None:
        return problem.graph()
    return kept[0], select_outputs(kept[1], problem.output_mask)


def as_numpy(t: torch.Tensor) -> Any:
    """A numpy array of t's values, on the host; bfloat16, which numpy lacks, widened to float32
    (the analytical rows live on the inputs' device)."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _diagnose_sample(block: Block, config: CheckConfig) -> Diagnosis | None:
    """Too large to diagnose whole: only what the worst elements shown can support."""
    from ..diagnosis.classify import classify_probe

    sample = [e for e in block.worst if not e.inconclusive]
    if len(sample) < 2:
        return None
    return classify_probe([e.analytical for e in sample], [e.numerical for e in sample],
                          atol=config.tolerance("atol"), rtol=config.tolerance("rtol"),
                          unit="worst elements shown (a sample: the block is too "
                               "large to diagnose whole)")


def _summary(verdict: Verdict, blocks: list[Block], surrogate: str | None) -> str:
    against = _against(surrogate)
    bad = [b for b in blocks if b.mismatched]
    if not bad:
        checked = sum(b.checked for b in blocks)
        unit = "probe" if verdict.mode == "probe" else "element"
        worst = max((b.max_abs_diff for b in blocks), default=0.0)
        if verdict.outcome is Outcome.INCONCLUSIVE:  # a noisy probe, full mode over budget
            return (f"finite differences are too noisy for {checked} {unit}"
                    f"{'' if checked == 1 else 's'} to judge, max abs diff {worst:.2g}")
        return (f"matches {against}: {checked} {unit}{'' if checked == 1 else 's'}, "
                f"max abs diff {worst:.2g}")
    first = bad[0]
    more = f", and {len(bad) - 1} more (input, output) pair(s)" if len(bad) > 1 else ""
    if verdict.outcome is Outcome.FAILED:
        return mismatch_text(first, against) + more
    if verdict.cause == SOLVER_CAUSE:  # the finite differences were measured reliable
        return f"{_where(first)} of '{first.input}'{more} undecided: {SOLVER_CAUSE}"
    cause = f": {verdict.cause}" if verdict.cause else ""
    return f"finite differences are unreliable at {_where(first)} of '{first.input}'{more}{cause}"


def run(case: Case, context: Context) -> CheckResult:
    """The registry's entry point: against a spec's surrogate when it declares one; inside a
    model, a failure is annotated with the custom Function to blame."""
    complex_ = CheckResult("gradient", Outcome.SKIPPED, "complex inputs or outputs: the "
                           "complex check compares their real and imaginary parts")
    if any(v.is_complex() for v in case.problem.inputs):
        return complex_
    reference = context.reference(case) if context.reference is not None else None
    result = check_gradient(case, context.target, context.config, reference, context.surrogate)
    case.problem.cache.first_order = result.outcome  # double backward reads it (its cost)
    case.problem.cache.first_order_failing = tuple(
        k for k, name in enumerate(case.problem.input_names)
        if any(b.input == name and b.mismatched for b in result.blocks))
    if case.problem.complex:  # complex outputs, learnt by the priming forward
        return complex_
    if context.annotate is not None and context.surrogate is None:
        result = context.annotate(result, case.problem, context.config)
    return result
