"""The cost of --html (error grids + the page) and of --repro's shrinking on failing examples.

    python benchmarks/report_costs.py [--repeats 5]     # writes results/report_costs.json

Each workload is a failing Function of specs/examples (plus larger inputs of one of them, so
the grid's pooling is seen on a 1024 x 1024 block, and a 4096 x 4096 one, too large to
evaluate whole on failure, which gets no grid), gradient check only, in this process with
torch.set_num_threads(1). Rounds interleave the baseline (the check with Block.grid switched
off: what gradtool did before --html) and the check with the grid plus render_html; medians
and their ratio are reported. Shrinking is timed once per workload (it is deterministic) and
compared with one failing check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import gradtool
import gradtool.checks.gradient as gradient
from gradtool.config.settings import CheckConfig
from gradtool.render.html import render_html
from gradtool.run.collect import collect_one
from gradtool.run.shrink import shrink
from gradtool.targets.inputs import parse_input

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "specs" / "examples"
WORKLOADS = [  # (target, inputs)
    ("mul_constant.py:MulConstantUnscaled", ["6x40", "2.5"]),
    ("mul_constant.py:MulConstantUnscaled", ["32x32", "2.5"]),
    ("mul_constant.py:MulConstantUnscaled", ["64x64", "2.5"]),
    ("inputs.py:SphereProject", ["3x4"]),
    ("surrogates.py:RoundSTE", ["3x4"]),
    ("surrogates.py:GradientReversal", ["3x4", "2.5"]),
    ("surrogates.py:ClampSTE", ["3x4"]),
]


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def one_round(target: str, inputs: list[str]) -> dict[str, float]:
    real = gradient.with_grid
    gradient.with_grid = lambda problem, verdict, block, k, config: block  # the baseline
    try:
        base, _ = timed(lambda: gradtool.check(target, inputs, checks=["gradient"]))
    finally:
        gradient.with_grid = real
    spent = [0.0]

    def grid_timed(*args):  # the grid's own cost, measured inside the check
        seconds, block = timed(lambda: real(*args))
        spent[0] += seconds
        return block

    gradient.with_grid = grid_timed
    try:
        check, report = timed(lambda: gradtool.check(target, inputs, checks=["gradient"]))
    finally:
        gradient.with_grid = real
    render, page = timed(lambda: render_html(report))
    assert not report.ok(), f"{target} was expected to fail"
    return {"baseline_s": base, "check_s": check, "grid_s": spent[0], "render_s": render,
            "page_bytes": len(page),
            "json_bytes": len(json.dumps(report.to_dict()))}


def shrink_cost(target: str, inputs: list[str]) -> dict[str, object]:
    config = CheckConfig()
    jobs, _ = collect_one(target, config, [parse_input(i) for i in inputs])
    seconds, shrunk = timed(lambda: shrink(jobs[0], jobs[0].cases[0], "gradient", 40))
    return {"shrink_s": seconds, "checks_run": shrunk.checks_run, "before": shrunk.before,
            "after": shrunk.after, "values": shrunk.values, "kind": shrunk.kind}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, inputs in WORKLOADS:
        target = str(EXAMPLES / name)
        rounds = [one_round(target, inputs) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        med["html_ratio"] = (med["check_s"] + med["render_s"]) / med["baseline_s"]
        med["html_share"] = (med["grid_s"] + med["render_s"]) / med["check_s"]
        cost = shrink_cost(target, inputs)
        cost["shrink_ratio"] = cost["shrink_s"] / med["check_s"]
        rows.append({"target": name, "inputs": inputs, **med, **cost})
        print(f"{name} {' '.join(inputs)}: baseline {med['baseline_s'] * 1e3:.1f} ms, "
              f"with grid + page {(med['check_s'] + med['render_s']) * 1e3:.1f} ms "
              f"({med['html_ratio']:.2f}x; grid {med['grid_s'] * 1e3:.2f} ms + page "
              f"{med['render_s'] * 1e3:.2f} ms = {100 * med['html_share']:.1f}% of the check), page {med['page_bytes'] / 1024:.1f} KB; shrink "
              f"{cost['before']} -> {cost['after']} in {cost['checks_run']} checks, "
              f"{cost['shrink_s'] * 1e3:.0f} ms ({cost['shrink_ratio']:.1f}x one check)")
    load = os.getloadavg()
    out = {"rows": rows, "load_average": load, "torch": torch.__version__,
           "repeats": args.repeats}
    (HERE / "results" / "report_costs.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
