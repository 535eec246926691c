"""Low precision: gradtool's float64-reference check vs a hand-loosened gradcheck, detection + cost.

For an elementwise kernel (tanh-GELU) and a matmul kernel at 64x64, and for kernels with a
hand-written backward whose algorithm is not a plain reference's (a chunked scan, a tiled matmul,
a fused attention, a convolution, a layer norm: tests/fixtures/lowprec_kernels.py, against the
same target in float64 and against their plain reference as --reference), in float32, float16
and bfloat16, over N seeds: how often a correct kernel fails, and how often a one-element or a
whole-tensor scale error in the low-precision path is caught, by gradtool (`--dtype D`, the
float64 reference) and by torch.autograd.gradcheck with eps=1e-3, atol=1e-3, rtol=1e-2 in the
same dtype (fast mode, the affordable one at 64x64 x 100 seeds). Then the cost of the
low-precision check against gradtool's float64 check of the same target (medians, interleaved).

    python benchmarks/lowprec.py            # 100 seeds (about 10 minutes)
    python benchmarks/lowprec.py --seeds 10
    python benchmarks/lowprec.py --seeds 20 --kernel scan,tiled  # detection on those only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import lowprec as L
import lowprec_kernels as K

from gradtool.config.settings import CheckConfig
from gradtool.targets.cases import build_case
from gradtool.targets.inputs import parse_input
from gradtool.targets.resolve import make_target

# The goals: (one-element error, scale error) per dtype.
ERRORS = {"float32": (1.001, 1.001), "float16": (1.02, 1.03), "bfloat16": (1.10, 1.03)}
KERNELS = {"elementwise (GELU)": (L.Gelu, ["64x64"]), "matmul": (L.MatMul, ["64x64", "64x64"])}
# Detection also on kernels with a hand-written backward whose algorithm is not a plain
# reference's (tests/fixtures/lowprec_kernels.py): against the same target in float64, and
# against the plain reference given as --reference. name -> (kernel, inputs, reference)
REFERENCES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "lowprec_kernels.py"
DETECTION = {**{name: (cls, inputs, None) for name, (cls, inputs) in KERNELS.items()},
             **{name: (cls, inputs, None) for name, (cls, inputs, _) in K.KERNELS.items()},
             **{f"{name} vs --reference": (cls, inputs, f"{REFERENCES}:{ref}")
                for name, (cls, inputs, ref) in K.KERNELS.items()}}
GRADCHECK = {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-2}


def gradtool_outcome(cls: type, inputs: list[str], dtype: str, seed: int,
                     reference: str | None = None) -> str:
    from gradtool.checks.precision import run_precision_check

    config = CheckConfig(dtype=dtype, seed=seed, checks=("gradient",), reference=reference)
    target = make_target(cls, cls.__name__)
    case = build_case(target, [parse_input(i) for i in inputs], config, seed)
    return run_precision_check(case, target, config).outcome.value


def gradcheck_caught(cls: type, inputs: list[str], dtype: str, seed: int) -> bool:
    config = CheckConfig(dtype=dtype, seed=seed)
    case = build_case(make_target(cls, cls.__name__), [parse_input(i) for i in inputs],
                      config, seed)
    args = [a.detach().requires_grad_() for a in case.problem.args]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return not torch.autograd.gradcheck(cls.apply, args, raise_exception=False,
                                                fast_mode=True, **GRADCHECK)
        except Exception:  # gradcheck refuses some low-precision inputs outright
            return True


def detection(seeds: int, only: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for kernel, (base, inputs, reference) in DETECTION.items():
        if only and not any(word in kernel for word in only.split(",")):
            continue
        for dtype, (one, scale) in ERRORS.items():
            variants = {"correct": base, f"one element x{one:g}": L.variant(base, one, True),
                        f"scale x{scale:g}": L.variant(base, scale, False)}
            for label, cls in variants.items():
                ours = [gradtool_outcome(cls, inputs, dtype, s, reference)
                        for s in range(seeds)]
                # gradcheck only on the first two (on a chunked scan it takes a minute a seed)
                theirs = [gradcheck_caught(cls, inputs, dtype, s) for s in range(seeds)] \
                    if kernel in KERNELS else None
                rows.append({"kernel": kernel, "dtype": dtype, "variant": label,
                             "seeds": seeds, "gradtool_failed": ours.count("failed"),
                             "gradtool_inconclusive": ours.count("inconclusive"),
                             "gradcheck_failed": None if theirs is None else sum(theirs)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def timing(reps: int) -> list[dict[str, Any]]:
    from gradtool.checks.gradient import check_gradient
    from gradtool.checks.precision import run_precision_check

    rows = []
    for kernel, (cls, inputs) in KERNELS.items():
        target = make_target(cls, cls.__name__)
        for dtype in ERRORS:
            times: dict[str, list[float]] = {"float64": [], dtype: []}
            for rep in range(-1, reps):  # interleaved, so load drifts hit both alike; -1 warms up
                for name in times:
                    config = CheckConfig(dtype=name, seed=max(rep, 0))
                    case = build_case(target, [parse_input(i) for i in inputs], config,
                                      max(rep, 0))
                    start = time.perf_counter()
                    if name == "float64":
                        check_gradient(case, target, config)
                    else:
                        run_precision_check(case, target, config)
                    if rep >= 0:
                        times[name].append(time.perf_counter() - start)
            f64, low = (statistics.median(times[n]) for n in times)
            rows.append({"kernel": kernel, "dtype": dtype, "float64_check_s": f64,
                         "low_precision_check_s": low, "ratio": low / f64})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def tables(result: dict[str, Any]) -> str:
    """Markdown: detection (caught / failed per seeds) and cost, from a results file."""
    lines = ["| kernel | dtype | variant | gradtool failed | gradtool inconclusive "
             "| gradcheck (loosened) failed |", "|---|---|---|---|---|---|"]
    for r in result["detection"]:
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['variant']} | "
                     f"{r['gradtool_failed']}/{r['seeds']} | {r['gradtool_inconclusive']} | "
                     + ("— |" if r["gradcheck_failed"] is None else
                        f"{r['gradcheck_failed']}/{r['seeds']} |"))
    lines += ["", "| kernel | dtype | float64 check | low-precision check | ratio |",
              "|---|---|---|---|---|"]
    for r in result["timing"]:
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['float64_check_s'] * 1e3:.3g} ms | "
                     f"{r['low_precision_check_s'] * 1e3:.3g} ms | {r['ratio']:.2g}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "lowprec.json"))
    parser.add_argument("--table", action="store_true", help="print the tables of --out and stop")
    parser.add_argument("--kernel", help="detection only, on the kernels whose name has one of "
                                         "these comma-separated words")
    args = parser.parse_args()
    if args.table:
        print(tables(json.loads(Path(args.out).read_text())))
        return
    torch.set_num_threads(1)
    result = {"versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
              "timing": [] if args.kernel else timing(args.reps),
              "detection": detection(args.seeds, args.kernel)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(tables(result))


if __name__ == "__main__":
    main()
