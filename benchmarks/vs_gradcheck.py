"""gradtool against torch.autograd.gradcheck, side by side: speed, calls, memory and detection."""

#     python benchmarks/vs_gradcheck.py [--quick] [--no-assert]
#
# Every workload runs gradtool's modes and gradcheck's (or gradgradcheck's) on the same sampled
# tensors, interleaved round by round, with one intra-op thread; medians are reported with the
# ratios, and forward/backward evaluations are counted. Sizes that slow mode cannot run in the time
# or memory allowed are reported with its call-count estimate instead. Writes
# benchmarks/results/latest.json (--quick: quick.json) and prints markdown tables and the goals
# (exit 1 if one is missed, unless --no-assert).

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import bugs  # noqa: E402
import harness as h  # noqa: E402
from report import goals, markdown  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SLOW_MEMORY = 8e9   # gradcheck slow mode's dense Jacobians beyond this: not run


def workloads(quick: bool) -> list[h.Workload]:
    lin = [(4, 4, 4), (20, 20, 30), (64, 64, 64)] + ([] if quick else [(128, 128, 128)])
    elem = [10, 1000, 10_000, 100_000] if quick else [10, 100, 1000, 10_000, 100_000]
    dbl = [10, 1000] if quick else [10, 100, 1000]
    out = [h.Workload(f"Linear {n, i, o}", bugs.Linear, [f"{n}x{i}", f"{o}x{i}", f"({o},)"])
           for n, i, o in lin]
    out += [h.Workload(f"elementwise {n}", bugs.Cube, [f"({n},)"]) for n in elem]
    out += [h.Workload(f"double backward {n}", bugs.Cube, [f"({n},)"], "double_backward")
            for n in dbl]
    return out


def workload_named(name: str) -> h.Workload:
    return next(w for w in workloads(False) if w.name == name)


def speed(workload: h.Workload, quick: bool) -> dict[str, Any]:
    """Interleaved timings of every tool on one workload."""
    n_in, n_out = h.sizes(workload)
    estimate = h.gradcheck_estimate(n_in, n_out)
    slow_seconds = _slow_seconds(workload, n_in, n_out)
    budget = 12.0 if quick else 90.0
    runners = {f"gradtool {m}": (lambda m=m: h.run_gradtool(workload, m))
               for m in ("full", "probe", "auto")}
    runners["gradtool.check (API, auto)"] = lambda: h.run_gradtool_api(workload)
    runners["gradcheck fast"] = lambda: h.run_gradcheck(workload, True)
    skipped = None
    if estimate["memory_bytes"] > SLOW_MEMORY:
        skipped = f"needs ~{estimate['memory_bytes'] / 1e9:.3g} GB for its dense Jacobians"
    elif slow_seconds > budget:
        skipped = f"predicted ~{slow_seconds:.0f} s, above this run's budget of {budget:.0f} s"
    else:
        runners["gradcheck slow"] = lambda: h.run_gradcheck(workload, False)
    repeats = 5 if slow_seconds < 1 or skipped else 3 if slow_seconds < 10 else 1
    if quick:
        repeats = min(repeats, 3 if slow_seconds < 3 or skipped else 1)
    if n_in * n_out > 1e8:  # full mode itself takes seconds here
        repeats = min(repeats, 2)
    runs = h.interleaved(runners, repeats)
    tools = {name: {"median_s": h.median_seconds(rs), "forward": rs[0].forward,
                    "backward": rs[0].backward, "passed": rs[0].ok, "mode": rs[0].mode,
                    "reason": rs[0].reason, "repeats": len(rs)} for name, rs in runs.items()}
    return {"workload": workload.name, "check": workload.check, "n_in": n_in, "n_out": n_out,
            "tools": tools, "gradcheck_slow_skipped": skipped,
            "gradcheck_slow_estimate": {**estimate, "seconds": slow_seconds}}


def _slow_seconds(workload: h.Workload, n_in: int, n_out: int) -> float:
    """Slow mode's time from one timed forward and backward: 2 n_in forwards and n_out
    backwards (each of gradgradcheck's costs a forward and a backward), ~30 µs of its own per
    call, and ~10 ns per dense Jacobian element."""
    _, case = workload.case(0, h.CheckConfig(checks=(workload.check,)))
    args = [a.detach().clone().requires_grad_(True) for a in case.problem.args]
    start = time.perf_counter()
    out = workload.cls.apply(*args)
    forward = time.perf_counter() - start
    start = time.perf_counter()
    torch.autograd.grad(out, args, torch.ones_like(out), create_graph=True)
    backward = time.perf_counter() - start
    per_column = forward + (backward if workload.check == "double_backward" else 0) + 3e-5
    per_row = backward * (2 if workload.check == "double_backward" else 1) + 3e-5
    return 2 * n_in * per_column + n_out * per_row + 1e-8 * n_in * n_out


def detection(quick: bool) -> list[dict[str, Any]]:
    """Does each tool catch each seeded bug (and pass each correct twin)?"""
    cases = [("elementwise", bugs.CUBE_BUGS | {"correct": bugs.Cube}, ["(1000,)"]),
             ("Linear (20, 20, 30)", bugs.LINEAR_BUGS | {"correct": bugs.Linear},
              ["20x20", "30x20", "(30,)"])]
    if not quick:
        cases.insert(1, ("elementwise", bugs.CUBE_BUGS | {"correct": bugs.Cube}, ["(10000,)"]))
    rows = []
    for family, found, inputs in cases:
        for bug, cls in found.items():
            w = h.Workload(f"{family} {inputs[0] if len(inputs) == 1 else ''}".strip(), cls,
                           inputs)
            rows.append(_detect(w, bug, slow=inputs != ["(10000,)"]))
    for key, (good, bad) in bugs.DETACHED.items():
        inputs = ["(1000,)"] if key == "cube" else ["20x20", "30x20", "(30,)"]
        for bug, cls in (("correct", good), ("detached backward", bad)):
            w = h.Workload(f"double backward, {key} {inputs[0]}", cls, inputs, "double_backward")
            rows.append(_detect(w, bug, slow=True))
    return rows


def _detect(w: h.Workload, bug: str, slow: bool) -> dict[str, Any]:
    flagged = {f"gradtool {m}": not h.run_gradtool(w, m).ok for m in ("full", "probe", "auto")}
    flagged["gradcheck fast"] = not h.run_gradcheck(w, True).ok
    if slow:
        flagged["gradcheck slow"] = not h.run_gradcheck(w, False).ok
    return {"workload": w.name, "check": w.check, "bug": bug, "flagged": flagged}


def seed_rates(quick: bool) -> list[dict[str, Any]]:
    """Probe screening over many seeds: detection of seeded bugs, false failures of the twin."""
    from gradtool.numerics.jacobian import prime
    from gradtool.numerics.probe import screen

    seeds = 20 if quick else 100
    rows = []
    for n in (10_000, 100_000):
        for bug, cls in (("one element 1%", bugs.CubeOneElement),
                         ("scale 1.01", bugs.CubeScaled), ("correct", bugs.Cube)):
            w = h.Workload(f"elementwise {n}", cls, [f"({n},)"])
            probe = fast = 0
            for seed in range(seeds):
                config = h.CheckConfig(mode="probe", seed=seed, checks=("gradient",))
                _, case = w.case(seed, config)
                leaves, outs = prime(case.problem)
                probe += bool(screen(case.problem, config, leaves, outs, seed)[1])
                fast += not h.run_gradcheck(w, True, seed).ok
            rows.append({"workload": w.name, "bug": bug, "seeds": seeds,
                         "gradtool probe flagged": probe, "gradcheck fast flagged": fast})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--no-assert", action="store_true", help="exit 0 even if a goal is missed")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path [results/latest.json; results/quick.json with --quick]")
    args = parser.parse_args(argv)
    args.out = args.out or RESULTS / ("quick.json" if args.quick else "latest.json")
    torch.set_num_threads(1)  # shared cores: two threads swung timings 10-60x
    start = time.perf_counter()
    h.run_gradcheck(workloads(True)[0], False)  # gradcheck's first call imports sympy: not timed
    data: dict[str, Any] = {"machine": h.machine(), "quick": args.quick}
    data["speed"] = []
    for w in workloads(args.quick):
        print(f"  timing {w.name} ...", file=sys.stderr, flush=True)
        data["speed"].append(speed(w, args.quick))
    print("  detection ...", file=sys.stderr, flush=True)
    data["detection"] = detection(args.quick)
    data["seed_rates"] = seed_rates(args.quick)
    print("  memory and start-up ...", file=sys.stderr, flush=True)
    mem = ["Linear (64, 64, 64)", "elementwise 10000"]
    mem += [] if args.quick else ["Linear (128, 128, 128)", "elementwise 100000"]
    data["memory"] = {name: {**h.peak_memory(workload_named(name), "full"),
                             "n_in_x_n_out": _product(workload_named(name))} for name in mem}
    data["startup"] = h.cold_start(3 if args.quick else 7)
    data["goals"] = goals(data)
    data["seconds"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, default=str))
    print(markdown(data))
    missed = [g for g in data["goals"] if g["met"] is False]
    return 1 if missed and not args.no_assert else 0


def _product(w: h.Workload) -> int:
    n_in, n_out = h.sizes(w)
    return n_in * n_out


if __name__ == "__main__":
    sys.exit(main())
