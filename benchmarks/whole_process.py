"""Whole processes side by side: `gradtool check --mode full` against a gradcheck script."""

# Each workload is run as a user runs it: a fresh `gradtool check` (supervisor and isolated
# worker included) and a fresh Python process that imports torch and calls gradcheck (slow
# mode; with gradgradcheck where gradtool's default checks include double backward), on
# tensors of the same shapes, interleaved round by round, one intra-op thread. Wall time and
# the CPU time of the process tree (user + sys) are both reported, with and without the cost
# of `python -c "import torch"` (measured in the same rounds).
#
#   python benchmarks/whole_process.py [--repeats 3] [--quick]

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from coldstart import environment  # noqa: E402

BUGS = "tests/fixtures/bugs.py"
# name -> (Function, gradtool -i flags, tensor shapes, gradtool checks, gradgradcheck too)
WORKLOADS = {
    "Linear 20/20/30, gradient": ("Linear", ["20x20", "30x20", "(30,)"],
                                  [(20, 20), (30, 20), (30,)], "gradient", False),
    "Linear 20/20/30, default checks": ("Linear", ["20x20", "30x20", "(30,)"],
                                        [(20, 20), (30, 20), (30,)], None, True),
    "Linear 64, gradient": ("Linear", ["64x64", "64x64", "(64,)"],
                            [(64, 64), (64, 64), (64,)], "gradient", False),
    "elementwise 1e4, gradient": ("Cube", ["(10000,)"], [(10000,)], "gradient", False),
}
QUICK = ("Linear 20/20/30, gradient", "Linear 20/20/30, default checks")

GRADCHECK = """
import sys, torch
sys.path.insert(0, "tests/fixtures")
import bugs
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
shapes, double = {shapes!r}, {double!r}
xs = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_(True) for s in shapes]
fn = bugs.{cls}.apply
ok = torch.autograd.gradcheck(fn, xs)
if double:
    ok = torch.autograd.gradgradcheck(fn, xs) and ok
sys.exit(0 if ok else 1)
"""


def commands(name: str) -> dict[str, list[str]]:
    cls, flags, shapes, check, double = WORKLOADS[name]
    gradtool = [sys.executable, "-m", "gradtool", "check", f"{BUGS}:{cls}", "--mode", "full",
                "--quiet"]
    for flag in flags:
        gradtool += ["-i", flag]
    if check:
        gradtool += ["--check", check]
    code = GRADCHECK.format(shapes=shapes, double=double, cls=cls)
    return {"gradtool": gradtool, "gradcheck": [sys.executable, "-c", code]}


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU of the process tree) of one fresh process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{command[:5]} exit {done.returncode}: {done.stdout[-800:]}"
                         f"{done.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(names: list[str], repeats: int) -> dict:
    env = environment()
    baseline = [sys.executable, "-c", "import torch"]
    # gradtool's worker leaves by os._exit, skipping torch's tear-down (~0.5 s CPU), which the
    # gradcheck script pays like `import torch`: each tool's net is against its own baseline
    quick_exit = [sys.executable, "-c", "import os, torch; os._exit(0)"]
    timed(baseline, env)  # fills the bytecode cache
    rows = {}
    for name in names:
        cmds = {**commands(name), "import torch": baseline,
                "import torch; os._exit": quick_exit}
        runs: dict[str, list[tuple[float, float]]] = {tool: [] for tool in cmds}
        for r in range(repeats):
            order = list(cmds) if r % 2 == 0 else list(cmds)[::-1]
            for tool in order:
                runs[tool].append(timed(cmds[tool], env))
            print(f"{name}: round {r + 1}: " + ", ".join(
                f"{t} {runs[t][-1][0]:.2f} s" for t in cmds), file=sys.stderr, flush=True)
        rows[name] = {tool: {"wall": statistics.median(w for w, _ in rs),
                             "cpu": statistics.median(c for _, c in rs)}
                      for tool, rs in runs.items()}
    return rows


def table(data: dict) -> str:
    load = ", ".join(f"{x:.1f}" for x in data["load_before"])
    lines = [f"Load average at the start: {load}; at the end: "
             f"{', '.join(f'{x:.1f}' for x in data['load_after'])} (2 cores).", "",
             "| workload | `import torch` / with os._exit | gradcheck | gradtool | speed-up | "
             "gradcheck − import | gradtool − import (os._exit) | speed-up, import subtracted |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in data["rows"].items():
        for kind in ("wall", "cpu"):
            base, gc, gt = (r[t][kind] for t in ("import torch", "gradcheck", "gradtool"))
            # gradtool's worker skips the interpreter's tear-down (os._exit): its baseline is
            # `import torch; os._exit(0)` where this run measured it
            separate = data.get("quick_exit_measured_separately", {}).get(kind, base)
            quick = r.get("import torch; os._exit", {}).get(kind, separate)
            net = f"{(gc - base) / (gt - quick):.1f}×" if gt - quick > 0.02 else \
                "— (gradtool at or below its baseline)"
            lines.append(f"| {name} ({kind}) | {base:.2f} / {quick:.2f} s | {gc:.2f} s | "
                         f"{gt:.2f} s | {gc / gt:.2f}× | {gc - base:+.2f} s | {gt - quick:+.2f} s "
                         f"| {net} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="Linear 20/20/30 only")
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "whole_process.json")
    parser.add_argument("--table", action="store_true", help="reprint the saved table")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    names = list(QUICK if args.quick else WORKLOADS)
    if args.only:
        names = args.only.split(",")
    data = {"load_before": os.getloadavg()}
    data["rows"] = measure(names, args.repeats)
    data["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(data, indent=1))
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
