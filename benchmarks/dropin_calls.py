"""Per-call cost of gradtool.gradcheck against torch's gradcheck on tiny problems, in process.

Usage: python benchmarks/dropin_calls.py [--repeat 30] [--clock cpu|wall] [--first] [--failing]
Prints, per problem and mode (torch's fast_mode=True against gradtool's fast mode, torch's slow
mode against gradtool's full mode), each side's median milliseconds per call, interleaved call
by call so that load affects both alike, and their ratio. The clock is this process's CPU time
by default (a shared machine's load then stretches neither side); --clock wall for wall time. --first times the first call of a fresh
process each way (imports included), in two subprocesses per side. --failing times failing calls
instead (seeded bugs in tests/fixtures/counted.py's Functions: a tiny one, an adaptive solver
vmap cannot batch, a fixed-step one it can, and the same adaptive solver 20 times as costly per
evaluation), each side's forward and backward evaluations beside its time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

FIRST = """
import time, torch
torch.set_num_threads(1)
x = torch.randn(10, dtype=torch.float64, requires_grad=True)
start = time.perf_counter()
{setup}
check(lambda a: (a * a.sin()).sum(0), (x,))
print(time.perf_counter() - start)
"""


def problems():
    """(name, func, inputs): tiny Functions and composites (<= 100 elements), and one larger."""
    import torch
    from torch.autograd import Function

    from bugs import Cube  # tests/fixtures: the suite's own correct twin

    class Bilinear(Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return grad @ w.T, x.T @ grad

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    return [
        ("Function 10", Cube.apply, (r(10),)),
        ("Function 2 inputs 4x5,5x3", Bilinear.apply, (r(4, 5), r(5, 3))),
        ("composite 10", lambda a: (a * a.sin()).cumsum(0), (r(10),)),
        ("composite 2 inputs 6x6", lambda a, b: torch.tanh(a @ b) + a, (r(6, 6), r(6, 6))),
        ("module Linear(8, 4) on 3x8", torch.nn.Linear(8, 4).double(), (r(3, 8),)),
        # larger than tiny: where gradtool's batched sweeps keep their advantage
        ("larger: composite 2 inputs 16x16", lambda a, b: torch.tanh(a @ b) + a,
         (r(16, 16), r(16, 16))),
    ]


def failing_problems():
    """(name, Function, input): counted.py's Functions with a seeded bug (backward 1.01x)."""
    import torch

    from counted import make

    def r(n):
        return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n),
                           requires_grad=True)

    return [(f"{kind} {n}{' x20 work' if work > 1 else ''}", make(kind, "scale", work), r(n))
            for kind, n, work in (("tiny", 10, 1), ("adaptive", 8, 1), ("adaptive", 8, 20),
                                  ("solver", 64, 1), ("adaptive", 64, 1))]


def failing(repeat: int, clock) -> None:
    """Failing calls: each side's evaluations (forward/backward) and median time, paired."""
    import torch
    from torch.autograd.gradcheck import GradcheckError

    import gradtool
    from counted import counted

    def fails(check, func, x, fast):
        try:
            check(func, (x,), fast_mode=fast)
        except GradcheckError:
            return
        raise AssertionError("the seeded bug passed")

    print(f"{'failing call':22} {'mode':5} {'torch F/B':>10} {'gradtool F/B':>13} "
          f"{'torch ms':>9} {'gradtool ms':>12} {'ratio':>6}")
    for name, cls, x in failing_problems():
        for mode, fast in (("fast", True), ("slow", False)):
            counts = [counted(check, cls.apply, (x,), fast_mode=fast)[1]
                      for check in (torch.autograd.gradcheck, gradtool.gradcheck)]
            theirs, ours = interleaved(
                [lambda: fails(torch.autograd.gradcheck, cls.apply, x, fast),
                 lambda: fails(gradtool.gradcheck, cls.apply, x, fast)], repeat, clock)
            t, g = (f"{c['forward']}/{c['backward']}" for c in counts)
            print(f"{name:22} {mode:5} {t:>10} {g:>13} {theirs * 1e3:9.2f} {ours * 1e3:12.2f} "
                  f"{ours / theirs:6.2f}")


def interleaved(calls, repeat, clock=time.process_time):
    """Median seconds of each call, run in turn `repeat` times (after one warm-up each)."""
    times = [[] for _ in calls]
    for call in calls:
        call()
    for _ in range(repeat):
        for k, call in enumerate(calls):
            start = clock()
            call()
            times[k].append(clock() - start)
    return [statistics.median(t) for t in times]


def first_call(setup: str) -> float:
    out = subprocess.run([sys.executable, "-c", FIRST.format(setup=setup)], check=True,
                         capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--first", action="store_true")
    parser.add_argument("--failing", action="store_true")
    args = parser.parse_args()

    import torch

    import gradtool

    torch.set_num_threads(1)
    if args.failing:
        print(f"{args.clock} time, median of {args.repeat} interleaved calls")
        return failing(args.repeat, time.process_time if args.clock == "cpu" else time.perf_counter)
    print(f"{args.clock} time, median of {args.repeat} interleaved calls")
    print(f"{'problem':32} {'mode':5} {'torch ms':>9} {'gradtool ms':>12} {'ratio':>6}")
    for name, func, inputs in problems():
        for mode, fast in (("fast", True), ("slow", False)):
            theirs, ours = interleaved(
                [lambda: torch.autograd.gradcheck(func, inputs, fast_mode=fast),
                 lambda: gradtool.gradcheck(func, inputs, fast_mode=fast)], args.repeat,
                time.process_time if args.clock == "cpu" else time.perf_counter)
            print(f"{name:32} {mode:5} {theirs * 1e3:9.2f} {ours * 1e3:12.2f} "
                  f"{ours / theirs:6.2f}")
    if args.first:
        theirs = min(first_call("from torch.autograd import gradcheck as check")
                     for _ in range(2))
        ours = min(first_call("from gradtool import gradcheck as check") for _ in range(2))
        print(f"first call in a process (imports included): torch {theirs:.3f} s, gradtool "
              f"{ours:.3f} s, {ours - theirs:+.3f} s")


if __name__ == "__main__":
    main()
