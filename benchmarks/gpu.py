"""gradtool against gradcheck + gradgradcheck at float64 on one device (a GPU where there is one):
per-row and aggregate wall time, and gradtool's peak device memory."""

#     python benchmarks/gpu.py [--device cuda] [--quick] [--json FILE]
#
# Each row: torch ops (linear, layer_norm, softmax, conv2d, attention, cumsum at everyday
# shapes) and custom Functions (tests/fixtures/bugs.py) at several sizes, up to inputs of 10^6
# elements, on the user's own tensors on the device. gradtool runs its gradient and double
# backward checks (the pair gradcheck + gradgradcheck answer) and, apart, every default check;
# gradcheck and gradgradcheck run slow mode (their default) on the same tensors. Each tool is
# warmed up once on the row (kernels compiled, caches filled), then timed; rows where slow mode
# would need more memory than the device has or more than the time budget are reported with
# its call-count estimate and left out of the aggregate. Peak memory is the device's
# (torch.cuda.max_memory_allocated) during gradtool's run; on the CPU it is not measured.

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import gradcheck, gradgradcheck

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import bugs  # noqa: E402

F = torch.nn.functional
SLOW_MEMORY = 8e9   # gradcheck slow mode's dense Jacobians beyond this: not run


def rows(device: str, quick: bool) -> list[tuple[str, Callable[..., Any], Callable[[], tuple]]]:
    """(name, fn, make_args): fresh float64 tensors on the device for each run."""
    def t(*shape: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)

    def args(*makers: Callable[[], torch.Tensor]) -> Callable[[], tuple]:
        return lambda: tuple(m() for m in makers)

    out = [
        ("linear 16x64 @ 32x64", F.linear, args(t(16, 64), t(32, 64), t(32))),
        ("layer_norm 16x64", lambda x, w, b: F.layer_norm(x, (64,), w, b),
         args(t(16, 64), t(64), t(64))),
        ("softmax 16x64", lambda x: torch.softmax(x, -1), args(t(16, 64))),
        ("conv2d 2x3x8x8, 4x3x3x3", F.conv2d, args(t(2, 3, 8, 8), t(4, 3, 3, 3))),
        ("attention 1x2x16x32", F.scaled_dot_product_attention,
         args(t(1, 2, 16, 32), t(1, 2, 16, 32), t(1, 2, 16, 32))),
        ("cumsum 16x64", lambda x: torch.cumsum(x, 0), args(t(16, 64))),
        ("Function Linear 64x64 @ 64x64", bugs.Linear.apply, args(t(64, 64), t(64, 64), t(64))),
    ]
    sizes = [1_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    out += [(f"Function Cube {n}", bugs.Cube.apply, args(t(n))) for n in sizes]
    return out


def _gradtool(fn: Callable[..., Any], values: tuple, checks: tuple[str, ...] | None) -> bool:
    import gradtool

    settings = {} if checks is None else {"checks": checks}
    report = gradtool.check(fn, values, **settings)
    return all(k.outcome.value in ("passed", "skipped") for _, _, k in report.checks())


def _incumbent(fn: Callable[..., Any], values: tuple) -> bool:
    return gradcheck(fn, values) and gradgradcheck(fn, values)


def _timed(run: Callable[[], bool], device: str) -> tuple[float, bool]:
    _sync(device)
    start = time.perf_counter()
    ok = run()
    _sync(device)
    return time.perf_counter() - start, ok


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _slow_mode_fits(values: tuple, fn: Callable[..., Any], budget_s: float) -> str | None:
    """Why gradcheck slow mode is not run on this row, or None: dense Jacobians of n_in x n_out
    (twice, plus gradgradcheck's), one backward per output element and two forwards per input."""
    n_in = sum(v.numel() for v in values)
    with torch.no_grad():
        out = fn(*values)
    n_out = sum(o.numel() for o in (out if isinstance(out, tuple) else (out,)))
    memory = 3 * 8 * n_in * n_out
    if memory > SLOW_MEMORY:
        return f"slow mode needs ~{memory / 1e9:.3g} GB of dense Jacobians"
    if 2 * n_in + n_out > budget_s * 2000:  # ~0.5 ms an evaluation on a GPU, at the least
        return f"slow mode needs ~{2 * n_in + n_out} evaluations (> {budget_s:.0f} s)"
    return None


def measure(name: str, fn: Callable[..., Any], make: Callable[[], tuple], device: str,
            budget_s: float) -> dict[str, Any]:
    values = make()
    row: dict[str, Any] = {"row": name, "n_in": sum(v.numel() for v in values)}
    _gradtool(fn, values, ("gradient", "double_backward"))      # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    row["gradtool_s"], row["gradtool_ok"] = _timed(
        lambda: _gradtool(fn, values, ("gradient", "double_backward")), device)
    if device.startswith("cuda"):
        row["gradtool_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    row["gradtool_all_s"], row["gradtool_all_ok"] = _timed(
        lambda: _gradtool(fn, values, None), device)
    row["incumbent_skipped"] = _slow_mode_fits(values, fn, budget_s)
    if row["incumbent_skipped"] is None:
        try:
            _incumbent(fn, values)                               # warm-up
        except RuntimeError as exc:  # no double backward here (CPU's fused attention)
            row["incumbent_skipped"] = f"raised: {str(exc).splitlines()[0][:80]}"
            return row
        row["incumbent_s"], row["incumbent_ok"] = _timed(lambda: _incumbent(fn, values), device)
        row["ratio"] = row["gradtool_s"] / row["incumbent_s"]
    return row


def markdown(found: list[dict[str, Any]]) -> str:
    lines = ["| row | n_in | gradtool (grad + double) | every default check | "
             "gradcheck + gradgradcheck | ratio | peak memory |",
             "|---|---|---|---|---|---|---|"]
    for r in found:
        incumbent = (f"{r['incumbent_s']:.3g} s" if "incumbent_s" in r
                     else f"not run: {r['incumbent_skipped']}")
        ratio = f"{r['ratio']:.3g}x" if "ratio" in r else "-"
        peak = f"{r['gradtool_peak_mb']:.0f} MB" if "gradtool_peak_mb" in r else "-"
        lines.append(f"| {r['row']} | {r['n_in']} | {r['gradtool_s']:.3g} s | "
                     f"{r['gradtool_all_s']:.3g} s | {incumbent} | {ratio} | {peak} |")
    compared = [r for r in found if "ratio" in r]
    if compared:
        ours = sum(r["gradtool_s"] for r in compared)
        theirs = sum(r["incumbent_s"] for r in compared)
        lines.append(f"\naggregate over the {len(compared)} rows both ran: gradtool {ours:.3g} s, "
                     f"gradcheck + gradgradcheck {theirs:.3g} s: {theirs / ours:.3g}x faster")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer and smaller rows")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="seconds slow mode may take on a row before it is left out")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    card = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({card}), torch {torch.__version__}", flush=True)
    found = []
    for name, fn, make in rows(args.device, args.quick):
        found.append(measure(name, fn, make, args.device, args.budget))
        print(json.dumps(found[-1]), flush=True)
    print(markdown(found))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "card": card,
                                               "torch": torch.__version__, "rows": found},
                                              indent=1))
    return 0 if all(r["gradtool_ok"] for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
