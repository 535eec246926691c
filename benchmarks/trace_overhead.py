"""What `gradtool trace`'s recording costs a training script: the same steps with and without it.

Two small training loops (one intra-op thread), each timed plain and recorded, interleaved, in
one process, medians of the rounds; then the whole command against `python script.py`:

- mlp: a 4-layer MLP (batch 64, width 256) with a custom activation Function per layer and a
  custom row reduction: the calls carry real work, as a model's kernels do.
- tiny: a loop of 64 custom Function calls on 8-element tensors per step: nearly nothing but
  calls, the recording's worst case.
- per call: one repeated Function.apply (forward only), plain and recorded.

The whole-process line (`python train.py` against `gradtool trace --list`) is dominated by
importing torch and by interpreter teardown (the recording worker exits without it), so it is
not the recording's cost; the in-process ratios are.

python benchmarks/trace_overhead.py [--steps 200] [--rounds 7]   # writes results/trace.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from gradtool.run.trace import Recorder, hooked

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "fixtures" / "trace" / "train.py"


class Act(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - torch.tanh(x) ** 2)


class RowSumSq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x * x).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad.unsqueeze(-1)


def mlp_step(layers, opt, x):
    h = x
    for layer in layers:
        h = Act.apply(layer(h))
    loss = RowSumSq.apply(h).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def tiny_step(w, x):
    h = x * w
    for _ in range(64):
        h = Act.apply(h)
    h.sum().backward()


def workloads():
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    w = torch.randn(8, requires_grad=True)
    small = torch.randn(8)
    return {"mlp": lambda: mlp_step(layers, opt, x), "tiny": lambda: tiny_step(w, small)}


def timed(step, steps, recorded, folder):
    recorder = Recorder(folder, 1000, "benchmark", lambda message: None)
    start = time.perf_counter()
    if recorded:
        with hooked(recorder):
            for _ in range(steps):
                step()
    else:
        for _ in range(steps):
            step()
    return time.perf_counter() - start


def in_process(steps, rounds):
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, step in workloads().items():
            step()  # warm-up
            plain, traced = [], []
            for k in range(rounds):
                order = (False, True) if k % 2 == 0 else (True, False)  # rotate the order
                for recorded in order:
                    (traced if recorded else plain).append(timed(step, steps, recorded, folder))
            p, t = statistics.median(plain), statistics.median(traced)
            rows[name] = {"plain_s": p, "recorded_s": t, "ratio": t / p,
                          "per_step_us": {"plain": 1e6 * p / steps, "recorded": 1e6 * t / steps}}
    return rows


def per_call(rounds, calls=20000):
    """Microseconds one repeated Function.apply costs, plain and recorded (8-element input)."""
    t = torch.randn(8, requires_grad=True)
    plain, traced = [], []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(rounds):
            for recorded in ((False, True) if k % 2 == 0 else (True, False)):
                recorder = Recorder(folder, 1000, "benchmark", lambda message: None)
                start = time.perf_counter()
                if recorded:
                    with hooked(recorder):
                        for _ in range(calls):
                            Act.apply(t)
                else:
                    for _ in range(calls):
                        Act.apply(t)
                (traced if recorded else plain).append((time.perf_counter() - start) / calls)
    p, r = statistics.median(plain), statistics.median(traced)
    return {"plain_us": 1e6 * p, "recorded_us": 1e6 * r, "overhead_us": 1e6 * (r - p)}


def whole_process(rounds):
    """`python train.py` against `gradtool trace --list train.py` (recording only, no checks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain_cmd = [sys.executable, str(SCRIPT), "--steps", "20"]
    trace_cmd = [sys.executable, "-m", "gradtool", "trace", "--list", str(SCRIPT), "--",
                 "--steps", "20"]
    plain, traced = [], []
    for k in range(rounds):
        for cmd, into in ((plain_cmd, plain), (trace_cmd, traced))[:: 1 if k % 2 == 0 else -1]:
            start = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, check=True)
            into.append(time.perf_counter() - start)
    p, t = statistics.median(plain), statistics.median(traced)
    return {"plain_s": p, "trace_list_s": t, "ratio": t / p}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"in_process": in_process(args.steps, args.rounds),
              "per_call": per_call(args.rounds),
              "whole_process": whole_process(max(3, args.rounds // 2)),
              "steps": args.steps, "rounds": args.rounds,
              "machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "cpus": os.cpu_count(), "load": os.getloadavg()}}
    for name, row in result["in_process"].items():
        print(f"{name:5s} plain {row['per_step_us']['plain']:9.1f} us/step   recorded "
              f"{row['per_step_us']['recorded']:9.1f} us/step   ratio {row['ratio']:.3f}")
    call = result["per_call"]
    print(f"one repeated apply: plain {call['plain_us']:.1f} us, recorded {call['recorded_us']:.1f}"
          f" us, overhead {call['overhead_us']:.1f} us")
    whole = result["whole_process"]
    print(f"whole process: python train.py {whole['plain_s']:.2f} s, gradtool trace --list "
          f"{whole['trace_list_s']:.2f} s, ratio {whole['ratio']:.2f}")
    out = ROOT / "benchmarks" / "results" / "trace.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
