"""Expensive, non-vmappable Functions: every default gradtool check against gradcheck slow +
gradgradcheck slow, wall time and evaluations, passing and failing rows apart."""

#     python benchmarks/expensive.py [--repeats 3] [--quick] [--family NAME ...]
#
# The Functions of tests/fixtures/expensive.py: an ODE loop, a fixed-point solver and a
# sort-based projection whose backward recomputes forward with autograd, and four whose
# backward is written by hand as people write them (an adjoint ODE integration, conjugate
# gradients with shifts and its adjoint solve, a Broyden root finder differentiated by the
# implicit function theorem, a scan over time steps), each correct and with seeded bugs. Each
# row: the whole `gradtool.check` call a user makes (every default check, introspection and
# sampling included) and gradcheck + gradgradcheck slow mode on the same tensors, interleaved
# round by round, one torch thread, medians. Evaluations are counted at the Function for both
# tools (forward calls / backward calls): deterministic, unlike wall time on a shared machine,
# whose load is printed at the start and the end. Beside the totals: each check's evaluations as
# its report says them (paid fwd/bwd, and what it read from the case's ledger, paid by an
# earlier check: numerics/ledger.py), and gradcheck alone (the drop-in's yardstick: the first
# of the two timed calls, counted and timed apart).

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import gradcheck, gradgradcheck

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import expensive  # noqa: E402
import harness as h  # noqa: E402

INPUTS = {"ODE (RK4 loop)": ["(8,)", "(8,)"], "fixed point": ["(12,)"],
          "simplex projection": ["(12,)"], "adjoint ODE (RK4)": ["(6,)", "(6,)"],
          "shifted CG solve": ["5x5", "(5,)"], "Broyden root": ["(8,)", "8x8:[-0.15,0.15]"],
          "scan recurrence": ["8x5", "(5,)", "5x5:[-0.4,0.4]"]}
FAMILIES = {**expensive.FAMILIES, **expensive.HANDWRITTEN}


MODE = ["auto"]  # --mode: auto (the default a user gets) or full (counts free of timing)


def gradtool_all(cls: type, inputs: list[str]) -> tuple[h.Run, Counter, list[str]]:
    """Every default check, the whole library call; evaluations counted at the Function."""
    import gradtool

    counter: Counter = Counter()
    counted = h.counting(cls, counter)
    start = time.perf_counter()
    report = gradtool.check(counted, inputs, mode=MODE[0])
    seconds = time.perf_counter() - start
    checks = [c for _, _, c in report.checks()]
    failed = [c.name for c in checks if c.outcome.value not in ("passed", "skipped")]
    PER_CHECK[cls] = h.per_check(report)
    return h.Run(seconds, counter["forward"], counter["backward"], not failed), counter, failed


PER_CHECK: dict[type, str] = {}  # the last run's evaluations per check, by Function
ALONE: dict[type, h.Run] = {}    # gradcheck alone (the first of gradcheck_both's two calls)


def gradcheck_both(cls: type, inputs: list[str]) -> h.Run:
    """gradcheck slow then gradgradcheck slow on the tensors gradtool samples (seed 0)."""
    from gradtool.config.settings import CheckConfig

    _, case = h.Workload(cls.__name__, cls, inputs).case(0, CheckConfig())
    args = tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a
                 for a in case.problem.args)
    counter: Counter = Counter()
    fn = h.counting(cls, counter).apply
    start = time.perf_counter()
    ok = []
    for check in (gradcheck, gradgradcheck):
        try:
            ok.append(bool(check(fn, args, fast_mode=False, raise_exception=False)))
        except Exception:  # noqa: BLE001 - a backward gradgradcheck cannot differentiate
            ok.append(False)
        if check is gradcheck:
            ALONE[cls] = h.Run(time.perf_counter() - start, counter["forward"],
                               counter["backward"], ok[0])
    return h.Run(time.perf_counter() - start, counter["forward"], counter["backward"], all(ok))


def row(family: str, bug: str, cls: type, repeats: int) -> dict:
    inputs = INPUTS[family]
    failed: list[str] = []

    def ours() -> h.Run:
        run, _, names = gradtool_all(cls, inputs)
        failed[:] = names
        return run

    runs = h.interleaved({"gradtool": ours, "gradcheck": lambda: gradcheck_both(cls, inputs)},
                         repeats)
    out = {name: (statistics.median(r.seconds for r in rs), rs[0]) for name, rs in runs.items()}
    return {"family": family, "bug": bug, "failed": list(failed), **out,
            "alone": ALONE[cls], "per_check": PER_CHECK[cls]}


def load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def table(rows: list[dict]) -> list[str]:
    lines = ["| Function | bug | gradtool, every default check | gradcheck + gradgradcheck slow "
             "| ratio | evaluations gradtool (fwd/bwd) | evaluations gradcheck + gg (fwd/bwd) "
             "| gradcheck alone (fwd/bwd, time) | gradtool per check (paid, +read) |",
             "|---" * 9 + "|"]
    for r in rows:
        (ts, t), (gs, g), a = r["gradtool"], r["gradcheck"], r["alone"]
        verdict = "pass" if t.ok else "FAIL " + ", ".join(r["failed"])
        more = " **more**" if (t.forward + t.backward > g.forward + g.backward) else ""
        lines.append(f"| {r['family']} | {r['bug']} | {ts * 1e3:.1f} ms {verdict} | "
                     f"{gs * 1e3:.1f} ms {'pass' if g.ok else 'FAIL'} | {ts / gs:.2f}× | "
                     f"{t.forward}/{t.backward}{more} | {g.forward}/{g.backward} | "
                     f"{a.forward}/{a.backward}, {a.seconds * 1e3:.1f} ms | {r['per_check']} |")
    return lines


def summary(rows: list[dict]) -> list[str]:
    lines = []
    for kind, pick in (("passing (correct)", lambda r: r["bug"] == "correct"),
                       ("failing (seeded bugs)", lambda r: r["bug"] != "correct")):
        chosen = [r for r in rows if pick(r)]
        if not chosen:
            continue
        ours = sum(r["gradtool"][0] for r in chosen)
        theirs = sum(r["gradcheck"][0] for r in chosen)
        worst = max(chosen, key=lambda r: r["gradtool"][0] / r["gradcheck"][0])
        evals = [sum((r[k][1].forward + r[k][1].backward) for r in chosen)
                 for k in ("gradtool", "gradcheck")]
        over = [f"{r['family']} {r['bug']}" for r in chosen
                if r["gradtool"][1].forward + r["gradtool"][1].backward
                > r["gradcheck"][1].forward + r["gradcheck"][1].backward]
        lines.append(f"{kind}: {len(chosen)} rows, wall {ours:.2f} s against {theirs:.2f} s "
                     f"= {ours / theirs:.2f}× (worst row {worst['family']} {worst['bug']} "
                     f"{worst['gradtool'][0] / worst['gradcheck'][0]:.2f}×); evaluations "
                     f"{evals[0]} against {evals[1]}; rows with more evaluations than gradcheck "
                     f"+ gradgradcheck: {', '.join(over) if over else 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="one round, the hand-written families only")
    parser.add_argument("--family", action="append", choices=list(FAMILIES),
                        help="only these families (repeatable)")
    parser.add_argument("--mode", choices=("auto", "full"), default="auto",
                        help="gradtool's mode (auto chooses by timing: under load a check may "
                             "go to probe mode; full: counts that do not depend on the load)")
    args = parser.parse_args(argv)
    MODE[0] = args.mode
    torch.set_num_threads(1)
    families = args.family or (list(expensive.HANDWRITTEN) if args.quick else list(FAMILIES))
    repeats = 1 if args.quick else args.repeats
    print(f"torch {torch.__version__}, one thread, gradtool --mode {args.mode}, {repeats} "
          f"interleaved round(s); "
          f"at the start: {load()}")
    rows = []
    for family in families:
        for bug, cls in FAMILIES[family].items():
            rows.append(row(family, bug, cls, repeats))
            print(table(rows[-1:])[-1], flush=True)
    print(f"\nat the end: {load()}\n")
    print("\n".join(table(rows)))
    print()
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
