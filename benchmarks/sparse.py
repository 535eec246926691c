"""Sparse Functions with hand-written backward (tests/fixtures/sparse_functions.py): every default
gradtool check against gradcheck(masked=True) on the same sparse tensors, correct and seeded."""

#     python benchmarks/sparse.py [--repeats 7] [--quick] [--json results/sparse.json]
#
# SparseMatmul (Y = A @ B + B) and SparseSolve (X = T⁻¹ B), each correct and with three seeded
# bugs (a factor, a transposed operand, a dropped term), on operands(layout, n): a sparse n x n
# lower-triangular A (COO and CSR) and a dense n x 3 B. Each row: one warm-up of both tools, then
# the whole `gradtool.check(cls, [a, b], masked=True)` (every default check) and
# `torch.autograd.gradcheck(cls.apply, (a, b), masked=True)` on the same tensors, interleaved
# round by round (order rotated), one torch thread, medians. gradcheck alone, not
# gradgradcheck: gradtool skips double backward on sparse inputs (it says so), so gradcheck's
# second order is not run either. gradcheck runs with check_undefined_grad=False: its
# undefined-gradient test calls `eq` on the sparse gradient, which torch has no sparse kernel
# for (it raises NotImplementedError on every row otherwise). Evaluations are counted at the
# Function for both tools (deterministic, unlike wall time on a shared machine, whose load is
# printed at the start and the end). Verdicts are checked: a correct Function passes, a seeded
# one fails under gradient.* with its diagnosis on the input that carries the bug.
#
# Whole processes too, as a user runs a check script: for each n, one fresh Python process runs
# every row once with gradtool (`gradtool.check`, every default check) and another with
# gradcheck, interleaved with `python -c "import torch"` round by round (--rounds, 5), each
# checking its verdicts (exit 1 on a wrong one); wall and CPU medians, and their ratio.

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.autograd import gradcheck

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures"))

import harness as h  # noqa: E402
import sparse_functions as fx  # noqa: E402

# family -> bug -> (Function, the rule its diagnosis must carry, the input the bug is on)
FAMILIES: dict[str, dict[str, tuple[type, str | None, str | None]]] = {
    "SparseMatmul": {"correct": (fx.SparseMatmul, None, None),
                     "factor": (fx.FactorMatmul, "gradient.factor", "b"),
                     "transposed": (fx.TransposedMatmul, "gradient.transposed", "b"),
                     "dropped": (fx.DroppedMatmul, "gradient.mismatch", "b")},
    "SparseSolve": {"correct": (fx.SparseSolve, None, None),
                    "factor": (fx.FactorSolve, "gradient.factor", "b"),
                    "transposed": (fx.TransposedSolve, "gradient.transposed", "b"),
                    "dropped": (fx.DroppedSolve, "gradient.mismatch", "t")},
}
LAYOUTS = {"COO": torch.sparse_coo, "CSR": torch.sparse_csr}


def gradtool_run(cls: type, a: torch.Tensor, b: torch.Tensor) -> tuple[h.Run, Any]:
    """The whole library call a user makes, every default check."""
    import gradtool

    start = time.perf_counter()
    report = gradtool.check(cls, [a, b], masked=True)
    seconds = time.perf_counter() - start
    return h.Run(seconds, 0, 0, report.ok()), report


def gradcheck_run(cls: type, a: torch.Tensor, b: torch.Tensor) -> h.Run:
    start = time.perf_counter()
    ok = gradcheck(cls.apply, (a, b), masked=True, check_undefined_grad=False,
                   raise_exception=False)
    return h.Run(time.perf_counter() - start, 0, 0, bool(ok))


def verdict(report: Any, rule: str | None, where: str | None) -> tuple[str, bool]:
    """What gradtool said, and whether it is the truth about the Function."""
    checks = {c.name: c for _, _, c in report.checks()}
    failed = [n for n, c in checks.items() if c.outcome.value not in ("passed", "skipped")]
    if rule is None:
        return ("pass" if report.ok() else "FAIL " + ", ".join(failed)), report.ok()
    gradient = checks["gradient"]
    rules = sorted({f.rule for f in gradient.findings})
    on = sorted({blk.input for blk in gradient.blocks if blk.mismatched})
    right = failed == ["gradient"] and rule in rules and on == [where]
    return f"FAIL {'/'.join(rules)} on {','.join(on)}", right


def counted_evaluations(cls: type, a: torch.Tensor, b: torch.Tensor) -> tuple[str, str]:
    """Forward/backward calls of each tool, counted at the Function (one more run each)."""
    ours: Counter = Counter()
    gradtool_run(h.counting(cls, ours), a, b)
    theirs: Counter = Counter()
    gradcheck_run(h.counting(cls, theirs), a, b)
    return (f"{ours['forward']}/{ours['backward']}", f"{theirs['forward']}/{theirs['backward']}")


def row(family: str, bug: str, layout: str, n: int, repeats: int) -> dict[str, Any]:
    cls, rule, where = FAMILIES[family][bug]
    a, b = fx.operands(LAYOUTS[layout], n)
    gradtool_run(cls, a, b), gradcheck_run(cls, a, b)  # warm-up: first calls, caches
    reports: list[Any] = []

    def ours() -> h.Run:
        run, report = gradtool_run(cls, a, b)
        reports.append(report)
        return run

    runs = h.interleaved({"gradtool": ours, "gradcheck": lambda: gradcheck_run(cls, a, b)},
                         repeats)
    said, right = verdict(reports[-1], rule, where)
    gradient = statistics.median(next(c.duration_s for _, _, c in r.checks()
                                      if c.name == "gradient") for r in reports)
    theirs_ok = runs["gradcheck"][-1].ok
    return {"family": family, "bug": bug, "layout": layout, "n": n,
            "gradtool": h.median_seconds(runs["gradtool"]), "gradient": gradient,
            "gradcheck": h.median_seconds(runs["gradcheck"]), "said": said, "right": right,
            "gradcheck_ok": theirs_ok, "gradcheck_right": theirs_ok == (rule is None),
            "evaluations": counted_evaluations(cls, a, b)}


HEADER = ("| Function | bug | layout | n | gradtool, every default check | gradient check alone "
          "| gradcheck(masked=True) | ratio | gradient alone / gradcheck | gradtool said "
          "| gradcheck said | evaluations fwd/bwd gradtool · gradcheck |")


def line(r: dict[str, Any]) -> str:
    wrong = "" if r["right"] else " **WRONG**"
    fwd, gc = r["evaluations"]
    return (f"| {r['family']} | {r['bug']} | {r['layout']} | {r['n']} | "
            f"{r['gradtool'] * 1e3:.1f} ms | {r['gradient'] * 1e3:.1f} ms | "
            f"{r['gradcheck'] * 1e3:.1f} ms | {r['gradtool'] / r['gradcheck']:.2f}× | "
            f"{r['gradient'] / r['gradcheck']:.2f}× | {r['said']}{wrong} | "
            f"{'pass' if r['gradcheck_ok'] else 'FAIL'} | {fwd} · {gc} |")


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Sums of medians per kind and size: gradtool's time over gradcheck's."""
    lines = [("| rows | n | gradtool | gradient check alone | gradcheck | ratio "
              "| gradient alone / gradcheck |"), "|---" * 7 + "|"]
    for kind in ("correct", "seeded"):
        for n in sorted({r["n"] for r in rows}):
            chosen = [r for r in rows if r["n"] == n and (r["bug"] == "correct") ==
                      (kind == "correct")]
            ours, grad, theirs = (sum(r[k] for r in chosen)
                                  for k in ("gradtool", "gradient", "gradcheck"))
            lines.append(f"| {kind} ({len(chosen)}) | {n} | {ours * 1e3:.0f} ms | "
                         f"{grad * 1e3:.0f} ms | {theirs * 1e3:.0f} ms | {ours / theirs:.2f}× | "
                         f"{grad / theirs:.2f}× |")
    return lines


def load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def child(tool: str, n: int) -> int:
    """Every row once with one tool, in this fresh process; 1 when a verdict is wrong."""
    wrong = 0
    for bugs in FAMILIES.values():
        for cls, rule, where in bugs.values():
            for layout in LAYOUTS.values():
                a, b = fx.operands(layout, n)
                if tool == "gradtool":
                    _, report = gradtool_run(cls, a, b)
                    right = verdict(report, rule, where)[1]
                else:
                    right = gradcheck_run(cls, a, b).ok == (rule is None)
                wrong += not right
    return 1 if wrong else 0


def whole(sizes: tuple[int, ...], rounds: int) -> list[str]:
    """Fresh processes side by side, per n: the table's lines."""
    from coldstart import environment
    from whole_process import timed

    env = {**environment(), "PYTHONWARNINGS": "ignore"}
    here = [sys.executable, str(Path(__file__).resolve())]
    head = ("| n | `import torch` | gradcheck, every row | gradtool, every row | wall ratio "
            "| CPU ratio | gradtool − import / gradcheck − import (wall) |")
    lines = [head, "|---" * 7 + "|"]
    for n in sizes:
        cmds = {"import torch": [sys.executable, "-c", "import torch"],
                "gradcheck": [*here, "--child", "gradcheck", str(n)],
                "gradtool": [*here, "--child", "gradtool", str(n)]}
        for command in cmds.values():  # a warm-up each: the bytecode cache of what it imports
            timed(command, env)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for r in range(rounds):
            for k in (list(cmds) if r % 2 == 0 else list(cmds)[::-1]):
                runs[k].append(timed(cmds[k], env))
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        base = wall["import torch"]
        lines.append(f"| {n} | {base:.2f} s | {wall['gradcheck']:.2f} s | "
                     f"{wall['gradtool']:.2f} s | {wall['gradtool'] / wall['gradcheck']:.2f}× | "
                     f"{cpu['gradtool'] / cpu['gradcheck']:.2f}× | "
                     f"{(wall['gradtool'] - base) / (wall['gradcheck'] - base):.2f}× |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="n = 4 and 12, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5, help="whole-process rounds (0: none)")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None,
                        help="write the rows here (default results/sparse.json, not --quick)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        return child(args.child[0], int(args.child[1]))
    sizes = (4, 12) if args.quick else (4, 12, 32)
    repeats = 3 if args.quick else args.repeats
    print(f"torch {torch.__version__}, one thread, {repeats} interleaved round(s) after a "
          f"warm-up; load average at the start {load()}\n")
    print(HEADER)
    print("|---" * 12 + "|")
    rows = []
    for n in sizes:
        for family, bugs in FAMILIES.items():
            for bug in bugs:
                for layout in LAYOUTS:
                    rows.append(row(family, bug, layout, n, repeats))
                    print(line(rows[-1]), flush=True)
    print(f"\nload average at the end {load()}\n")
    print("\n".join(summary(rows)))
    wrong = [r for r in rows if not r["right"] or not r["gradcheck_right"]]
    print(f"\nverdicts: {len(rows) - len(wrong)} of {len(rows)} rows right for both tools"
          + "".join(f"\n  wrong: {r['family']} {r['bug']} {r['layout']} n={r['n']}: "
                    f"{r['said']}, gradcheck {r['gradcheck_ok']}" for r in wrong))
    if args.rounds and not args.quick:
        print(f"\nWhole processes, {args.rounds} interleaved rounds (load {load()}):\n")
        print("\n".join(whole(sizes, args.rounds)))
    out = args.json or (None if args.quick else HERE / "results" / "sparse.json")
    if out is not None:
        out.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
