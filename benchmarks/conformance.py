"""The OpInfo database: gradtool's time against gradcheck + gradgradcheck, and mutant detection."""

#     python benchmarks/conformance.py [--ops N] [--mutant-ops N] [--no-assert]
#     python benchmarks/conformance.py --dtype float16|bfloat16 [--only OPS]
#     python benchmarks/conformance.py --dropin [--dropin-stride 4,16] [--dropin-samples 2]
#
# --dropin: PyTorch's OpInfo gradient tests (TestBwdGradients, TestFwdGradients) call by call
# through torch's gradcheck and gradtool's drop-in (tests/opinfo_dropin.py): the agreement and
# time table of benchmarks/README.md ("The drop-in on PyTorch's OpInfo tests"); writes
# results/conformance_dropin.json; exit 1 on an internal error or a disagreement outside a test
# PyTorch marks as an expected failure.
#
# --dtype D (the low-precision table): every autograd OpInfo whose backward supports D on CPU,
# at its first sample rounded to D (its other floating tensors too), gradtool's default checks
# in D against the same op in float64; writes results/conformance_D.json (not with --only) and
# prints each op with a failed or errored check, its rules and worst elements (the kernel
# against float64). Every remaining failure is explained in benchmarks/README.md.
#
# Part 1 (speed): every autograd OpInfo at its first sample (float64, CPU, PyTorch's own values,
# tests/opinfo_ops.py), gradtool's default checks against gradcheck + gradgradcheck on the same
# values, the order alternating op by op, one intra-op thread (ops under SMALL_S: the best of
# REPEATS interleaved runs each; both tools warmed up once first). --ops N takes every k-th op.
# Part 2 (sensitivity): each op's true VJP wrapped in a custom Function, then broken (x1.01 on one
# input, one element off by 1 %, a transposed block, a dropped term in double backward). A mutant
# is kept only where it moves the VJP by more than the tolerance; gradtool must catch every kept
# one; gradcheck's (gradgradcheck's) detection rate is printed beside it. The unbroken wrapper is
# checked too: it must pass. Writes benchmarks/results/conformance.json; exit 1 on a missed goal.

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import opinfo_ops as oo  # noqa: E402
from mutants import MUTATIONS, NAMES, kept, wrap  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SPEED_GOAL = 20.0
SLOWER_S = 0.010  # no op may take gradtool this much longer than gradcheck + gradgradcheck
REPEATS, SMALL_S = 3, 0.25  # ops under SMALL_S (both tools) take the best of REPEATS runs
CAP_S = 30.0  # gradcheck + gradgradcheck on one op stops here (msort's took 122 s)


def outcome_ok(report: Any) -> bool:
    return all(c.outcome.value in ("passed", "skipped")
               for c in report.targets[0].cases[0].checks)


def time_gradtool(name: str, fn: Any, values: list[torch.Tensor], op: Any) -> tuple[float, bool]:
    start = time.perf_counter()
    try:
        ok = outcome_ok(oo.check_at_values(fn, values, name, nondet_tol=op.gradcheck_nondet_tol))
    except Exception:  # noqa: BLE001 - recorded as a failure, the run goes on
        ok = False
    return time.perf_counter() - start, ok


class _Capped(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Capped


def time_gradcheck(fn: Any, values: list[torch.Tensor], op: Any) -> tuple[float, bool]:
    """gradcheck + gradgradcheck's time; past CAP_S it is stopped and counted as CAP_S (so the
    speed-up is a lower bound) and as passing."""
    inputs = [v.detach().clone().requires_grad_(True) for v in values]
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CAP_S)
    start = time.perf_counter()
    try:
        ok = torch.autograd.gradcheck(fn, inputs, nondet_tol=op.gradcheck_nondet_tol,
                                      raise_exception=False)
        if op.supports_gradgrad:
            ok = torch.autograd.gradgradcheck(fn, inputs, nondet_tol=op.gradcheck_nondet_tol,
                                              raise_exception=False) and ok
    except _Capped:
        return CAP_S, True
    except Exception:  # noqa: BLE001
        ok = False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return min(CAP_S, time.perf_counter() - start), ok


def speed(names: list[str]) -> dict[str, Any]:
    rows = []
    # Both tools once, untimed: the first call's imports are the cold start's (coldstart.py),
    # not the first op's.
    warm = oo.autograd_ops()[names[0]]
    _, fn, values = oo.samples(warm)[0]
    time_gradtool(names[0], fn, values, warm)
    time_gradcheck(fn, values, warm)
    for k, name in enumerate(names):
        op = oo.autograd_ops()[name]
        _, fn, values = oo.samples(op)[0]
        runs = [("gradtool", time_gradtool), ("gradcheck", time_gradcheck)]
        timed: dict[str, tuple[float, bool, float]] = {}
        # Small ops: the fastest of REPEATS interleaved runs each (a shared machine's
        # preemptions add tens of ms to single runs of a few ms); one run for the others.
        # CPU time (this process's) beside wall time: on an oversubscribed machine it is the
        # steadier measure of what each tool costs.
        for r in range(REPEATS):
            for tool, timer in (runs if (k + r) % 2 == 0 else runs[::-1]):
                cpu = time.process_time()
                wall, ok = timer(name, fn, values, op) if tool == "gradtool" else \
                    timer(fn, values, op)
                cpu = CAP_S if wall >= CAP_S else time.process_time() - cpu
                old = timed.get(tool, (wall, ok, cpu))
                timed[tool] = (min(old[0], wall), old[1] and ok, min(old[2], cpu))
            if max(t for t, _, _ in timed.values()) > SMALL_S:
                break
        print(f"[{k + 1}/{len(names)}] {name}: gradtool {timed['gradtool'][0]:.3f} s "
              f"(cpu {timed['gradtool'][2]:.3f}), gradcheck {timed['gradcheck'][0]:.3f} s "
              f"(cpu {timed['gradcheck'][2]:.3f})", file=sys.stderr, flush=True)
        rows.append({"op": name, "gradtool_s": timed["gradtool"][0],
                     "gradtool_ok": timed["gradtool"][1], "gradcheck_s": timed["gradcheck"][0],
                     "gradcheck_ok": timed["gradcheck"][1], "gradtool_cpu_s": timed["gradtool"][2],
                     "gradcheck_cpu_s": timed["gradcheck"][2]})
    total_gt = sum(r["gradtool_s"] for r in rows)
    total_gc = sum(r["gradcheck_s"] for r in rows)
    ratios = [r["gradcheck_s"] / r["gradtool_s"] for r in rows if r["gradtool_s"] > 0]
    cpu_gt = sum(r["gradtool_cpu_s"] for r in rows)
    cpu_gc = sum(r["gradcheck_cpu_s"] for r in rows)
    return {"ops": len(rows), "gradtool_s": total_gt, "gradcheck_s": total_gc,
            "gradtool_cpu_s": cpu_gt, "gradcheck_cpu_s": cpu_gc, "speedup_cpu": cpu_gc / cpu_gt,
            "speedup": total_gc / total_gt, "capped": [r["op"] for r in rows
                                                       if r["gradcheck_s"] >= CAP_S], "median_ratio": statistics.median(ratios),
            "slower_ops": sum(r < 1 for r in ratios),
            "both_pass": sum(r["gradtool_ok"] and r["gradcheck_ok"] for r in rows),
            "rows": rows}


def sensitivity(names: list[str], baseline: bool = True,
                mutations: tuple[str, ...] = MUTATIONS) -> dict[str, Any]:
    found: dict[str, dict[str, int]] = {
        m: {"kept": 0, "gradtool": 0, "gradcheck": 0, "gradcheck_fast": 0, "named": 0}
        for m in MUTATIONS}
    missed, controls_failed, checked, unnamed = [], [], 0, []
    for name in names:
        print(f"mutants: {name}", file=sys.stderr, flush=True)
        op = oo.autograd_ops()[name]
        expected = oo.declared(op)
        if expected.gradient != "run":
            continue
        _, fn, values = oo.samples(op)[0]
        control = wrap(fn, values, None)
        if control is None:
            continue  # outputs the wrapper cannot carry (non-float, non-tensor, empty)
        checked += 1
        if not outcome_ok(oo.check_at_values(control, values, name, checks=("gradient",))):
            controls_failed.append(name)
            continue
        for mutation in mutations:
            second = mutation == "dropped double-backward term"
            if second and expected.double_backward != "run":
                continue
            for position in range(len(values)):
                if not kept(fn, values, mutation, position):
                    continue
                mutant = wrap(fn, values, (mutation, position))
                check = ("double_backward",) if second else ("gradient",)
                report = oo.check_at_values(mutant, values, name, checks=check)
                caught = not outcome_ok(report)
                tally = found[mutation]
                tally["kept"] += 1
                tally["gradtool"] += caught
                if baseline:
                    tally["gradcheck"] += gradcheck_catches(mutant, values, second, fast=False)
                    tally["gradcheck_fast"] += gradcheck_catches(mutant, values, second,
                                                                 fast=True)
                if not caught:
                    missed.append(f"{name}: {mutation} on input {position}")
                if _named(report, mutation):
                    tally["named"] += 1
                elif mutation in NAMES:
                    unnamed.append(f"{name}: {mutation} on input {position}: "
                                   f"{_diagnoses(report)[:160]}")
                break  # one position per op and mutation keeps the run short
    return {"ops": checked, "by_mutation": found, "missed": missed,
            "controls_failed": controls_failed, "unnamed": unnamed}


def _diagnoses(report: Any) -> str:
    return " | ".join(b.diagnosis or "" for c in report.targets[0].cases[0].checks
                      for b in c.blocks if b.mismatched)


def _named(report: Any, mutation: str) -> bool:
    """Whether gradtool's diagnosis of the mutant names its kind of mistake."""
    words = NAMES.get(mutation)
    return bool(words) and any(w in _diagnoses(report) for w in words)


def gradcheck_catches(mutant: Any, values: list[torch.Tensor], second: bool, fast: bool
                      ) -> bool:
    inputs = [v.detach().clone().requires_grad_(True) for v in values]
    tool = torch.autograd.gradgradcheck if second else torch.autograd.gradcheck
    try:
        return not tool(mutant.apply, inputs, raise_exception=False, fast_mode=fast)
    except Exception:  # noqa: BLE001 - gradcheck raising on a mutant counts as caught
        return True


def low_precision_table(names: list[str], dtype: str) -> dict[str, Any]:
    """Each op that supports `dtype` backward on CPU: every default check's verdict in `dtype`."""
    low = getattr(torch, dtype)
    rows = []
    for name in names:
        op = oo.autograd_ops()[name]
        if not (op.supports_dtype(low, "cpu") and low in op.supported_backward_dtypes("cpu")):
            continue
        for label, fn, values in oo.samples(op, rounded=low):
            if oo.is_sparse(values) or oo.is_empty(fn, values):
                continue
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, CAP_S)
            try:
                checks = oo.check_at_values(fn, values, name, dtype=dtype).targets[0].cases[0]\
                    .checks
                verdicts = {c.name: (c.outcome.value, [f.rule for f in c.findings],
                                     c.summary[:300], list(c.details[:3])) for c in checks}
            except _Capped:
                verdicts = {"all": ("capped", [], f"over {CAP_S:g} s", [])}
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                verdicts = {"all": ("crashed", [], f"{type(exc).__name__}: {exc}"[:300], [])}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            bad = {k: v for k, v in verdicts.items() if v[0] not in ("passed", "skipped")}
            rows.append({"op": name, "sample": label, "bad": bad})
            print(f"[{len(rows)}] {name} {label}: " + ("ok" if not bad else "; ".join(
                f"{k} {v[0]} {v[1]} {v[2][:120]}" for k, v in bad.items())),
                file=sys.stderr, flush=True)
    return {"dtype": dtype, "ops": len(rows), "all_pass": sum(not r["bad"] for r in rows),
            "rows": rows}


def dropin_table(stride: dict[str, int], limit: int | None) -> dict[str, Any]:
    """--dropin: PyTorch's OpInfo gradient tests' calls (tests/opinfo_dropin.py) made with
    torch's gradcheck/gradgradcheck and gradtool's drop-in on the same values, every k-th op by
    sorted name per mode, both dtypes: agreement, internal errors and time per mode and dtype
    (time summed over the calls both passed, and over all)."""
    import opinfo_dropin as od

    rows = []
    for mode, k in stride.items():
        for dtype in od.DTYPES:
            row: dict[str, Any] = {"mode": mode, "dtype": dtype, "ops": 0, "calls": 0,
                                   "agree": 0, "internal": 0, "torch_s": 0.0, "gradtool_s": 0.0,
                                   "both_passed_torch_s": 0.0, "both_passed_gradtool_s": 0.0,
                                   "both_failed": 0, "both_failed_torch_s": 0.0,
                                   "both_failed_gradtool_s": 0.0, "disagreements": []}
            for name in od.every_kth(list(od.ops(dtype)), k):
                op = od.ops(dtype)[name]
                row["ops"] += 1
                for kind in od.TESTS:
                    if od.runs(op, dtype, kind):
                        continue
                    for call in od.calls(op, dtype, kind, mode == "fast", limit):
                        _dropin_call(row, call, od.expected_failure(op, dtype, kind))
            rows.append(row)
            print(_dropin_line(row), flush=True)
            print(f"  both failed: {row['both_failed']} calls, torch "
                  f"{row['both_failed_torch_s']:.2f} s, gradtool "
                  f"{row['both_failed_gradtool_s']:.2f} s", flush=True)
    return {"stride": stride, "samples": limit, "rows": rows}


def _dropin_call(row: dict[str, Any], call: Any, xfail: bool) -> None:
    import opinfo_dropin as od

    theirs, t_torch, e_torch = od.outcome(call, "torch")
    ours, t_ours, e_ours = od.outcome(call, "gradtool")
    row["calls"] += 1
    row["agree"] += theirs == ours
    row["internal"] += ours == "internal"
    row["torch_s"] += t_torch
    row["gradtool_s"] += t_ours
    if theirs == ours == "passed":
        row["both_passed_torch_s"] += t_torch
        row["both_passed_gradtool_s"] += t_ours
    elif theirs == ours == "failed":  # a failing call's cost: the report's, against torch's
        row["both_failed"] += 1
        row["both_failed_torch_s"] += t_torch
        row["both_failed_gradtool_s"] += t_ours
    if theirs != ours:
        row["disagreements"].append({"call": call.label, "xfail": xfail, "torch": e_torch or
                                     theirs, "gradtool": e_ours or ours})


def _dropin_line(row: dict[str, Any]) -> str:
    ratio = row["both_passed_gradtool_s"] / max(row["both_passed_torch_s"], 1e-9)
    xfail = sum(d["xfail"] for d in row["disagreements"])
    return (f"| {row['mode']} | {row['dtype']} | {row['ops']} | {row['calls']} | "
            f"{row['agree']} | {row['internal']} | {len(row['disagreements'])} ({xfail} on "
            f"xfail tests) | {row['torch_s']:.1f} | {row['gradtool_s']:.1f} | {ratio:.2f}x |")


def every_kth(names: list[str], n: int | None) -> list[str]:
    if not n or n >= len(names):
        return names
    step = len(names) / n
    return [names[int(k * step)] for k in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=None, help="time every k-th op, N in all")
    parser.add_argument("--mutant-ops", type=int, default=120, help="ops given mutants")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-mutants", action="store_true")
    parser.add_argument("--only", default=None, help="comma-separated op names to time")
    parser.add_argument("--out", type=Path, default=RESULTS / "conformance.json")
    parser.add_argument("--no-assert", action="store_true")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"),
                        help="the low-precision table in this dtype instead of parts 1 and 2")
    parser.add_argument("--dropin", action="store_true",
                        help="PyTorch's OpInfo gradient tests' calls through torch's gradcheck "
                             "and gradtool's drop-in: agreement and time per mode and dtype")
    parser.add_argument("--dropin-stride", default="4,16",
                        help="--dropin: every k-th op in fast mode, in slow mode")
    parser.add_argument("--dropin-samples", type=int, default=2,
                        help="--dropin: each op's first N samples (0: all, as PyTorch runs)")
    parser.add_argument("--diagnosis-only", action="store_true",
                        help="first-order mutants only, without the gradcheck baseline: how "
                             "often the diagnosis names the mistake")
    args = parser.parse_args()
    reason = oo.unavailable()
    if reason:
        print(reason)
        return 2
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    names = sorted(oo.autograd_ops())
    if args.dropin:
        fast, slow = (int(k) for k in args.dropin_stride.split(","))
        print(f"torch {torch.__version__}, load {os.getloadavg()[0]:.1f}\n| mode | dtype | ops | "
              "calls | agree | internal | disagree | torch s | gradtool s | both-pass ratio |")
        table = dropin_table({"fast": fast, "slow": slow}, args.dropin_samples or None)
        table["torch"], table["load_after"] = torch.__version__, os.getloadavg()
        (RESULTS / "conformance_dropin.json").write_text(json.dumps(table, indent=1))
        internal = sum(r["internal"] for r in table["rows"])
        unexplained = [d for r in table["rows"] for d in r["disagreements"] if not d["xfail"]]
        for d in unexplained:
            print("disagreement:", d)
        return 0 if args.no_assert or not (internal or unexplained) else 1
    if args.dtype:
        table = low_precision_table(args.only.split(",") if args.only else names, args.dtype)
        if not args.only:  # a few ops for a look leave the whole table's results be
            (RESULTS / f"conformance_{args.dtype}.json").write_text(json.dumps(table, indent=1))
        print(f"{args.dtype}: {table['all_pass']} of {table['ops']} op samples pass every check")
        return 0
    result: dict[str, Any] = {"torch": torch.__version__}
    result["load_before"] = os.getloadavg()
    if not args.skip_speed:
        chosen = args.only.split(",") if args.only else every_kth(names, args.ops)
        result["speed"] = speed(chosen)
    if not args.skip_mutants:
        result["sensitivity"] = sensitivity(
            every_kth(names, args.mutant_ops), baseline=not args.diagnosis_only,
            mutations=tuple(m for m in MUTATIONS if m in NAMES) if args.diagnosis_only
            else MUTATIONS)
    result["load_after"] = os.getloadavg()
    out = RESULTS / "diagnosis.json" if args.diagnosis_only else args.out
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return report(result, args.no_assert)


def report(result: dict[str, Any], no_assert: bool) -> int:
    ok = True
    if "speed" in result:
        s = result["speed"]
        print(f"## OpInfo database: {s['ops']} ops, first sample, float64 CPU\n")
        print("| | gradtool | gradcheck + gradgradcheck | speed-up |\n|---|---|---|---|")
        print(f"| whole database, wall | {s['gradtool_s']:.1f} s | {s['gradcheck_s']:.1f} s | "
              f"**{s['speedup']:.1f}×** |")
        if "speedup_cpu" in s:
            print(f"| whole database, CPU | {s['gradtool_cpu_s']:.1f} s | "
                  f"{s['gradcheck_cpu_s']:.1f} s | **{s['speedup_cpu']:.1f}×** |")
        loads = [", ".join(f"{x:.1f}" for x in result.get(k) or ())
                 for k in ("load_before", "load_after")]
        print(f"\nload average {loads[0]} at the start, {loads[1]} at the end (2 cores)")
        print(f"\nper-op median ratio {s['median_ratio']:.2f}×; gradtool slower on "
              f"{s['slower_ops']} ops; both pass on {s['both_pass']} ops; gradcheck stopped at "
              f"{CAP_S:g} s (counted as {CAP_S:g} s) on {s['capped'] or 'none'}")
        ok &= s["speedup"] >= SPEED_GOAL
        for kind, suffix in (("wall", "_s"), ("CPU", "_cpu_s")):
            if f"gradtool{suffix}" not in s["rows"][0]:
                continue
            behind = sorted((r[f"gradtool{suffix}"] - r[f"gradcheck{suffix}"], r["op"])
                            for r in s["rows"])[::-1]
            late = [(op, gap) for gap, op in behind if gap > SLOWER_S]
            print(f"\n{kind}: {len(late)} ops where gradtool is more than {SLOWER_S * 1e3:g} ms "
                  f"slower: {', '.join(f'{op} (+{gap * 1e3:.0f} ms)' for op, gap in late[:25])}"
                  f"{' ...' if len(late) > 25 else ''}")
            print(f"{kind}: largest gaps: " + ", ".join(f"{op} {gap * 1e3:+.1f} ms"
                                                        for gap, op in behind[:8]))
            ok &= not late if kind == "CPU" else True
    if "sensitivity" not in result:
        print("\ngoals:", "met" if ok else "MISSED")
        return 0 if ok or no_assert else 1
    m = result["sensitivity"]
    print(f"\n## Mutants: {m['ops']} ops wrapped in a custom Function (VJP broken)\n")
    print("| mutation | kept | gradtool | gradcheck (slow) | gradcheck fast_mode | "
          "named by gradtool's diagnosis |\n|---|---|---|---|---|---|")
    for name, t in m["by_mutation"].items():
        cells = [f"{t[k]} ({_rate(t[k], t['kept'])})"
                 for k in ("gradtool", "gradcheck", "gradcheck_fast", "named")]
        if name not in NAMES:
            cells[-1] = "—"
        print(f"| {name} | {t['kept']} | " + " | ".join(cells) + " |")
    for line in m.get("unnamed", []):
        print(f"not named: {line}")
    print(f"\nunbroken wrappers failing gradtool: {m['controls_failed'] or 'none'}")
    print(f"missed by gradtool: {m['missed'] or 'none'}")
    ok &= not m["missed"] and not m["controls_failed"]
    print("\ngoals:", "met" if ok else "MISSED")
    return 0 if ok or no_assert else 1


def _rate(caught: int, kept_count: int) -> str:
    return f"{100 * caught / kept_count:.0f} %" if kept_count else "—"


if __name__ == "__main__":
    sys.exit(main())
