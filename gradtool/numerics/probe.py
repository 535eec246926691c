"""Probe mode: vᵀ(J u) by finite differences against (vᵀJ) u by backward, then localisation."""

# Cost is fixed whatever the size: P directions u over all inputs at once (3 forwards each, at
# x + h u, x - h u, x + 2h u; f(x) comes from the forward that built the graph) and Q cotangents
# v over all outputs (one VJP each); every (u, v) pair is a test, so the default P = 1, Q = 2
# gives two tests for 3 forwards and 2 backwards. Blocks are separated
# only when a test fails. u and v are ±[1, 2) per element: never a tiny step or weight, never an
# exact cancellation between two elements. The tolerance comes from the finite-difference error
# measured between steps h and 2h, and is never multiplied by the number of elements.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..results import Outcome
from .compare import BlockTally
from .draws import (DRAWN_KEEP, DRAWN_MAX, _DRAWN, _drawn, _uniform,  # noqa: F401 - re-exported
                    probe_vectors)
from .confirm import KINK_CAUSE
from .jacobian import Reference, Verdict, _tallies, check_full, choose_mode, judged_tallies
from .localise import Locator, Test, Tests, machine
from .measured_words import data_dependent
from .problem import Problem, flat_cat
from .steps import directional, vjp_rows


@dataclass
class Probes:
    """The random vectors of one probe run and what backward and the forward made of them."""

    u: list[list[torch.Tensor]]      # P directions, one tensor per input
    v: torch.Tensor                  # (Q, n_out) cotangents
    grads: torch.Tensor              # (Q, n_in): vᵀJ from backward
    diffs: torch.Tensor              # (2, P, n_out): J u at steps h and 2h
    f0: torch.Tensor
    in_slices: list[slice]
    out_slices: list[slice]
    noisy: str | None = None         # why no test may pass (see localise.Tests.noisy)


def check_probe(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                outs: Sequence[torch.Tensor], reference: Reference | None, reason: str,
                seed: int, stop: str | None = None, first: Sequence[int] = ()) -> Verdict:
    """A fixed number of calls whatever the size; tolerance from the measured FD error.
    `stop`, `first`: check_full's, passed on when a failing probe turns to full mode."""
    tallies = judged_tallies(problem, config, leaves, outs) if reference is None else \
        _tallies(problem, leaves, outs, config.tolerance("atol"), config.tolerance("rtol"),
                 config.max_worst)
    if reference is not None:
        v = probe_vectors(problem, outs, config, seed)[1]
        return _against_reference(problem, leaves, outs, tallies, v, reference,
                                  _slices([x.numel() for x in problem.inputs]),
                                  _slices([o.numel() for o in outs]), reason)
    probes, failing = screen(problem, config, leaves, outs, seed, tallies)
    if probes.noisy:
        return _noisy(problem, config, leaves, outs, tallies, probes.noisy, reason, stop, first)
    if not failing:
        verdict = Verdict(Outcome.PASSED, [t.to_block(exhaustive=False) for row in tallies
                                           for t in row], "probe", reason)
        if config.measured:
            from .measured_words import describe_probe

            describe_probe(verdict, tallies[0][0])
        return verdict
    n_in = sum(v.numel() for v in leaves)
    pairs = 1 if dropin_cut(config) else min(4, len(leaves) * len(outs))
    if (config.mode == "auto" or dropin_cut(config)) and \
            2 * n_in <= localising_cost(n_in, pairs):
        # Every column costs fewer evaluations than bisecting to elements: full mode names
        # them all (and diagnoses whole blocks) for the price of gradcheck's slow mode -- what
        # torch's failing fast mode pays too (the failing pair's slow-mode Jacobian)
        reason = (f"{reason}; the probe failed and {2 * n_in} column evaluations cost less "
                  "than localising it")
        if stop is None and not config.exhaustive:
            stop, first = cut_after_failure(problem, config, leaves, outs, probes, failing)
        return check_full(problem, config, leaves, outs, None, reason, stop, first)
    return _localise(problem, config, leaves, outs, tallies, probes, failing, reason)


def dropin_cut(config: CheckConfig) -> bool:
    """The drop-in's fast_mode (probe mode asked for, in gradcheck's scope), not exhaustive: a
    failure's evidence is paid as torch's failing fast mode pays it (one pair's columns), the
    rest offered with exhaustive=True / --exhaustive."""
    return config.mode == "probe" and config.gradcheck_cost


def cut_after_failure(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                      outs: Sequence[torch.Tensor], probes: Probes,
                      failing: list[tuple[int, int]]) -> tuple[str, tuple[int, ...]]:
    """A failing probe on a target too expensive for full mode at once (auto mode chose probe
    mode for its cost): the verdict needs one confirmed failing block, its elements and its
    diagnosis, not every column. Each input is probed alone along the failing direction (3
    evaluations an input, where its columns cost 2 each), the inputs whose own probe fails are
    swept first, and full mode stops at the first block whose failure is confirmed: the stop's
    words, and those inputs."""
    found: dict = {}
    if 3 * len(leaves) < sum(v.numel() for v in leaves) and len(leaves) > 1:
        p, q = failing[0]
        found = _failing_blocks(problem, config, leaves, outs, probes, p, q,
                                config.tolerance("atol"))
    first = tuple(sorted({i for i, _ in found}))
    names = problem.input_names
    told = (f"alone along the failing direction, the probe fails for "
            f"{', '.join(repr(names[i]) for i in first)}"
            f"{' and passes for the others' if len(first) < len(leaves) else ''}; "
            if found else "")
    if dropin_cut(config):  # gradtool.gradcheck(fast_mode=True): no --exhaustive keyword
        return ("the probe failed, and fast mode pays for a failure what torch's does (one "
                "failing pair's columns), so the sweep stopped at its first block with a "
                f"confirmed failure ({told}gradtool.check(..., exhaustive=True), or --exhaustive "
                "on the command line, sweeps every column)"), first
    return (f"the probe failed and the target is expensive, so the sweep stopped at its first "
            f"block with a confirmed failure ({told}--exhaustive sweeps every column)"), first


def localising_cost(n_in: int, pairs: int) -> int:
    """Forward evaluations _localise predicts: per failing pair, three bisections of 3
    evaluations per halving, and a 5-evaluation re-estimate of each element found."""
    return pairs * 3 * (3 * (max(1, n_in).bit_length() + 1) + 5)


def screen(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor], seed: int,
           tallies: list[list[BlockTally]] | None = None
           ) -> tuple[Probes, list[tuple[int, int]]]:
    """The fixed-cost part: P directions, Q cotangents, every pair tested; the failing pairs."""
    values = [v.detach() for v in problem.inputs]
    u, v = probe_vectors(problem, outs, config, seed)
    grads = vjp_rows(problem, leaves, outs, v)
    f0 = flat_cat(outs).detach()
    diffs = directional(problem, values, u, config.tolerance("eps"), f0)
    probes = Probes(u, v, grads, diffs, f0, _slices([x.numel() for x in values]),
                    _slices([o.numel() for o in outs]))
    if tallies is None:
        tallies = judged_tallies(problem, config, leaves, outs)
    return probes, _screen(probes, tallies, config, values[0].dtype)


def _slices(sizes: Sequence[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def _screen(probes: Probes, tallies: list[list[BlockTally]], config: CheckConfig,
            dtype: torch.dtype) -> list[tuple[int, int]]:
    """Every (direction, cotangent) pair over all blocks at once; the failing pairs."""
    u = torch.stack([flat_cat(d) for d in probes.u])                  # (P, n_in)
    tests = Tests(probes.v, probes.diffs, probes.f0, probes.grads, u, config.tolerance("eps"),
                  machine(dtype, config), tallies[0][0].atol, ceiling(config))
    probes.noisy = noisy_words(tests)
    worst = float(tests.difference.max()) if tests.difference.size else 0.0
    for row in tallies:
        for tally in row:
            tally.checked += tests.difference.size
            tally.max_abs = max(tally.max_abs, worst)
    return [(int(p), int(q)) for p, q in zip(*tests.fails.nonzero())]


def _noisy(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
           outs: Sequence[torch.Tensor], tallies: list[list[BlockTally]], why: str, reason: str,
           stop: str | None, first: Sequence[int]) -> Verdict:
    """A probe that cannot pass, nor localise (its element tests as noisy): full mode judges
    each element where auto mode's own cost rule would choose it; else inconclusive (auto mode
    probed because full mode is over budget), saying how to judge it."""
    if affordable(problem, config, leaves, outs):
        return check_full(problem, config, leaves, outs, None,
                          f"{reason}; {why}, so full mode judges each element", stop, first)
    return Verdict(Outcome.INCONCLUSIVE, [t.to_block(exhaustive=False) for row in tallies
                                          for t in row], "probe", reason,
                   [f"inconclusive: {why}; full mode would judge each element but is over "
                    "budget here: run it with --mode full, or set --atol/--rtol to the noise "
                    "you accept"])


def affordable(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
               outs: Sequence[torch.Tensor]) -> bool:
    """Whether full mode may judge what a probe cannot: probe mode was asked for and auto
    mode's own cost rule would choose full mode (auto mode probed because it would not)."""
    return config.mode != "auto" and \
        choose_mode(problem, replace(config, mode="auto"), leaves, outs)[0] == "full"


def ceiling(config: CheckConfig) -> tuple[float, float]:
    """The fixed (atol, rtol) no probe pass may be more lenient than: full mode's element
    ceiling, measured tolerance or not."""
    return config.tolerance("atol"), config.tolerance("rtol")


def noisy_words(tests: Tests) -> str | None:
    """Why the probe cannot pass (its measured finite-difference error beyond the fixed
    tolerance of what it tests), or None."""
    if not tests.noisy.any():
        return None
    p, q = (int(k[0]) for k in tests.noisy.nonzero())
    return (f"the probe's measured finite-difference error ({tests.measured[p, q]:.3g}) is "
            f"beyond the fixed tolerance of the directional derivative it tests "
            f"({tests.ceiling[p, q]:.3g}): it could pass a wrong gradient")


def _localise(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
              outs: Sequence[torch.Tensor], tallies: list[list[BlockTally]], probes: Probes,
              failing: list[tuple[int, int]], reason: str) -> Verdict:
    """Split the first failing test by input and output, then bisect inside failing blocks.
    A block fails on an element beyond its own tolerance, what full mode would find there. A
    probe is a sum over many elements: one that disagrees with no such element found cannot
    say whether any element is beyond its tolerance (spread errors, each within it, sum past
    one element's), so it is unsettled: full mode judges it where affordable, else it is
    inconclusive -- never a failure full mode at the same tolerance might pass."""
    p, q = failing[0]
    pairs = _failing_blocks(problem, config, leaves, outs, probes, p, q, tallies[0][0].atol)
    blocks, outcomes, details, skipped, unsettled = {}, [], [], [], []
    # the drop-in's fast_mode (probe mode asked for, in gradcheck's scope): the evidence a
    # verdict needs, as torch's failing fast mode pays for one pair's columns: localising stops
    # at the first element that fails the pair for certain, and at the first failing pair
    # (gradtool's own report, elsewhere, keeps the elements its diagnoses read)
    cut = dropin_cut(config)
    for (i, o), (g, v) in pairs.items():
        tally = tallies[i][o]
        if cut and Outcome.FAILED in outcomes:
            skipped.append(f"{tally.input} -> {tally.output}")
            continue
        locator = Locator(problem, config, leaves, outs, i, probes.u[p][i].reshape(-1), v, g,
                          probes.in_slices[i], probes.out_slices[o])
        elements = locator.elements(
            decisive=(lambda e, t=tally: _decisive(e, t, config)) if cut else None)
        bad = [e for e in elements if e.abs_diff > tally.atol + tally.rtol * abs(e.numerical)
               or e.inconclusive]
        tally.mismatched, tally.max_rel = len(bad), max((e.rel_diff for e in bad), default=0.0)
        if bad and all(e.inconclusive for e in bad):
            outcomes.append(Outcome.INCONCLUSIVE)
            details.append(_kink_note(tally, bad))
        elif bad and config.measured and _within_fixed(bad, config) and data_dependent(problem):
            # Beyond the measured error, within gradcheck's: what a forward computed only to
            # a tolerance (an iterative solver) looks like.
            outcomes.append(Outcome.INCONCLUSIVE)
            details.append(f"inconclusive: {tally.input} -> {tally.output}: probes disagree by "
                           f"{tally.max_abs:.3g}, and the elements localised are beyond the "
                           "measured finite-difference error but within gradcheck's fixed "
                           "tolerance, and forward has data-dependent control flow (it reads "
                           "tensor values into Python) (a forward computed to a tolerance, such "
                           "as an iterative solver, looks like this): errors this small cannot "
                           "be told from it here, and the elements not localised are not "
                           "judged; --mode full with --atol/--rtol judges each element by a "
                           "fixed tolerance")
        elif not bad and (not config.measured or data_dependent(problem)
                          or not _fails_fixed(problem, config, probes, p, q, i, o, g)):
            unsettled.append(tally)
        else:
            outcomes.append(Outcome.FAILED)
            if not bad:  # measured: spread beyond the fixed atol, on a deterministic forward
                tally.mismatched = 1  # the failing probe (the block's header says so)
                details.append(f"{tally.input} -> {tally.output}: probes disagree by "
                               f"{tally.max_abs:.3g}, beyond the measured finite-difference "
                               "error, but no single element stands out")
        blocks[(i, o)] = tally.to_block(tuple(bad), exhaustive=False)
    if skipped:
        details.append(f"the probe fails for {', '.join(skipped)} too, not localised: the "
                       "first failing pair decides (gradtool.check(..., exhaustive=True), or "
                       "--exhaustive, localises every pair)")
    joint = not pairs and (not config.measured or data_dependent(problem))
    if not pairs and not joint:
        outcomes.append(Outcome.FAILED)
        details.append("the joint probe fails but no single (input, output) pair does: "
                       "small errors spread over several pairs")
    if Outcome.FAILED not in outcomes and (unsettled or joint) and \
            affordable(problem, config, leaves, outs):
        return check_full(problem, config, leaves, outs, None,
                          f"{reason}; the probe failed with no element beyond its tolerance, "
                          "so full mode judges each element")
    details += [_unsettled_note(t, config) for t in unsettled]
    if joint:
        details.append(_unsettled_note(None, config))
    all_blocks = [blocks.get((i, o)) or t.to_block(exhaustive=False)
                  for i, row in enumerate(tallies) for o, t in enumerate(row)]
    outcome = Outcome.FAILED if Outcome.FAILED in outcomes else Outcome.INCONCLUSIVE
    return Verdict(outcome, all_blocks, "probe", reason, details)


def _unsettled_note(tally: BlockTally | None, config: CheckConfig) -> str:
    """Why a failing probe with no element beyond its tolerance is no verdict (`tally` None:
    the joint probe fails and no single pair does)."""
    beyond = ("the measured finite-difference error" if config.measured
              else f"one element's fixed tolerance (atol {config.tolerance('atol'):g})")
    where = (f"{tally.input} -> {tally.output}: probes disagree by {tally.max_abs:.3g}, "
             f"beyond {beyond}, yet no element localised is beyond its own" if tally else
             f"the joint probe fails, beyond {beyond}, yet no single (input, output) pair does")
    return (f"inconclusive: {where}: a probe sums many elements, and errors spread over them, "
            "each within its tolerance (a backward computed to a tolerance, such as an "
            "iterative solver's, looks like this), can sum past one element's; full mode judges "
            "each element: run it with --mode full")


def _failing_blocks(problem: Problem, config: CheckConfig, leaves: Sequence[torch.Tensor],
                    outs: Sequence[torch.Tensor], probes: Probes, p: int, q: int,
                    atol: float) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """{(input, output): (vᵀJ on that input, v on that output)} for the pairs whose own test
    fails: one direction per input, one cotangent per output."""
    values = [x.detach() for x in problem.inputs]
    n_in, n_out = len(values), len(outs)
    v_rows = torch.zeros(n_out, probes.v.shape[1], dtype=probes.v.dtype, device=probes.v.device)
    for o, sl in enumerate(probes.out_slices):
        v_rows[o, sl] = probes.v[q, sl]
    grads = vjp_rows(problem, leaves, outs, v_rows) if n_out > 1 else probes.grads[q:q + 1]
    if n_in > 1:
        dirs = [[probes.u[p][j] if j == i else torch.zeros_like(values[j]) for j in range(n_in)]
                for i in range(n_in)]
        diffs = directional(problem, values, dirs, config.tolerance("eps"), probes.f0)
    else:
        diffs = probes.diffs[:, p:p + 1]
    eps_m = machine(values[0].dtype, config)
    found = {}
    for i, isl in enumerate(probes.in_slices):
        for o, osl in enumerate(probes.out_slices):
            g = grads[o, isl]
            test = Test(probes.v[q, osl], diffs[:, i, osl], probes.f0[osl], g,
                        probes.u[p][i].reshape(-1), config.tolerance("eps"), eps_m, atol)
            if test.fails:
                found[(i, o)] = (g, probes.v[q, osl])
    return found


def _decisive(element: Any, tally: BlockTally, config: CheckConfig) -> bool:
    """An element that fails its block whatever else localising finds: beyond the block's
    tolerance, not a kink, and beyond gradcheck's fixed tolerance where the measured one
    judges (_localise's inconclusive branches then cannot apply)."""
    return (not element.inconclusive
            and element.abs_diff > tally.atol + tally.rtol * abs(element.numerical)
            and not (config.measured and _within_fixed([element], config)))


def _within_fixed(elements: Sequence, config: CheckConfig) -> bool:
    """Every element within gradcheck's fixed tolerance (none a kink)."""
    atol, rtol = config.tolerance("atol"), config.tolerance("rtol")
    return all(not e.inconclusive and e.abs_diff <= atol + rtol * abs(e.numerical)
               for e in elements)


def _fails_fixed(problem: Problem, config: CheckConfig, probes: Probes, p: int, q: int,
                 i: int, o: int, g: torch.Tensor) -> bool:
    """Whether block (i, o)'s probe test also fails with gradcheck's atol as its floor."""
    values = [x.detach() for x in problem.inputs]
    dirs = [[probes.u[p][j] if j == i else torch.zeros_like(x) for j, x in enumerate(values)]]
    osl = probes.out_slices[o]
    diffs = directional(problem, values, dirs, config.tolerance("eps"), probes.f0)
    return Test(probes.v[q, osl], diffs[:, 0, osl], probes.f0[osl], g,
                probes.u[p][i].reshape(-1), config.tolerance("eps"),
                machine(values[0].dtype, config), config.tolerance("atol")).fails


def _kink_note(tally: BlockTally, elements: Sequence) -> str:
    where = ", ".join(f"{tally.input}{list(e.input_index)}" for e in elements[:3])
    return (f"inconclusive: finite differences disagree across step sizes at {where} — "
            f"{KINK_CAUSE}")


def _against_reference(problem: Problem, leaves: Sequence[torch.Tensor],
                       outs: Sequence[torch.Tensor], tallies: list[list[BlockTally]],
                       v: torch.Tensor, reference: Reference, in_slices: list[slice],
                       out_slices: list[slice], reason: str) -> Verdict:
    """A declared surrogate is exact: compare the VJP vectors element by element, per output."""
    rows = torch.zeros(len(v) * len(out_slices), v.shape[1], dtype=v.dtype, device=v.device)
    for k in range(len(v)):
        for o, sl in enumerate(out_slices):
            rows[k * len(out_slices) + o, sl] = v[k, sl]
    grads, expected = vjp_rows(problem, leaves, outs, rows), reference(rows)
    for i, isl in enumerate(in_slices):
        for o in range(len(out_slices)):
            picked = slice(o, None, len(out_slices))
            tallies[i][o].add(grads[picked, isl].T, expected[picked, isl].T)
    blocks = [t.to_block(exhaustive=False) for row in tallies for t in row]
    failed = any(t.mismatched for row in tallies for t in row)
    return Verdict(Outcome.FAILED if failed else Outcome.PASSED, blocks, "probe", reason)
