"""Measuring pieces for vs_gradcheck.py: timed runs, call counts, memory and start-up."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import gradcheck, gradgradcheck

from gradtool.targets.cases import build_case
from gradtool.checks.double_backward import check_double_backward
from gradtool.checks.gradient import check_gradient
from gradtool.config.settings import CheckConfig
from gradtool.targets.inputs import parse_input
from gradtool.targets.resolve import make_target

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "bugs.py"


@dataclass
class Run:
    """One timed run: seconds, forward/backward evaluations, what it concluded."""

    seconds: float
    forward: int
    backward: int
    ok: bool                      # passed (gradtool: outcome passed; gradcheck: returned True)
    mode: str | None = None
    reason: str | None = None


@dataclass
class Workload:
    """A target and its inputs (gradtool's input mini-language), checked one way."""

    name: str
    cls: type
    inputs: list[str]
    check: str = "gradient"       # or "double_backward"
    sizes: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)

    def case(self, seed: int, config: CheckConfig) -> Any:
        target = make_target(self.cls, f"bugs:{self.cls.__name__}")
        return target, build_case(target, [parse_input(s) for s in self.inputs], config, seed)


def sizes(workload: Workload) -> tuple[int, int]:
    """(n_in, n_out) of the Jacobian that the check compares."""
    config = CheckConfig(checks=(workload.check,))
    _, case = workload.case(0, config)
    args = [a for a in case.problem.args if isinstance(a, torch.Tensor)]
    outs = case.problem.fn(*case.problem.args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    n_in, n_out = sum(a.numel() for a in args), sum(o.numel() for o in outs)
    if workload.check == "double_backward":  # G(x, v) = vᵀ ∂f/∂x
        return n_in + n_out, n_in
    return n_in, n_out


def run_gradtool(workload: Workload, mode: str, seed: int = 0) -> Run:
    """gradtool's check on a prepared case (sampling outside the timer, as gradcheck's)."""
    config = CheckConfig(mode=mode, checks=(workload.check,), seed=seed, max_memory=8e9)
    target, case = workload.case(seed, config)
    start = time.perf_counter()
    if workload.check == "gradient":
        result = check_gradient(case, target, config)
    else:
        result = check_double_backward(case, target, config)
    seconds = time.perf_counter() - start
    calls = result.calls
    return Run(seconds, calls.get("forward", 0), calls.get("backward", 0),
               result.outcome.value == "passed", result.mode, result.mode_reason)


def run_gradtool_api(workload: Workload, mode: str = "auto", seed: int = 0) -> Run:
    """The whole library call, as a user makes it: target introspection and sampling included."""
    import gradtool

    start = time.perf_counter()
    report = gradtool.check(workload.cls, workload.inputs, mode=mode, checks=(workload.check,),
                            seed=seed, max_memory=8e9)
    seconds = time.perf_counter() - start
    check = next(c for _, _, c in report.checks())
    return Run(seconds, check.calls.get("forward", 0), check.calls.get("backward", 0),
               check.outcome.value == "passed", check.mode)


def counting(cls: type, counter: Counter) -> type:
    """A subclass of the Function that counts its forward and backward calls."""

    class Counted(cls):  # type: ignore[misc, valid-type]
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            counter["forward"] += 1
            return cls.forward(ctx, *args)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            counter["backward"] += 1
            return cls.backward(ctx, *grads)

    return Counted


def run_gradcheck(workload: Workload, fast: bool, seed: int = 0) -> Run:
    """torch.autograd.gradcheck (or gradgradcheck) on the very tensors gradtool samples."""
    config = CheckConfig(checks=(workload.check,), seed=seed)
    _, case = workload.case(seed, config)
    args = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a
            for a in case.problem.args]
    counter: Counter = Counter()
    fn = counting(workload.cls, counter).apply
    check: Callable[..., bool] = gradcheck if workload.check == "gradient" else gradgradcheck
    start = time.perf_counter()
    ok = check(fn, tuple(args), fast_mode=fast, raise_exception=False)
    return Run(time.perf_counter() - start, counter["forward"], counter["backward"], bool(ok))


def interleaved(runners: dict[str, Callable[[], Run]], repeats: int) -> dict[str, list[Run]]:
    """Each runner once per round, the order rotated every round (contention hits all alike)."""
    names = list(runners)
    out: dict[str, list[Run]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out[name].append(runners[name]())
    return out


def median_seconds(runs: Sequence[Run]) -> float:
    return statistics.median(r.seconds for r in runs)


def gradcheck_estimate(n_in: int, n_out: int, double: bool = False) -> dict[str, float]:
    """What slow mode would do: 2 n_in forwards, n_out backwards, dense Jacobians (~56 B each)."""
    return {"forward": 2 * n_in, "backward": n_out, "memory_bytes": 56.0 * n_in * n_out}


def peak_memory(workload: Workload, mode: str) -> dict[str, float]:
    """Extra peak resident memory of one gradtool check, in a fresh process: a thread samples
    /proc/self/statm every millisecond (ru_maxrss would only show the import's peak)."""
    code = (
        "import sys, threading, time, torch\n"
        "torch.set_num_threads(1)\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import vs_gradcheck as v\n"
        "from harness import run_gradtool\n"
        "page = __import__('os').sysconf('SC_PAGE_SIZE')\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * page\n"
        "run_gradtool(v.workload_named('elementwise 10'), 'full')\n"
        f"w = v.workload_named({workload.name!r})\n"
        "peak, done = [0], [False]\n"
        "def watch():\n"
        "    while not done[0]:\n"
        "        peak[0] = max(peak[0], rss()); time.sleep(0.001)\n"
        "before = rss(); t = threading.Thread(target=watch); t.start()\n"
        f"run = run_gradtool(w, {mode!r})\n"
        "done[0] = True; t.join()\n"
        "print(before, max(peak[0], rss()), run.seconds)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    before, after, seconds = map(float, out.stdout.split())
    return {"extra_bytes": max(0.0, after - before), "seconds": seconds}


def cold_start(repeats: int) -> dict[str, Any]:
    """Wall time of fresh processes: import torch, import gradtool, --help, a tiny check."""
    py = sys.executable
    check = [py, "-m", "gradtool", "check", f"{FIXTURE}:Cube", "-i", "(10,)", "--quiet"]
    commands = {
        "python -c 'import torch'": [py, "-c", "import torch"],
        "python -c 'import gradtool'": [py, "-c", "import gradtool"],
        "gradtool --help": [py, "-m", "gradtool", "--help"],
        "gradtool check (tiny Function)": check,
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    # Bytecode cached as on a user's machine (this sandbox sets PYTHONDONTWRITEBYTECODE, which
    # recompiles every module in every process), kept out of the repository.
    cache = tempfile.mkdtemp(prefix="gradtool-pycache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=cache)
    for command in commands.values():  # untimed: fills the bytecode cache
        subprocess.run(command, capture_output=True, cwd=ROOT, env=env)
    for r in range(repeats):
        for name in list(commands)[r % 4:] + list(commands)[:r % 4]:
            start = time.perf_counter()
            subprocess.run(commands[name], capture_output=True, cwd=ROOT, env=env)
            times[name].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) for k, v in times.items()}
    sympy = subprocess.run(
        [py, "-c", "import sys; sys.path.insert(0, 'tests/fixtures'); import gradtool, bugs; "
         "gradtool.check(bugs.Cube, ['(10,)']); print('sympy' in sys.modules)"],
        capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"median_s": medians, "sympy_imported_by_check": sympy == "True",
            "bytecode": "cached (PYTHONPYCACHEPREFIX in a temporary folder)",
            "check_minus_import_torch_s": medians["gradtool check (tiny Function)"]
            - medians["python -c 'import torch'"]}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "load_average": os.getloadavg(),
            "max_rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def per_check(report: Any) -> str:
    """'contract 0/6, gradient 25/6, layout 1/4+1/1 read': each check's evaluations, paid and
    read from the case's ledger (forward/backward), as its report says them."""
    out = []
    for _, _, c in report.checks():
        if c.outcome.value == "skipped":
            continue
        calls = c.calls
        text = f"{c.name} {calls.get('forward', 0)}/{calls.get('backward', 0)}"
        if calls.get("forward read") or calls.get("backward read"):
            text += f"+{calls.get('forward read', 0)}/{calls.get('backward read', 0)} read"
        out.append(text)
    return ", ".join(out)
