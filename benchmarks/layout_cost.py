"""What the layout check adds to the default run: time and calls, with and without it."""

#     python benchmarks/layout_cost.py [--rounds 5]
#
# The bundled benchmark workloads (vs_gradcheck.py's first-order Linear and elementwise sizes)
# and the bundled specs (specs/), each checked with the default checks and with the same checks
# minus `layout`, interleaved round by round (order alternating), one intra-op thread; medians
# and the ratio (default / without layout) are printed, with the layout check's own share of the
# default run's time (its perf_counter duration over the run's, measured within the same run, so
# robust to load between runs) and its forward and backward evaluations beside the whole run's.
# Writes benchmarks/results/layout_cost.json.

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import bugs  # noqa: E402

import gradtool  # noqa: E402
from gradtool.config.registry import DEFAULT_CHECKS  # noqa: E402
from gradtool.config.settings import CheckConfig  # noqa: E402
from gradtool.run.collect import collect_specs  # noqa: E402
from gradtool.run.runner import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WITHOUT = tuple(c for c in DEFAULT_CHECKS if c != "layout")


def workloads() -> list[tuple[str, object, list[str]]]:
    lin = [(4, 4, 4), (20, 20, 30), (64, 64, 64)]
    out = [(f"Linear {n, i, o}", bugs.Linear, [f"{n}x{i}", f"{o}x{i}", f"({o},)"])
           for n, i, o in lin]
    out += [(f"elementwise {n}", bugs.Cube, [f"({n},)"]) for n in (10, 100, 1000, 10_000,
                                                                  100_000)]
    return out


def one(workload, checks) -> tuple[float, float, dict[str, int], dict[str, int]]:
    """(seconds, layout's seconds, calls of the whole run, calls of the layout check)."""
    name, target, inputs = workload
    start = time.perf_counter()
    if target is None:
        config = CheckConfig(checks=checks)
        jobs, _ = collect_specs(str(ROOT / "specs"), config)
        report = run(jobs, config)
    else:
        report = gradtool.check(target, inputs, checks=checks)
    seconds = time.perf_counter() - start
    total: dict[str, int] = {}
    layout: dict[str, int] = {}
    layout_s = sum(k.duration_s for _, _, k in report.checks() if k.name == "layout")
    for _, _, check in report.checks():
        for key, value in check.calls.items():
            total[key] = total.get(key, 0) + value
            if check.name == "layout":
                layout[key] = layout.get(key, 0) + value
    return seconds, layout_s, total, layout


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for workload in [*workloads(), ("bundled specs (specs/)", None, [])]:
        one(workload, DEFAULT_CHECKS)  # warm: imports, first-call caches
        with_t, without_t, shares = [], [], []
        for k in range(args.rounds):
            order = [(DEFAULT_CHECKS, with_t), (WITHOUT, without_t)]
            for checks, sink in (order if k % 2 == 0 else order[::-1]):
                seconds, layout_s, total, layout = one(workload, checks)
                sink.append(seconds)
                if checks == DEFAULT_CHECKS:
                    calls, layout_calls = total, layout
                    shares.append(layout_s / (seconds - layout_s))
        row = {"workload": workload[0], "default_s": statistics.median(with_t),
               "without_layout_s": statistics.median(without_t), "calls": calls,
               "layout_calls": layout_calls, "layout_share": statistics.median(shares)}
        row["ratio"] = row["default_s"] / row["without_layout_s"]
        rows.append(row)
        print(f"| {row['workload']} | {row['without_layout_s'] * 1e3:.1f} ms | "
              f"{row['default_s'] * 1e3:.1f} ms | {row['ratio']:.3f} | "
              f"+{row['layout_share'] * 100:.1f} % | "
              f"{_calls(layout_calls)} of {_calls(calls)} |", flush=True)
    out = ROOT / "benchmarks" / "results" / "layout_cost.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _calls(calls: dict[str, int]) -> str:
    return f"{calls.get('forward', 0)} fwd + {calls.get('backward', 0)} bwd"


if __name__ == "__main__":
    sys.exit(main())
