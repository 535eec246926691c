"""Cold start: each check's first-use cost in a fresh process, and whole-process CLI times."""

# Per check: a fresh process imports torch and gradtool, then runs gradtool.check on a small
# target with only that check, twice. The first call minus the second is the check's fixed
# first-use cost (imports, lazy initialisation); the modules the first call imported are
# listed, heavy families (torch._dynamo, sympy, torch.distributed, torch.onnx) named.
# Whole process: `python -c "import torch"`, `gradtool check` of a tiny Function (isolated
# worker included) and `gradtool --help`, interleaved round by round, medians.
#
#   python benchmarks/coldstart.py [--repeats 7] [--out benchmarks/results/coldstart.json]

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = "specs/examples"
HEAVY = ("torch._dynamo", "sympy", "torch.distributed", "torch.onnx", "torch._inductor")

# check -> (target, inputs, settings): a small target where the check applies
CHECKS = {
    "contract": (f"{EXAMPLES}/cube.py:MyCube", ["3x4"], {}),
    "gradient": (f"{EXAMPLES}/cube.py:MyCube", ["3x4"], {}),
    "double_backward": (f"{EXAMPLES}/cube.py:MyCube", ["3x4"], {}),
    "forward_ad": (f"{EXAMPLES}/jvp_vmap_complex.py:ScaledTanh", ["3x4", "3x4"], {}),
    "vmap": (f"{EXAMPLES}/jvp_vmap_complex.py:Softplus", ["3x4"], {}),
    "complex": (f"{EXAMPLES}/jvp_vmap_complex.py:RealToComplex", ["3x4"], {}),
    "gradient (float32: precision)": (f"{EXAMPLES}/cube.py:MyCube", ["3x4"],
                                      {"dtype": "float32"}),
    "compiled (opt-in)": (f"{EXAMPLES}/jvp_vmap_complex.py:Softplus", ["3x4"], {}),
}

CHILD = """
import sys, time, json
t0, c0 = time.perf_counter(), time.process_time()
import torch
torch.set_num_threads(1)
t1, c1 = time.perf_counter(), time.process_time()
import gradtool
t2 = time.perf_counter()
target, inputs, settings, check = json.loads(sys.argv[1])
before = set(sys.modules)
t3, c3 = time.perf_counter(), time.process_time()
report = gradtool.check(target, inputs, checks=[check], **settings)
t4, c4 = time.perf_counter(), time.process_time()
new = sorted(set(sys.modules) - before)
gradtool.check(target, inputs, checks=[check], **settings)
t5, c5 = time.perf_counter(), time.process_time()
outcomes = [r.outcome.value for t in report.targets for c in t.cases for r in c.checks]
print(json.dumps({"import_torch": t1 - t0, "import_gradtool": t2 - t1, "first": t4 - t3,
                  "second": t5 - t4, "modules": len(new), "outcomes": outcomes,
                  "cpu_import_torch": c1 - c0, "cpu_first": c4 - c3, "cpu_second": c5 - c4,
                  "heavy": [h for h in %r if h in new]}))
"""


def environment() -> dict[str, str]:
    """One thread; bytecode cached as on a user's machine (the sandbox sets
    PYTHONDONTWRITEBYTECODE, which would recompile gradtool in every process), kept out of the
    repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=str(Path(tempfile.gettempdir())
                                                          / "gradtool-pycache"))
    return env


def per_check(repeats: int, env: dict[str, str]) -> dict[str, dict]:
    """Each check's first call and second call in fresh processes (medians over repeats)."""
    out = {}
    code = CHILD % (HEAVY,)
    for name, (target, inputs, settings) in CHECKS.items():
        check = name.split(" ")[0]
        runs = []
        for _ in range(repeats):
            arg = json.dumps([target, inputs, settings, check])
            done = subprocess.run([sys.executable, "-c", code, arg], capture_output=True,
                                  text=True, cwd=ROOT, env=env)
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr.strip()[-2000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("import_torch", "import_gradtool", "first", "second",
                         "cpu_import_torch", "cpu_first", "cpu_second")}
        out[name] = {**med, "modules": runs[-1]["modules"], "heavy": runs[-1]["heavy"],
                     "outcomes": runs[-1]["outcomes"]}
    return out


def whole_process(repeats: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Wall times of fresh processes, interleaved round by round, the order rotated."""
    py = sys.executable
    commands = {
        "python -c 'import torch'": [py, "-c", "import torch"],
        # gradtool's worker leaves by os._exit, skipping torch's tear-down (~0.5 s CPU)
        "python -c 'import torch; os._exit(0)'": [py, "-c", "import os, torch; os._exit(0)"],
        "gradtool --help": [py, "-m", "gradtool", "--help"],
        "gradtool check cube.py:MyCube (isolated)": [py, "-m", "gradtool", "check",
                                                     f"{EXAMPLES}/cube.py:MyCube"],
        "gradtool check cube.py:MyCube --no-isolate": [py, "-m", "gradtool", "check",
                                                       f"{EXAMPLES}/cube.py:MyCube",
                                                       "--no-isolate"],
        "gradtool check jvp_vmap_complex.py:Softplus (vmap on)": [
            py, "-m", "gradtool", "check", f"{EXAMPLES}/jvp_vmap_complex.py:Softplus"],
    }
    for command in commands.values():  # untimed: fills the bytecode cache
        subprocess.run(command, capture_output=True, cwd=ROOT, env=env)
    times: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    names = list(commands)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = subprocess.run(commands[name], capture_output=True, cwd=ROOT, env=env)
            times[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            if done.returncode:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]!r}")
    return {"wall": times, "cpu": cpu}


def table(data: dict) -> str:
    """Markdown tables of a run."""
    load = ", ".join(f"{x:.1f}" for x in data["load_before"])
    lines = [f"Load average at the start: {load}; at the end: "
             f"{', '.join(f'{x:.1f}' for x in data['load_after'])} (2 cores).", "",
             "| check (fresh process) | `import torch` wall / CPU | first call wall / CPU | "
             "second call wall / CPU | first-use cost (CPU) | modules imported by the first call "
             "| heavy imports |", "|---|---|---|---|---|---|---|"]
    for name, r in data["checks"].items():
        lines.append(f"| {name} | {r['import_torch']:.2f} / {r['cpu_import_torch']:.2f} s | "
                     f"{r['first'] * 1e3:.0f} / {r['cpu_first'] * 1e3:.0f} ms | "
                     f"{r['second'] * 1e3:.0f} / {r['cpu_second'] * 1e3:.0f} ms | "
                     f"{(r['cpu_first'] - r['cpu_second']) * 1e3:.0f} ms | {r['modules']} | "
                     f"{', '.join(r['heavy']) or 'none'} |")
    lines += ["", "| whole process | wall median (min) | CPU median (min) | wall − `import torch` "
              "| CPU − `import torch` |", "|---|---|---|---|---|"]
    base = {k: statistics.median(data["processes"][k]["python -c 'import torch'"])
            for k in ("wall", "cpu")}
    for name in data["processes"]["wall"]:
        wall, cpu = data["processes"]["wall"][name], data["processes"]["cpu"][name]
        lines.append(f"| `{name}` | {statistics.median(wall):.3f} s ({min(wall):.3f}) | "
                     f"{statistics.median(cpu):.3f} s ({min(cpu):.3f}) | "
                     f"{statistics.median(wall) - base['wall']:+.3f} s | "
                     f"{statistics.median(cpu) - base['cpu']:+.3f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "coldstart.json")
    parser.add_argument("--table", action="store_true", help="reprint the saved table")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return 0
    env = environment()
    data = {"load_before": os.getloadavg()}
    data["checks"] = per_check(max(1, args.repeats // 2), env)
    data["processes"] = whole_process(args.repeats, env)
    data["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(data, indent=1))
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
