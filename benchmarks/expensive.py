"""Expensive, non-vmappable Functions: gradtool's checks against gradcheck slow + gradgradcheck."""

#     python benchmarks/expensive.py [--repeats 3]
#
# Each Function of tests/fixtures/expensive.py (an ODE loop, a fixed-point solver, a sort-based
# projection; correct and broken) is checked by gradtool (gradient + double_backward, auto mode;
# and every default check as one library call, as `gradtool check` runs it) and by gradcheck
# slow + gradgradcheck slow on the same tensors, interleaved, one thread; medians of the repeats
# and forward/backward evaluations (gradcheck's counted at the Function).

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import expensive  # noqa: E402
import harness as h  # noqa: E402

INPUTS = {"ODE (RK4 loop)": ["(8,)", "(8,)"], "fixed point": ["(12,)"],
          "simplex projection": ["(12,)"]}


def row(family: str, bug: str, cls: type, repeats: int) -> dict:
    """Both checks of both tools on one Function: seconds (median), evaluations, verdicts."""
    work = {c: h.Workload(f"{family} {bug}", cls, INPUTS[family], c)
            for c in ("gradient", "double_backward")}
    runners = {f"gradtool {c}": (lambda w=w: h.run_gradtool(w, "auto")) for c, w in work.items()}
    runners.update({f"gradcheck {c}": (lambda w=w: h.run_gradcheck(w, False))
                    for c, w in work.items()})
    runners["gradtool all"] = lambda: all_checks(cls, INPUTS[family])
    runs = h.interleaved(runners, repeats)
    out = {name: (statistics.median(r.seconds for r in rs), rs[0].forward, rs[0].backward,
                  rs[0].ok, rs[0].mode) for name, rs in runs.items()}
    return {"family": family, "bug": bug, **out}


def all_checks(cls: type, inputs: list[str]) -> h.Run:
    """Every default check, the whole library call (introspection and sampling included)."""
    import time

    import gradtool

    start = time.perf_counter()
    report = gradtool.check(cls, inputs, mode="auto")
    seconds = time.perf_counter() - start
    checks = [c for _, _, c in report.checks()]
    return h.Run(seconds, sum(c.calls.get("forward", 0) for c in checks),
                 sum(c.calls.get("backward", 0) for c in checks),
                 all(c.outcome.value in ("passed", "skipped") for c in checks), "auto")


def mark(run: tuple) -> str:
    return "pass" if run[3] else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| Function | bug | gradtool grad | gradcheck slow | gradtool 2nd | gradgradcheck slow "
          "| ratio (grad + 2nd) | gradtool, all default checks | ratio (all) "
          "| fwd/bwd gradtool (grad; 2nd) | fwd/bwd gradcheck (grad; 2nd) |")
    print("|---" * 11 + "|")
    totals = [0.0, 0.0]
    sums = {kind: [0.0, 0.0, 0.0] for kind in ("correct", "broken")}  # 2 checks, all, gradcheck
    for family, funcs in expensive.FAMILIES.items():
        for bug, cls in funcs.items():
            r = row(family, bug, cls, args.repeats)
            tg, cg = r["gradtool gradient"], r["gradcheck gradient"]
            t2, c2 = r["gradtool double_backward"], r["gradcheck double_backward"]
            ours, theirs, every = tg[0] + t2[0], cg[0] + c2[0], r["gradtool all"]
            totals[0] += ours
            totals[1] += theirs
            for k, value in enumerate((ours, every[0], theirs)):
                sums["correct" if bug == "correct" else "broken"][k] += value
            print(f"| {family} | {bug} | {tg[0] * 1e3:.1f} ms {mark(tg)} ({tg[4]}) | "
                  f"{cg[0] * 1e3:.1f} ms {mark(cg)} | {t2[0] * 1e3:.1f} ms {mark(t2)} ({t2[4]}) | "
                  f"{c2[0] * 1e3:.1f} ms {mark(c2)} | {ours / theirs:.2f}× | "
                  f"{every[0] * 1e3:.1f} ms {mark(every)} | {every[0] / theirs:.2f}× | "
                  f"{tg[1]}/{tg[2]}; {t2[1]}/{t2[2]} | {cg[1]}/{cg[2]}; {c2[1]}/{c2[2]} |",
                  flush=True)
    print(f"\ntotal: gradtool {totals[0]:.2f} s, gradcheck slow + gradgradcheck slow "
          f"{totals[1]:.2f} s, ratio {totals[0] / totals[1]:.2f}")
    for kind, (two, every, theirs) in sums.items():
        print(f"{kind}: gradient + double_backward {two / theirs:.2f}×, all default checks "
              f"{every / theirs:.2f}× gradcheck slow + gradgradcheck slow ({theirs:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
