"""gradtool's op checks against torch.library.opcheck + gradcheck + gradgradcheck on the same
custom ops (tests/fixtures/custom_ops.py: a correct op and its broken twins): time and findings
side by side, interleaved, medians, one intra-op thread.

    python benchmarks/ops_vs_opcheck.py [--repeat 3] [--json benchmarks/results/ops.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import gradtool

ROOT = Path(__file__).resolve().parents[1]
OPS = ["scale_mul", "scale_mul_bad_grad", "row_sum_bad_fake", "col_sum_fixed_fake",
       "exp_inplace_undeclared", "sin_no_autograd", "flatten_view", "identity_alias"]
INPUTS = {"scale_mul": 2, "scale_mul_bad_grad": 2}  # tensors taken (the rest: one)
GRADTOOL_CHECKS = ["contract", "gradient", "double_backward", "op_schema", "op_fake",
                   "op_autograd"]


def load_ops():
    spec = importlib.util.spec_from_file_location("bench_custom_ops",
                                                  ROOT / "tests/fixtures/custom_ops.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_custom_ops"] = module
    spec.loader.exec_module(module)
    return module


def op_of(module, name: str):
    return getattr(module, name, None) or getattr(torch.ops.gt_ops_test, name).default


def make_args(name: str) -> tuple:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
                 for _ in range(INPUTS.get(name, 1)))


def baseline(op, name: str, compiled: bool) -> tuple[float, list[str]]:
    """opcheck (its default tests, or without the aot one) + gradcheck + gradgradcheck."""
    utils = ["test_schema", "test_autograd_registration", "test_faketensor"]
    utils += ["test_aot_dispatch_dynamic"] if compiled else []
    found = []
    start = time.perf_counter()
    result = torch.library.opcheck(op, make_args(name), test_utils=utils, raise_exception=False)
    found += [k.removeprefix("test_") for k, v in result.items() if v != "SUCCESS"]
    for label, fn in (("gradcheck", torch.autograd.gradcheck),
                      ("gradgradcheck", torch.autograd.gradgradcheck)):
        try:
            if not fn(op, make_args(name), raise_exception=False):
                found.append(label)
        except Exception as exc:  # noqa: BLE001 - what a user of these tools would see
            found.append(f"{label} raised {type(exc).__name__}")
    return time.perf_counter() - start, found


def ours(op, name: str, compiled: bool) -> tuple[float, list[str]]:
    checks = GRADTOOL_CHECKS + (["op_compiled"] if compiled else [])
    start = time.perf_counter()
    report = gradtool.check(op, ["3x4"] * INPUTS.get(name, 1), checks=checks)
    elapsed = time.perf_counter() - start
    found = []
    for _, _, check in report.checks():
        if check.outcome.value in ("failed", "error"):
            rules = [f.rule for f in check.findings] or [f"{check.name} ({check.outcome.value})"]
            found += rules
    return elapsed, list(dict.fromkeys(found)) + [f"rejected: {r.message[:60]}"
                                                   for r in report.rejected]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    module = load_ops()
    for compiled in (False, True):  # warm-up, discarded: imports and first-compile costs
        baseline(module.scale_mul, "scale_mul", compiled)
        ours(module.scale_mul, "scale_mul", compiled)
    rows = []
    for compiled in (False, True):
        for name in OPS:
            op = op_of(module, name)
            times = {"baseline": [], "gradtool": []}
            found = {}
            for _ in range(args.repeat):  # interleaved: the machine's load hits both alike
                for tool, fn in (("baseline", baseline), ("gradtool", ours)):
                    elapsed, found[tool] = fn(op, name, compiled)
                    times[tool].append(elapsed)
            row = {"op": name, "compiled": compiled,
                   **{f"{k}_s": statistics.median(v) for k, v in times.items()},
                   **{f"{k}_findings": v for k, v in found.items()}}
            rows.append(row)
            print(f"{'with' if compiled else 'without'} compile | {name} | "
                  f"{row['baseline_s']:.2f} s | {', '.join(found['baseline']) or 'pass'} | "
                  f"{row['gradtool_s']:.2f} s | {', '.join(found['gradtool']) or 'pass'}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": rows},
                                              indent=1))


if __name__ == "__main__":
    main()
