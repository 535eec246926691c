"""The probe phase: one pass before any check learns a case's facts (numerics/facts.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..errors import InternalError
from ..numerics.facts import Facts, output_facts
from ..numerics.handed import served, served_graph
from ..numerics.problem import Problem, frozen_rng, function_nodes, tensor_outputs
from ..numerics.rounding import FINEST_FIRST, dtype_name
from ..numerics.sparse import dense_output
from ..results import Finding
from ..tracebacks import calls_user_code, gradtool_frame, raised_in_gradtool
from .cases import Case
from .drift import judge
from .drift import note as drift_note

LEAF_INPLACE = "leaf Variable that requires grad is being used in an in-place operation"
STOCHASTIC = "forward is stochastic"  # the opening of the note every report shows


def probe(case: Case, keep_graph: bool = True, config: CheckConfig | None = None) -> Facts:
    """Learn the case's facts once, before any check (a no-op when already learnt).

    Two forwards: one without a graph, on copies (does forward write its inputs?), one with a
    graph (which outputs are differentiable, custom Functions inside); a first forward that drew from
    torch's RNG, or outputs that differ between them, mean forward is stochastic, and the RNG is frozen from then on (a third
    forward, under the frozen RNG, gives the graph). keep_graph: keep that graph forward for
    the first check that needs one (the contract check, else the priming forward of the
    gradient check): it replaces a forward that check made. Outputs that the frozen RNG does not
    hold still drift: a failure only beyond what the checks resolve at config's tolerances
    (targets/drift.py). The
    user's code raising is no result here: what was learnt stays, and each check that runs
    forward reports the exception itself.
    """
    problem = case.problem
    if problem.facts.learnt:
        return problem.facts
    try:
        _learn(case, keep_graph, config)
    except (Exception, SystemExit) as exc:
        if isinstance(exc, Exception) and raised_in_gradtool(exc):
            raise InternalError(exc, gradtool_frame(exc)) from exc
    problem.learn(problem.facts.with_(learnt=True))
    return problem.facts


def _learn(case: Case, keep_graph: bool, config: CheckConfig | None) -> None:
    """Each fact is recorded as soon as it is known, so a later forward raising keeps it."""
    problem = case.problem
    given = problem.facts  # what a creator already knew (a captured Function's seed, say)
    start, before = time.perf_counter(), _generators(problem)
    first, mutates, findings = _purity(problem)
    seconds = time.perf_counter() - start
    drew = _generators(problem) != before
    problem.learn(given.with_(mutates=given.mutates or mutates, findings=tuple(findings),
                              precision=_coarsest(problem.args), forward_seconds=seconds))
    leaves, result = _graph_forward(problem)
    problem.learn(problem.facts.with_(
        forward_seconds=min(seconds, problem.cache.forward_seconds or seconds)))
    same = _same(tensor_outputs(first), tensor_outputs(result))
    if given.seed is None and drew and (not same or _follows_draws(problem, case.seed, first)):
        # A forward whose outputs follow its draws from torch's RNG is stochastic, even where
        # two draws gave the same outputs (a dropout over 12 elements: once in 4096 pairs of
        # calls); one that draws without its outputs following (an unused draw, a forward
        # seeding the RNG itself) is not: its layouts are still tried.
        problem.learn(problem.facts.with_(seed=case.seed))
        leaves, result = _graph_forward(problem)  # again, under the frozen RNG
    elif given.seed is None and not same:
        # Without a graph and with one, torch may run other kernels (the nuclear norm: svdvals,
        # then svd), a last-bit difference that is no randomness: stochastic only when a second
        # graph forward differs from the first too.
        again = _graph_forward(problem)
        if not _same(tensor_outputs(result), tensor_outputs(again[1])):
            problem.learn(problem.facts.with_(seed=case.seed))
            again = _graph_forward(problem)  # again, under the frozen RNG
            found = judge(problem, tensor_outputs(again[1]),
                          tensor_outputs(_graph_forward(problem)[1]), config)
            if found.failing or found.benign:  # the frozen RNG does not hold it still: no seed
                problem.learn(problem.facts.with_(seed=None, drift=found.failing,
                                                  drift_size=found.size))
            if found.benign and not found.failing:  # a summation order: checked as it is
                case.notes.append(drift_note(found.benign))
        leaves, result = again
    outs = tensor_outputs(result)
    tracked = [o for o in outs if (o.is_floating_point() or o.is_complex()) and o.requires_grad]
    problem.learn(problem.facts.with_(
        has_functions=any(_users(node) for node in function_nodes(tracked).values()),
        precision=_coarsest([*problem.args, *outs]),
        **output_facts(outs, problem.output_labels, problem.keep_all_outputs, leaves)))
    problem.cache.first_graph = (leaves, result) if keep_graph else None


FOLLOW_SEEDS = 4  # forwards under other seeds: a 1-element dropout's all agree once in 16


@calls_user_code
def _follows_draws(problem: Problem, seed: int, first: Any) -> bool:
    """Whether forward's outputs change with the RNG's seed (forwards without a graph, on
    copies, under seeds other than the case's, until one differs from `first`)."""
    for k in range(1, FOLLOW_SEEDS + 1):
        args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in problem.args]
        with torch.no_grad(), frozen_rng(seed + k):
            problem.calls["forward"] += 1
            again = tensor_outputs(problem.fn(*args))
        if not _same(first, again):
            return True
    return False


def _generators(problem: Problem) -> list[bytes]:
    """The states of torch's generators a forward on the case's arguments may draw from: the
    CPU one and those of the CUDA devices the arguments are on (bytes, compared in one go)."""
    devices = sorted({a.device.index or 0 for a in problem.args
                      if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
    states = [torch.default_generator.get_state()]
    states += [torch.cuda.get_rng_state(d) for d in devices]
    return [s.numpy().tobytes() for s in states]


@calls_user_code
def _purity(problem: Problem) -> tuple[Any, bool, list[Finding]]:
    """(forward's result, whether it wrote an input, the findings): a forward without a graph
    on copies of the arguments. An input changed by forward must be marked dirty (and so
    returned as an output)."""
    kept = served(problem.fn, problem.diff, problem.inputs)
    if kept is not None:  # the drop-in's lean path showed this forward on copies: it wrote none
        return kept, False, []
    originals = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in problem.args]
    args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in problem.args]
    with torch.no_grad(), problem.rng():
        problem.calls["forward"] += 1
        result = problem.fn(*args)
    outputs = tensor_outputs(result)
    mutates, findings = False, []
    for name, arg, original in zip(problem.names, args, originals):
        if released(arg):  # forward freed it: given copies from now on, never read again
            mutates = True
            continue
        if original is None or equal(arg, original) or both_nan(arg, original):
            continue
        mutates = True
        if any(t is arg for t in outputs):
            continue  # returned itself: marked dirty (Function.apply) or a plain in-place op
        # Function.apply hands back an unmarked input as a new alias of the same memory.
        if any(t.data_ptr() == arg.data_ptr() and t.shape == arg.shape for t in outputs):
            message = (f"forward modifies input '{name}' in place and returns it without "
                       f"ctx.mark_dirty({name})")
        else:
            message = (f"forward modifies input '{name}' in place without "
                       f"ctx.mark_dirty({name}) (and without returning it)")
        findings.append(Finding("contract.unmarked_inplace", message))
    return [t.detach().clone() for t in outputs], mutates, findings


@calls_user_code
def _graph_forward(problem: Problem) -> tuple[list[torch.Tensor], Any]:
    """A forward recording the graph, returning the raw result; a forward that raises on leaf
    inputs (mark_dirty Functions) teaches that it writes its inputs, and is given copies."""
    kept = served_graph(problem.fn, problem.diff, problem.inputs)
    if kept is not None:  # the drop-in's own forward, as torch's gradcheck runs backward there
        return kept
    leaves = [v.detach().clone().requires_grad_(True) for v in problem.inputs]
    for attempt in range(2):
        passed = [leaf.clone() for leaf in leaves] if problem.mutates else leaves
        try:
            with torch.enable_grad(), problem.rng():
                problem.calls["forward"] += 1
                start = time.perf_counter()
                result = problem.fn(*problem.with_inputs(passed))
                problem.cache.forward_seconds = time.perf_counter() - start  # for mode predictions
                return leaves, result
        except RuntimeError as exc:
            if LEAF_INPLACE not in str(exc) or attempt:
                raise
            problem.learn(problem.facts.with_(mutates=True))
    raise AssertionError("unreachable")


def released(t: Any) -> bool:
    """A tensor whose storage user code released (`x.untyped_storage().resize_(0)`, reversible
    layers' memory trick): reading it would crash the process, so gradtool never compares,
    hashes or clones it. Sparse and storage-less tensors are never released."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not t.numel():
        return False
    try:
        return t.untyped_storage().nbytes() == 0
    except (RuntimeError, NotImplementedError):  # a wrapper subclass, a fake tensor: no storage
        return False


def _same(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> bool:
    """Two forwards on the same inputs agree (NaN != NaN: equal NaN positions are no
    randomness)."""
    return len(first) == len(second) and all(
        a.shape == b.shape and (equal(a, b) or both_nan(a, b)) for a, b in zip(first, second))


def _coarsest(values: Sequence[Any]) -> str | None:
    names = {dtype_name(v.dtype) for v in values
             if isinstance(v, torch.Tensor) and v.is_floating_point()}
    known = [n for n in names if n in FINEST_FIRST]
    return max(known, key=FINEST_FIRST.index) if known else None


def comparable(t: torch.Tensor) -> torch.Tensor:
    """complex32 has no comparison kernels on the CPU: compare it exactly, as complex64; a
    sparse tensor has none either: compare the dense tensor it stands for."""
    t = dense_output(t)
    return t.to(torch.complex64) if t.dtype == torch.complex32 else t


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(comparable(a), comparable(b))


def both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    # values only: nan_to_num has no derivative for complex tensors requiring grad
    a, b = comparable(a).detach(), comparable(b).detach()
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))) and \
        bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))


def stochastic_note(facts: Facts) -> str | None:
    """What the contract check and the report say when forward is stochastic."""
    if facts.seed is None:
        return None
    return (f"{STOCHASTIC} (it draws from torch's RNG, or two calls on the same inputs "
            f"differ): torch's RNG is re-seeded "
            f"with {facts.seed} before every evaluation")


def _users(node: Any) -> bool:
    """A Function node whose class the user wrote, or one of torch's that may apply the user's
    again (reentrant checkpointing re-runs its block in backward). Not a torch.library op's
    generated autograd Function: its implementation runs below autograd, so no Function inside
    it leaves a node, and there is nothing to record or re-check (its own checks are the op's)."""
    return not type(node)._forward_cls.__module__.startswith("torch._library.")
