"""Sharper than gradcheck: the measured tolerance against gradcheck's defaults, over N seeds.

float64 targets at 16-64 per dimension (the size cycles with the seed): tanh-GELU (elementwise),
a matmul-style product, and a fixed-point solver; each correct, with one element of backward's
result off by a relative 1e-5, and with backward scaled by 1 + 1e-6. Then float32 tanh-GELU with
a 0.1 % error (one element, or everywhere) in the low-precision path only, or in every dtype.
Counted: how often each mistake is caught (and the correct twin failed: false alarms) by
gradtool at its defaults and by torch.autograd.gradcheck at its defaults (the float32 rows:
gradcheck in float32 with the loosened eps=1e-3, atol=1e-3, rtol=1e-2 it would need). The
solver rows also list the limit the report gives ("errors below X cannot be seen here").

    python benchmarks/sharp.py              # 100 seeds
    python benchmarks/sharp.py --seeds 10 --part float64   (or float32)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.autograd import Function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import sharp as S  # noqa: E402

import gradtool  # noqa: E402

SIZES = (16, 32, 64)
BUGS = {"correct": None, "one element 1e-5": ("one", 1 + 1e-5), "scale 1e-6": ("scale", 1 + 1e-6)}
LOW_BUGS = {"correct": None, "one element 0.1 % (low only)": ("one", 1.001, False),
            "scale 0.1 % (low only)": ("scale", 1.001, False),
            "one element 0.1 % (every dtype)": ("one", 1.001, True),
            "scale 0.1 % (every dtype)": ("scale", 1.001, True)}


def _broken(result: torch.Tensor, bug: Any, where: int) -> torch.Tensor:
    if bug is None:
        return result
    kind, factor = bug[0], bug[1]
    if kind == "scale":
        return result * factor
    out = result.clone().reshape(-1)
    out[where % out.numel()] *= factor
    return out.reshape(result.shape)


def gelu_target(bug: Any, where: int) -> type:
    class Gelu(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return S.gelu(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return _broken(grad * S.gelu_derivative(x), bug, where)
    return Gelu


def matmul_target(bug: Any, where: int) -> type:
    class MatMul(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return _broken(grad @ b.T, bug, where), a.T @ grad
    return MatMul


def solver_target(bug: Any, where: int) -> type:
    class Solver(S.FixedPoint):
        @staticmethod
        def backward(ctx, grad):
            gx, gw = S.FixedPoint.backward(ctx, grad)
            return _broken(gx, bug, where), gw
    return Solver


def loose_solver_target(bug: Any, where: int) -> type:
    """The same solver stopped at 1e-6: its gradient is ~1e-6 from its own differences."""
    base = solver_target(bug, where)
    return type("LooseSolver", (base,), {"TOL": 1e-6})


TARGETS = {
    "tanh-GELU": (gelu_target, lambda n: [f"16x{n}"]),
    "matmul": (matmul_target, lambda n: [f"16x{n}", f"{n}x16"]),
    "fixed-point solver": (solver_target, lambda n: [f"2x{n}", f"{n}x{n}:[-0.02,0.02]"]),
    "solver, tol 1e-6": (loose_solver_target, lambda n: [f"2x{n}", f"{n}x{n}:[-0.02,0.02]"]),
}


def _gradtool(cls: type, inputs: list[str], seed: int, **settings: Any) -> tuple[str, str]:
    report = gradtool.check(cls, inputs, seed=seed, checks=("gradient",), **settings)
    check = next(c for _, _, c in report.checks())
    limit = next((d for d in check.details if "cannot be seen" in d or "cannot be told" in d),
                 "")
    return check.outcome.value, limit


def _gradcheck(cls: type, inputs: list[str], seed: int, dtype: torch.dtype, **tol: Any) -> bool:
    """True when gradcheck raises (the mistake is caught), on gradtool's own sampled values."""
    from gradtool.config.settings import CheckConfig
    from gradtool.targets.cases import build_case
    from gradtool.targets.inputs import parse_input
    from gradtool.targets.resolve import make_target

    config = CheckConfig(seed=seed, dtype=str(dtype).replace("torch.", ""))
    case = build_case(make_target(cls, "bench"), [parse_input(s) for s in inputs], config, seed)
    values = [v.detach().requires_grad_(True) for v in case.problem.inputs]
    try:
        return not torch.autograd.gradcheck(cls.apply, values, raise_exception=False, **tol)
    except Exception:  # noqa: BLE001
        return True


def float64_rows(seeds: int, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for name, (make, inputs_of) in TARGETS.items():
        if only and name not in only:
            continue
        for bug_name, bug in BUGS.items():
            caught = {"gradtool": 0, "gradcheck": 0}
            limits, inconclusive = [], 0
            for seed in range(seeds):
                n = SIZES[seed % len(SIZES)]
                cls, inputs = make(bug, 7919 * seed + 13), inputs_of(n)
                outcome, limit = _gradtool(cls, inputs, seed)
                caught["gradtool"] += outcome == "failed"
                inconclusive += outcome == "inconclusive"
                caught["gradcheck"] += _gradcheck(cls, inputs, seed, torch.float64)
                if "errors below " in limit:
                    limits.append(float(limit.split("errors below ")[1].split()[0]))
                elif limit:
                    limits.append(math.nan)  # "within gradcheck's tolerance: cannot be told"
            rows.append({"target": name, "bug": bug_name, "seeds": seeds, **caught,
                         "gradtool_inconclusive": inconclusive,
                         "limit_median": (statistics.median(v for v in limits if v == v)
                                          if any(v == v for v in limits) else None),
                         "limit_reported": len(limits)})
            print(_line(rows[-1]), flush=True)
    return rows


def float32_rows(seeds: int) -> list[dict[str, Any]]:
    rows = []
    for bug_name, bug in LOW_BUGS.items():
        caught = {"gradtool": 0, "gradcheck": 0}
        for seed in range(seeds):
            n = SIZES[seed % len(SIZES)]
            attrs = {} if bug is None else {"factor": bug[1], "one_element": bug[0] == "one",
                                            "everywhere": bug[2]}
            cls = type("GeluF32Bench", (S.GeluF32,), attrs)
            outcome, _ = _gradtool(cls, [f"16x{n}"], seed, dtype="float32")
            caught["gradtool"] += outcome == "failed"
            caught["gradcheck"] += _gradcheck(cls, [f"16x{n}"], seed, torch.float32,
                                              eps=1e-3, atol=1e-3, rtol=1e-2)
        rows.append({"target": "float32 tanh-GELU", "bug": bug_name, "seeds": seeds, **caught,
                     "gradtool_inconclusive": 0, "limit_median": None, "limit_reported": 0})
        print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    what = "false alarms" if row["bug"] == "correct" else "caught"
    median = (f" (median {row['limit_median']:.2g})" if row["limit_median"] is not None
              else "")
    limit = f", limit reported {row['limit_reported']}x{median}" if row["limit_reported"] else ""
    return (f"{row['target']:<20} {row['bug']:<34} {what}: gradtool {row['gradtool']}/"
            f"{row['seeds']}, gradcheck {row['gradcheck']}/{row['seeds']}"
            f"{', inconclusive ' + str(row['gradtool_inconclusive']) if row['gradtool_inconclusive'] else ''}"
            f"{limit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--part", choices=("all", "float64", "float32"), default="all")
    parser.add_argument("--target", action="append", choices=tuple(TARGETS),
                        help="float64 targets to run (repeatable; default all)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "sharp.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rows = ((float64_rows(args.seeds, args.target) if args.part != "float32" else [])
            + (float32_rows(args.seeds) if args.part != "float64" else []))
    args.out.write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
