"""Third-party adjoint solvers (torchdiffeq, torchsde), correct and with seeded bugs: every
default gradtool check against gradcheck slow + gradgradcheck slow, warmed up, side by side."""

#     python benchmarks/adjoint_solvers.py [--repeats 3]
#
# Models nobody here wrote: torchdiffeq's `odeint_adjoint` on a linear vector field (and on
# a tanh field at a fine step, expensive enough that auto mode probes first) and torchsde's `sdeint_adjoint` (Stratonovich, reversible Heun: its adjoint is the exact gradient of
# the discrete solve, a fixed Brownian path), each an
# nn.Module whose only custom Function is the package's adjoint method. Their double backward
# fails as expected (an adjoint solve is not differentiable twice): the row that keeps
# "nothing to choose between" honest. Seeded bugs swap the package's adjoint Function for a
# subclass whose backward is wrong (every gradient doubled; the parameters' gradients dropped;
# the input's alone doubled; the weight's transposed: issue 50's first-order bugs). Each row:
# one warm-up of both tools, then gradtool.check (every default check) and gradcheck +
# gradgradcheck slow on the same tensors (the input and the parameters), interleaved round by
# round, one torch thread, medians, and gradtool's own split of its time (checks, setup, the
# run's own). Evaluations are counted at the package's Function (forward/backward calls) for
# both tools, in one more run of each after the timed rounds: gradtool's total and each
# check's (paid, and read from the case's ledger), gradcheck + gradgradcheck's, and gradcheck
# alone's (the drop-in's yardstick, with its time). A package that is not installed is skipped
# with a line saying so.

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402


@contextlib.contextmanager
def swapped(module: Any, name: str, replacement: type | None) -> Iterator[None]:
    """module.name replaced for the forward (the node's class then decides its backward)."""
    if replacement is None:
        yield
        return
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


@functools.cache
def seeded(base: type, bug: str | None) -> type:
    """A subclass of a package's adjoint Function whose backward has the seeded bug (one class
    per bug: a replayed forward applies the same one again), or none; its backward counted."""

    class Seeded(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            COUNTS["backward"] += 1
            _BACKWARD[0] += 1
            try:
                out = list(base.backward(ctx, *grads))
            finally:
                _BACKWARD[0] -= 1
            tensors = [k for k, g in enumerate(out) if isinstance(g, torch.Tensor)]
            return tuple(_seed(bug, out, tensors)) if bug else tuple(out)

    Seeded.__name__ = Seeded.__qualname__ = \
        f"{base.__name__}{(bug or '').title().replace(' ', '')}"
    return Seeded


class ODE(nn.Module):
    """y(1) of dy/dt = A y + b by torchdiffeq's odeint_adjoint (RK4, step 0.05)."""

    bug: str | None = None
    step, squash = 0.05, False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.field = nn.Linear(4, 4)
        with torch.no_grad():
            self.field.weight.mul_(0.5)

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        from torchdiffeq import odeint_adjoint
        from torchdiffeq._impl import adjoint

        t = torch.tensor([0.0, 1.0], dtype=y0.dtype)
        with swapped(adjoint, "OdeintAdjointMethod",
                     seeded(adjoint.OdeintAdjointMethod, self.bug)):
            return odeint_adjoint(self._field, y0, t, method="rk4",
                                  options={"step_size": self.step},
                                  adjoint_params=tuple(self.field.parameters()))[-1]


    def _field(self, _: Any, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.field(y)) if self.squash else self.field(y)


class FineODE(ODE):
    """y(1) of dy/dt = tanh(A y + b), RK4 at step 0.01: each forward 5x the steps, so auto
    mode finds full mode too slow for the Jacobian and probes first (issue 50's path)."""

    step, squash = 0.01, True


class _Field(nn.Module):
    noise_type, sde_type = "diagonal", "stratonovich"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.drift = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.full((3,), 0.2))

    def f(self, t: Any, y: torch.Tensor) -> torch.Tensor:
        return self.drift(y)

    def g(self, t: Any, y: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.tanh(y)


class SDE(nn.Module):
    """y(1) of a Stratonovich SDE by torchsde's sdeint_adjoint (reversible Heun, dt 0.01), along
    one fixed Brownian path (entropy 7): deterministic, its gradient exact."""

    bug: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.sde = _Field()

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        import torchsde
        from torchsde._core import adjoint

        ts = torch.tensor([0.0, 1.0], dtype=y0.dtype)
        bm = torchsde.BrownianInterval(0.0, 1.0, size=y0.shape, dtype=y0.dtype, entropy=7)
        with swapped(adjoint, "_SdeintAdjointMethod",
                     seeded(adjoint._SdeintAdjointMethod, self.bug)):
            return torchsde.sdeint_adjoint(self.sde, y0, ts, bm=bm, method="reversible_heun",
                                           adjoint_method="adjoint_reversible_heun",
                                           dt=0.01)[-1]


COUNTS: Counter = Counter()  # the package's adjoint Function's forward/backward calls
_BACKWARD = [0]  # inside the Function's backward (torchsde's solves its adjoint by the same one)


def _count_solves() -> None:
    """Count the Function's forwards at its solver: each forward runs one solve, called from
    its `forward` (a solve inside a backward is the backward's). Counted there, not by a
    subclass overriding forward: that would be a second Function to gradtool's culprit search."""
    if COUNTS.get("installed"):
        return
    COUNTS["installed"] = 1

    def counting(solve: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(solve)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _BACKWARD[0] and sys._getframe(1).f_code.co_name == "forward":
                COUNTS["forward"] += 1
            return solve(*args, **kwargs)
        return wrapper

    if importlib.util.find_spec("torchdiffeq") is not None:
        from torchdiffeq._impl import adjoint

        adjoint.odeint = counting(adjoint.odeint)
    if importlib.util.find_spec("torchsde") is not None:
        from torchsde._core.base_solver import BaseSDESolver

        BaseSDESolver.integrate = counting(BaseSDESolver.integrate)


def _seed(bug: str, out: list[Any], tensors: list[int]) -> list[Any]:
    """The adjoint's gradients with the seeded bug: every one doubled, the parameters' dropped,
    the input's alone doubled, or a square parameter gradient transposed."""
    first, rest = tensors[0], tensors[1:]
    if bug == "factor 2":
        return [g * 2 if k in tensors else g for k, g in enumerate(out)]
    if bug == "params dropped":
        return [torch.zeros_like(g) if k in rest else g for k, g in enumerate(out)]
    if bug == "input doubled":
        return [g * 2 if k == first else g for k, g in enumerate(out)]
    square = next(k for k in rest if out[k].dim() == 2 and out[k].shape[0] == out[k].shape[1])
    return [g.t() if k == square else g for k, g in enumerate(out)]  # "weight transposed"


def variant(base: type, bug: str | None) -> type:
    return type(f"{base.__name__}{'' if bug is None else bug.title().replace(' ', '')}",
                (base,), {"bug": bug})


# family -> (package, model class, inputs, bugs)
FAMILIES: dict[str, tuple[str, type, list[str], tuple[str, ...]]] = {
    "torchdiffeq odeint_adjoint": ("torchdiffeq", ODE, ["2x4"], (
        "factor 2", "params dropped", "input doubled", "weight transposed")),
    "torchdiffeq odeint_adjoint, fine steps": ("torchdiffeq", FineODE, ["2x4"], (
        "factor 2", "input doubled", "weight transposed")),
    "torchsde sdeint_adjoint": ("torchsde", SDE, ["2x3"], (
        "factor 2", "params dropped", "input doubled", "weight transposed")),
}


def gradtool_run(model: type, inputs: list[str]) -> tuple[float, Any]:
    import gradtool

    _count_solves()
    COUNTS.update(forward=-COUNTS["forward"], backward=-COUNTS["backward"])
    start = time.perf_counter()
    report = gradtool.check(model, inputs)
    seconds = time.perf_counter() - start
    LAST["gradtool"] = Counter(COUNTS)
    return seconds, report


def gradcheck_run(model: type, inputs: list[str]) -> tuple[float, bool]:
    """gradcheck then gradgradcheck slow on the same input and the model's parameters."""
    from gradtool.config.settings import CheckConfig
    from gradtool.targets.cases import build_case
    from gradtool.targets.inputs import parse_input
    from gradtool.targets.resolve import make_target

    target = make_target(model, model.__name__)
    case = build_case(target, [parse_input(s) for s in inputs], CheckConfig(), 0)
    module = model().double()
    names = [n for n, _ in module.named_parameters()]
    args = tuple(a.detach().clone().requires_grad_(True) for a in case.problem.inputs)
    x, params = args[0], args[1:]

    def fn(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, dict(zip(names, params)), (x,))

    _count_solves()
    COUNTS.update(forward=-COUNTS["forward"], backward=-COUNTS["backward"])
    start = time.perf_counter()
    ok = []
    for check in (gradcheck, gradgradcheck):
        try:
            ok.append(bool(check(fn, (x, *params), fast_mode=False, raise_exception=False)))
        except Exception:  # noqa: BLE001 - an adjoint gradgradcheck cannot differentiate
            ok.append(False)
        if check is gradcheck:  # gradcheck alone: the drop-in's yardstick
            LAST["gradcheck alone"] = Counter(COUNTS, seconds=time.perf_counter() - start)
    LAST["gradcheck"] = Counter(COUNTS)
    return time.perf_counter() - start, all(ok)


LAST: dict[str, Counter] = {}  # the last run's evaluations at the Function, per tool


def row(family: str, bug: str | None, repeats: int) -> dict[str, Any]:
    _, base, inputs, _ = FAMILIES[family]
    model = variant(base, bug)
    gradtool_run(model, inputs), gradcheck_run(model, inputs)  # warm-up: first calls, imports
    ours, theirs, last = [], [], None
    for _ in range(repeats):
        seconds, last = gradtool_run(model, inputs)
        ours.append(seconds)
        theirs.append(gradcheck_run(model, inputs)[0])
    wall = ours[-1]  # the last run's, which its report describes
    checks = {c.name: c for _, _, c in last.checks()}
    gradtool_run(model, inputs)  # counted apart: the timed rounds interleave the two tools
    counts = {"ours_n": LAST["gradtool"]}
    gradcheck_run(model, inputs)
    counts.update(theirs_n=LAST["gradcheck"], alone=LAST["gradcheck alone"])
    return {**counts, "family": family, "bug": bug or "correct", "ours": statistics.median(ours),
            "theirs": statistics.median(theirs), "report": last, "wall": wall,
            "failed": [n for n, c in checks.items() if c.outcome.value not in
                       ("passed", "skipped")],
            "double": checks.get("double_backward")}


def line(r: dict[str, Any]) -> str:
    report, double = r["report"], r["double"]
    verdict = "pass" if not r["failed"] else "FAIL " + ", ".join(r["failed"])
    # gradtool's own split of its time (absent before the report told it: then the checks')
    parts = report.time_parts() if hasattr(report, "time_parts") else \
        {"checks": sum(c.duration_s for _, _, c in report.checks()), "setup": 0.0}
    told = f"{parts['checks'] / r['wall']:.0%} of the wall in checks, setup {parts['setup']:.2f} s"
    culprit = (double.details[-1][:60] + "…") if double is not None and double.details else ""
    ours, theirs, alone = r["ours_n"], r["theirs_n"], r["alone"]
    more = " **more**" if ours["forward"] + ours["backward"] > \
        theirs["forward"] + theirs["backward"] else ""
    return (f"| {r['family']} | {r['bug']} | {r['ours']:.2f} s {verdict} | {r['theirs']:.2f} s | "
            f"{r['ours'] / r['theirs']:.2f}× | {ours['forward']}/{ours['backward']}{more} | "
            f"{theirs['forward']}/{theirs['backward']} | {alone['forward']}/{alone['backward']}, "
            f"{alone['seconds']:.2f} s | {h.per_check(report)} | {told} | {culprit} |")



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread, {args.repeats} interleaved round(s) after a "
          f"warm-up; load average at the start {_load()}")
    print("| model | bug | gradtool, every default check | gradcheck + gradgradcheck slow "
          "| ratio | evaluations gradtool (fwd/bwd at the Function) | gradcheck + gg "
          "| gradcheck alone (and its time) | gradtool per check (paid, +read) "
          "| gradtool's time told | double backward's culprit line |")
    print("|---" * 11 + "|")
    rows = []
    for family, (package, _, _, bugs) in FAMILIES.items():
        if importlib.util.find_spec(package) is None:
            print(f"| {family} | — | skipped: {package} is not installed |||||||||")
            continue
        for bug in (None, *bugs):
            rows.append(row(family, bug, args.repeats))
            print(line(rows[-1]), flush=True)
    for kind, pick in (("correct", lambda r: r["bug"] == "correct"),
                       ("seeded bugs", lambda r: r["bug"] != "correct")):
        chosen = [r for r in rows if pick(r)]
        if chosen:
            ours, theirs = sum(r["ours"] for r in chosen), sum(r["theirs"] for r in chosen)
            evals = [sum(r[k]["forward"] + r[k]["backward"] for r in chosen)
                     for k in ("ours_n", "theirs_n")]
            print(f"{kind}: {len(chosen)} rows, {ours:.2f} s against {theirs:.2f} s = "
                  f"{ours / theirs:.2f}× (worst row "
                  f"{max(r['ours'] / r['theirs'] for r in chosen):.2f}×); evaluations at the "
                  f"Function {evals[0]} against {evals[1]}")
    print(f"load average at the end {_load()}")
    return 0


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
