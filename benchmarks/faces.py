"""The face checks (forward_ad, vmap, complex) against gradcheck's opt-in flags, side by side."""

#     python benchmarks/faces.py [--quick]
#
# Same Functions and sizes for both tools, one intra-op thread, runs interleaved round by round,
# medians reported with the ratio (gradcheck / gradtool: above 1 means gradtool is faster).
# gradcheck runs with only the flag that matches the face (check_forward_ad with
# check_backward_ad=False; check_batched_grad; complex inputs), in slow (exact) and fast mode.
# Writes benchmarks/results/faces.json and prints a markdown table.

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import faces  # noqa: E402

import gradtool  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def _gradtool(cls: type, inputs: list[str], check: str) -> Callable[[], tuple[bool, float]]:
    """The check's own time (as vs_gradcheck.py times gradtool on a prepared case: gradcheck
    is handed prepared tensors); the whole API call is in the JSON as api_s."""
    def go() -> tuple[bool, float]:
        start = time.perf_counter()
        report = gradtool.check(cls, inputs, checks=(check,))
        API_SECONDS.append(time.perf_counter() - start)
        return report.ok(), sum(c.duration_s for _, _, c in report.checks())
    return go


API_SECONDS: list[float] = []


def _gradcheck(cls: type, args: list[torch.Tensor], fast: bool, **flags: bool
               ) -> Callable[[], bool]:
    def go() -> bool:
        return torch.autograd.gradcheck(cls.apply, args, fast_mode=fast, raise_exception=False,
                                        **flags)
    return go


def workloads(quick: bool) -> list[tuple[str, str, dict[str, Callable[[], bool]]]]:
    sizes = [10, 100, 1000] if quick else [10, 100, 1000, 10_000]
    out = []
    for n in sizes:
        x = torch.randn(n, dtype=torch.float64, requires_grad=True)
        w = torch.randn(n, dtype=torch.float64, requires_grad=True)
        flags = {"check_forward_ad": True, "check_backward_ad": False,
                 "check_undefined_grad": False}
        out.append((f"ScaledSin ({n},)x2", "forward_ad", {
            "gradtool forward_ad": _gradtool(faces.ScaledSin, [f"({n},)", f"({n},)"],
                                             "forward_ad"),
            "gradcheck slow": _gradcheck(faces.ScaledSin, [x, w], False, **flags),
            "gradcheck fast": _gradcheck(faces.ScaledSin, [x, w], True, **flags)}))
    for rows in ([3, 30] if quick else [3, 30, 100]):
        x = torch.randn(rows, 8, dtype=torch.float64, requires_grad=True)
        s = torch.randn(rows, dtype=torch.float64, requires_grad=True)
        out.append((f"RowScale {rows}x8", "vmap", {
            "gradtool vmap": _gradtool(faces.RowScale, [f"{rows}x8", f"({rows},)"], "vmap"),
            "gradcheck slow": _gradcheck(faces.RowScale, [x, s], False, check_batched_grad=True),
            "gradcheck fast": _gradcheck(faces.RowScale, [x, s], True, check_batched_grad=True)}))
    for n in sizes:
        z = torch.randn(n, dtype=torch.complex128, requires_grad=True)
        out.append((f"ComplexSquare ({n},)", "complex", {
            "gradtool complex": _gradtool(faces.ComplexSquare, [f"({n},):complex128"], "complex"),
            "gradcheck slow": _gradcheck(faces.ComplexSquare, [z], False),
            "gradcheck fast": _gradcheck(faces.ComplexSquare, [z], True)}))
    return out


def measure(runners: dict[str, Callable[[], bool]], rounds: int, budget: float
            ) -> dict[str, dict[str, float | bool]]:
    times: dict[str, list[float]] = {k: [] for k in runners}
    ok: dict[str, bool] = {}
    for _ in range(rounds):
        for name, fn in runners.items():
            if sum(times[name]) > budget:
                continue
            start = time.perf_counter()
            result = fn()
            seconds = time.perf_counter() - start
            if isinstance(result, tuple):  # gradtool: (ok, the check's own seconds)
                result, seconds = result
            ok[name] = bool(result)
            times[name].append(seconds)
    out = {k: {"median_s": statistics.median(v), "runs": len(v), "passed": ok[k]}
           for k, v in times.items()}
    if API_SECONDS:
        out["api"] = {"median_s": statistics.median(API_SECONDS), "runs": len(API_SECONDS),
                      "passed": True}
        API_SECONDS.clear()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for _, _, runners in workloads(True)[:1]:  # warm-up: imports, first vmap / forward AD
        measure(runners, 1, 1.0)
    print("| workload | face | gradcheck slow | gradcheck fast | gradtool | vs slow | vs fast "
          "| gradtool API call |\n|---|---|---|---|---|---|---|---|")
    for name, face, runners in workloads(args.quick):
        result = measure(runners, 3 if args.quick else 5, 20.0)
        rows.append({"workload": name, "face": face, "results": result})
        print(_row(rows[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "faces.json").write_text(json.dumps(rows, indent=1))


def _row(row: dict) -> str:
    r = row["results"]
    ours = next(v for k, v in r.items() if k.startswith("gradtool"))
    api = r.get("api", ours)
    slow, fast = r["gradcheck slow"], r["gradcheck fast"]
    return (f"| {row['workload']} | {row['face']} | {slow['median_s'] * 1e3:.1f} ms | "
            f"{fast['median_s'] * 1e3:.1f} ms | {ours['median_s'] * 1e3:.1f} ms | "
            f"{slow['median_s'] / ours['median_s']:.2g}x | "
            f"{fast['median_s'] / ours['median_s']:.2g}x | {api['median_s'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
