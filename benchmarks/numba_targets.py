"""numba-compiled targets: every default gradtool check against gradcheck slow + gradgradcheck
slow, warm and cold (the first call in a process, numba compiling), evaluations counted at the
compiled kernels."""

#     python benchmarks/numba_targets.py [--repeats 5] [--no-cold] [--install DIR]
#
# Rows: pysdtw 0.0.5's SoftDTWcpu (numba `@jit(parallel=True)` kernels; its forward converts its
# result with `torch.Tensor(...)`, float32, and with lengths shorter than the shape its backward
# leaves the end cell's seed, 1, on a padding element: two real bugs), on equal and unequal
# sequence lengths, not vendored: installed from PyPI (`--install DIR`: pip install --target
# DIR, then imported from there) or skipped with the reason; and numba soft-DTW Functions of
# this file, float64 throughout, backward written by hand with numba (`@once_differentiable`,
# as such kernels are written), correct and with a seeded bug (an index slip: the diagonal
# move's cost read at the cell itself in backward's recursion). Warm: one torch thread and one
# numba thread, each tool once per round in the same process, the order rotated every round,
# medians; per check, gradtool's own durations. Evaluations: calls of the compiled forward and
# backward kernels (what costs, and what compiles), both tools counted alike. Cold: each tool's
# first call in a fresh process, numba's compilation included, and how many signatures each
# kernel compiled (numba compiles one per argument layout: 'C' contiguous, 'A' any). The
# machine's load is printed at the start and the end (a parallel kernel waiting for its threads
# on a loaded machine costs tens of ms per call: hence one numba thread).

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "numba_targets.json"
PIN = "pysdtw==0.0.5"
SHAPE = (2, 5, 6)
LENGTHS = {"equal": [[5, 6], [5, 6]], "unequal": [[5, 6], [4, 5]]}


def load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def missing() -> str | None:
    """Why the numba rows cannot run here, or None."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numba is not installed (pip install numba): every row skipped"
    return None


def pysdtw_missing() -> str | None:
    try:
        import pysdtw.sdtw_cpu  # noqa: F401
    except ImportError:
        return (f"pysdtw is not installed: its rows skipped (pip install {PIN}, or run with "
                "--install DIR)")
    return None


def install(folder: Path) -> None:
    """The pinned pysdtw into folder (--no-deps: torch and numba are this environment's)."""
    if not (folder / "pysdtw").exists():
        subprocess.run([sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--target",
                        str(folder), PIN], check=True)
    sys.path.insert(0, str(folder))
    INSTALLED.append(str(folder))


INSTALLED: list[str] = []  # --install's folder, passed on to the cold processes


# --- this file's own numba soft-DTW: float64, backward by hand ---------------------------------

@functools.lru_cache(maxsize=None)
def _kernels() -> tuple[Any, Any, Any]:
    """(forward, backward, seeded backward) kernels, made once and compiled at their first call
    (numba imported here)."""
    import numba
    import numpy as np

    @numba.njit(cache=False)
    def forward(d, lengths, gamma):
        b_, n_, m_ = d.shape
        r = np.full((b_, n_ + 2, m_ + 2), np.inf)
        out = np.empty(b_)
        for b in range(b_):
            n, m = lengths[b, 0], lengths[b, 1]
            r[b, 0, 0] = 0.0
            for i in range(1, n + 1):
                for j in range(1, m + 1):
                    r0, r1, r2 = -r[b, i - 1, j - 1] / gamma, -r[b, i - 1, j] / gamma, \
                        -r[b, i, j - 1] / gamma
                    top = max(r0, r1, r2)
                    s = np.exp(r0 - top) + np.exp(r1 - top) + np.exp(r2 - top)
                    r[b, i, j] = d[b, i - 1, j - 1] - gamma * (np.log(s) + top)
            out[b] = r[b, n, m]
        return out, r

    def make_backward(k: int):
        @numba.njit(cache=False)
        def backward(d, r, lengths, gamma):
            b_, n_, m_ = d.shape
            e = np.zeros((b_, n_ + 2, m_ + 2))
            for b in range(b_):
                n, m = lengths[b, 0], lengths[b, 1]
                rr = r[b].copy()
                dd = np.zeros((n_ + 2, m_ + 2))
                dd[1:n + 1, 1:m + 1] = d[b, :n, :m]
                rr[:, m + 1] = -np.inf
                rr[n + 1, :] = -np.inf
                rr[n + 1, m + 1] = rr[n, m]
                e[b, n + 1, m + 1] = 1.0
                for i in range(n, 0, -1):
                    for j in range(m, 0, -1):
                        a = np.exp((rr[i + 1, j] - rr[i, j] - dd[i + 1, j]) / gamma)
                        c = np.exp((rr[i, j + 1] - rr[i, j] - dd[i, j + 1]) / gamma)
                        # the diagonal move's cost at (i + k, j + k): k = 0 is the seeded
                        # index slip (the cell's own cost), k = 1 the right one
                        g = np.exp((rr[i + 1, j + 1] - rr[i, j] - dd[i + k, j + k]) / gamma)
                        e[b, i, j] = e[b, i + 1, j] * a + e[b, i, j + 1] * c + \
                            e[b, i + 1, j + 1] * g
                # the end cell's seed is no element of d where lengths stop short of the
                # shape (pysdtw 0.0.5 leaves it there: a gradient of 1 on unused padding)
                e[b, n + 1, m + 1] = 0.0
            return e[:, 1:n_ + 1, 1:m_ + 1]
        return backward

    return forward, make_backward(1), make_backward(0)


def soft_dtw(seeded: bool, counter: Counter) -> type:
    """A torch Function over this file's kernels (counted), correct or with the seeded bug."""
    import torch
    from torch.autograd.function import once_differentiable

    fwd, bwd, bad = _kernels()
    backward_kernel = bad if seeded else bwd

    class NumbaSoftDTW(torch.autograd.Function):
        @staticmethod
        def forward(ctx, d, lengths, gamma):
            counter["forward"] += 1
            out, r = fwd(d.detach().cpu().numpy(), lengths.numpy(), gamma)
            ctx.save_for_backward(d, torch.from_numpy(r), lengths)
            ctx.gamma = gamma
            return torch.from_numpy(out).to(d.device)

        @staticmethod
        @once_differentiable
        def backward(ctx, grad):
            d, r, lengths = ctx.saved_tensors
            counter["backward"] += 1
            e = backward_kernel(d.detach().cpu().numpy(), r.numpy(), lengths.numpy(), ctx.gamma)
            return grad.view(-1, 1, 1) * torch.from_numpy(e).to(d.device), None, None

    NumbaSoftDTW.__qualname__ = "NumbaSoftDTW" + ("Seeded" if seeded else "")
    return NumbaSoftDTW


def pysdtw_counted(counter: Counter) -> Callable[..., Any]:
    """pysdtw's SoftDTWcpu.apply with its two kernels counted (module globals its Function
    looks up at every call)."""
    import pysdtw.sdtw_cpu as module

    for name, kind in (("compute_softdtw", "forward"), ("compute_softdtw_backward", "backward")):
        kernel = getattr(module, name)
        kernel = getattr(kernel, "_counted_from", kernel)

        def counted(*args: Any, _kernel: Any = kernel, _kind: str = kind) -> Any:
            counter[_kind] += 1
            return _kernel(*args)

        counted._counted_from = kernel  # type: ignore[attr-defined]
        setattr(module, name, counted)
    return module.SoftDTWcpu.apply


def rows() -> list[tuple[str, str]]:
    """(target, lengths) of every row this environment can run."""
    found = [(t, k) for t in ("pysdtw SoftDTWcpu",) for k in LENGTHS] if not pysdtw_missing() \
        else []
    return found + [(t, k) for t in ("numba soft-DTW", "numba soft-DTW seeded") for k in LENGTHS]


def target(name: str, lengths: str, counter: Counter) -> tuple[Callable[..., Any], Any]:
    """(fn of D, D) for a row: D 2x5x6 float64, seed 0."""
    import torch

    torch.manual_seed(0)
    d = torch.rand(*SHAPE, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor(LENGTHS[lengths])
    if name.startswith("pysdtw"):
        apply = pysdtw_counted(counter)
        return (lambda x: apply(x, lens, 1.0, 0.0)), d
    cls = soft_dtw(name.endswith("seeded"), counter)
    return (lambda x: cls.apply(x, lens, 1.0)), d


# --- timing -------------------------------------------------------------------------------------

def gradtool_run(fn: Callable[..., Any], d: Any) -> dict[str, Any]:
    import gradtool

    start, cpu = time.perf_counter(), time.process_time()
    report = gradtool.check(fn, (d,))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    checks = {c.name: {"outcome": c.outcome.value, "s": c.duration_s,
                       "rules": sorted({f.rule for f in c.findings} |
                                       {f"{c.name}.mismatch" for b in c.blocks if b.mismatched})}
              for _, _, c in report.checks()}
    return {"s": seconds, "cpu": cpu, "checks": checks, "parts": report.time_parts()}


def gradcheck_run(fn: Callable[..., Any], d: Any) -> dict[str, Any]:
    from torch.autograd import gradcheck, gradgradcheck

    out: dict[str, Any] = {}
    for check in (gradcheck, gradgradcheck):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            ok: Any = bool(check(fn, (d,), fast_mode=False, raise_exception=False))
        except Exception as exc:  # noqa: BLE001 - once_differentiable: gradgradcheck raises
            ok = f"raised {type(exc).__name__}"
        out[check.__name__] = {"s": time.perf_counter() - start,
                               "cpu": time.process_time() - cpu, "ok": ok}
    both = list(out.values())
    out["s"], out["cpu"] = sum(v["s"] for v in both), sum(v["cpu"] for v in both)
    return out


def one_thread() -> None:
    """torch and numba on one thread each: a parallel kernel waiting for its threads on a
    shared machine costs more than the kernel (tens of ms per call at load 4 on 2 cores)."""
    import numba
    import torch

    torch.set_num_threads(1)
    numba.set_num_threads(1)


def warm(name: str, lengths: str, repeats: int) -> dict[str, Any]:
    """Both tools after one call each (numba compiled for every layout either passes),
    interleaved, the order rotated each round; evaluations from one round."""
    one_thread()
    counter: Counter = Counter()
    fn, d = target(name, lengths, counter)
    tools = {"gradtool": gradtool_run, "gradcheck": gradcheck_run}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in tools}
    counts: dict[str, dict[str, int]] = {}
    for k, tool in tools.items():  # warm-up, and the counts (deterministic)
        counter.clear()
        tool(fn, d)
        counts[k] = dict(counter)
    names = list(tools)
    for r in range(repeats):
        for k in names[r % 2:] + names[:r % 2]:
            runs[k].append(tools[k](fn, d))
    med = {k: statistics.median(x["s"] for x in v) for k, v in runs.items()}
    # CPU seconds (one thread each: the work itself), what a shared machine's load blurs least
    cpu = {k: statistics.median(x["cpu"] for x in v) for k, v in runs.items()}
    gc_alone = statistics.median(x["gradcheck"]["s"] for x in runs["gradcheck"])
    checks = {c: {"outcome": v["outcome"], "rules": v["rules"],
                  "s": statistics.median(x["checks"][c]["s"] for x in runs["gradtool"])}
              for c, v in runs["gradtool"][-1]["checks"].items()}
    return {"target": name, "lengths": lengths, "gradtool_s": med["gradtool"],
            "gradcheck_both_s": med["gradcheck"], "gradcheck_s": gc_alone,
            "ratio": med["gradtool"] / med["gradcheck"],
            "cpu_ratio": cpu["gradtool"] / cpu["gradcheck"],
            "cpu_ratio_gradcheck": cpu["gradtool"] / statistics.median(
                x["gradcheck"]["cpu"] for x in runs["gradcheck"]),
            "ratio_gradcheck": med["gradtool"] / gc_alone, "cpu_s": cpu,
            "checks": checks, "gradcheck": {k: runs["gradcheck"][-1][k]["ok"]
                                            for k in ("gradcheck", "gradgradcheck")},
            "evaluations": counts}


def cold(name: str, lengths: str, tool: str) -> dict[str, Any]:
    """One tool's first call in this (fresh) process: seconds, and the signatures each kernel
    compiled."""
    one_thread()
    counter: Counter = Counter()
    fn, d = target(name, lengths, counter)
    run = gradtool_run if tool == "gradtool" else gradcheck_run
    start = time.perf_counter()
    run(fn, d)
    seconds = time.perf_counter() - start
    return {"s": seconds, "signatures": compiled(name)}


def compiled(name: str) -> dict[str, int]:
    """How many signatures each numba kernel of the row compiled in this process."""
    if name.startswith("pysdtw"):
        import pysdtw.sdtw_cpu as module

        kernels = {k: getattr(getattr(module, k), "_counted_from", getattr(module, k))
                   for k in ("compute_softdtw", "compute_softdtw_backward")}
    else:
        fwd, bwd, bad = _kernels()
        kernels = {"forward": fwd, "backward": bad if name.endswith("seeded") else bwd}
    return {k: len(v.signatures) for k, v in kernels.items()}


def cold_rows(targets: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each (row, tool) in a fresh process: the first call, compilation included."""
    out = []
    for name, lengths in targets:
        row: dict[str, Any] = {"target": name, "lengths": lengths}
        for tool in ("gradtool", "gradcheck"):
            proc = subprocess.run([sys.executable, __file__, "--cold-one", name, lengths, tool]
                                  + ([f"--path={INSTALLED[0]}"] if INSTALLED else []),
                                  capture_output=True, text=True, check=True)
            row[tool] = json.loads(proc.stdout.strip().splitlines()[-1])
        out.append(row)
    return out


# --- report -------------------------------------------------------------------------------------

def table(found: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | lengths | gradtool, every default check (verdicts) | gradcheck + "
             "gradgradcheck slow | ratio (CPU time) | to gradcheck alone (CPU time) | kernel "
             "calls gradtool (fwd/bwd) | gradcheck + gg |", "|---" * 8 + "|"]
    for r in found:
        verdicts = ", ".join(f"{c} {v['outcome']}" for c, v in r["checks"].items())
        t, g = r["evaluations"]["gradtool"], r["evaluations"]["gradcheck"]
        lines.append(
            f"| {r['target']} | {r['lengths']} | {r['gradtool_s'] * 1e3:.1f} ms ({verdicts}) | "
            f"{r['gradcheck_both_s'] * 1e3:.1f} ms (gradcheck {r['gradcheck']['gradcheck']}, "
            f"gradgradcheck {r['gradcheck']['gradgradcheck']}) | {r['ratio']:.2f}× "
            f"({r['cpu_ratio']:.2f}×) | {r['ratio_gradcheck']:.2f}× "
            f"({r['cpu_ratio_gradcheck']:.2f}×) | {t.get('forward', 0)}/{t.get('backward', 0)} | "
            f"{g.get('forward', 0)}/{g.get('backward', 0)} |")
    return lines


def per_check(found: list[dict[str, Any]]) -> list[str]:
    return [f"{r['target']} ({r['lengths']}): " + ", ".join(
        f"{c} {v['s'] * 1e3:.1f} ms {v['outcome']}"
        + (f" [{', '.join(v['rules'])}]" if v["rules"] else "")
        for c, v in r["checks"].items()) for r in found]


def cold_table(found: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | lengths | gradtool's first call | signatures compiled | gradcheck + "
             "gradgradcheck's first call | signatures compiled |", "|---" * 6 + "|"]
    for r in found:
        t, g = r["gradtool"], r["gradcheck"]
        lines.append(f"| {r['target']} | {r['lengths']} | {t['s']:.2f} s | "
                     f"{t['signatures']} | {g['s']:.2f} s | {g['signatures']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-cold", action="store_true", help="warm rows only")
    parser.add_argument("--install", type=Path, help=f"pip install {PIN} into this folder")
    parser.add_argument("--cold-one", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.path:
        sys.path.insert(0, args.path)
    if args.install:
        install(args.install)
    if args.cold_one:
        print(json.dumps(cold(*args.cold_one)))
        return 0
    why = missing()
    if why:
        print(why)
        return 0
    print(load())
    skipped = pysdtw_missing()
    if skipped:
        print(skipped)
    targets = rows()
    found = [warm(name, lengths, args.repeats) for name, lengths in targets]
    print(load())
    print("\n".join(table(found)))
    print("\n".join(per_check(found)))
    total = [sum(r[k] for r in found) for k in ("gradtool_s", "gradcheck_both_s", "gradcheck_s")]
    cpu = [sum(r["cpu_s"][k] for r in found) for k in ("gradtool", "gradcheck")]
    print(f"aggregate: {total[0] * 1e3:.1f} ms against {total[1] * 1e3:.1f} ms = "
          f"{total[0] / total[1]:.2f}× (gradcheck alone {total[2] * 1e3:.1f} ms: "
          f"{total[0] / total[2]:.2f}×); CPU time {cpu[0] * 1e3:.1f} ms against "
          f"{cpu[1] * 1e3:.1f} ms = {cpu[0] / cpu[1]:.2f}×")
    out: dict[str, Any] = {"warm": found, "load": load()}
    if not args.no_cold:
        out["cold"] = cold_rows(targets)
        print("\n".join(cold_table(out["cold"])))
    RESULTS.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
