"""The project's fixtures as one verdict suite: gradtool's every default check against gradcheck
+ gradgradcheck slow, total CPU time, with the ledger of shared evaluations and without."""

#     python benchmarks/fixture_suite.py [--repeats 2] [--fixture NAME ...]
#
# Every custom Function the fixtures define (tests/fixtures: truth, contract_cases, layouts,
# wolf, bugs, and expensive's correct and seeded families), correct and deliberately broken, at
# inputs gradtool infers (seed 0) and passes as tensors to both tools, so both check the same
# values. After a warm-up pass over the whole suite, each round runs every target with
# gradtool (GRADTOOL_LEDGER=1, then 0) and with gradcheck then gradgradcheck (fast_mode=False,
# raise_exception=False), the order rotated per round; one torch thread; the clock is this
# process's CPU time (user + sys), which other processes on a shared machine do not inflate as
# they do wall time. Evaluations are counted at the Function (forward/backward calls). A
# target whose inputs cannot be inferred is left out, and counted.

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.autograd import gradcheck, gradgradcheck

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import harness as h  # noqa: E402

FIXTURES = ("truth", "contract_cases", "layouts", "wolf", "bugs", "expensive")


def functions(fixture: str) -> list[tuple[str, type]]:
    """The fixture's custom Functions (expensive's: its families' variants), by name."""
    import importlib

    module = importlib.import_module(fixture)
    if fixture == "expensive":
        return [(f"{family} {bug}", cls) for family, bugs in
                {**module.FAMILIES, **module.HANDWRITTEN}.items() for bug, cls in bugs.items()]
    return [(name, obj) for name, obj in sorted(vars(module).items())
            if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function)
            and obj.__module__ == module.__name__ and not name.startswith("_")]


def inferred(cls: type) -> tuple | None:
    """The tensors gradtool infers for the Function (seed 0), or None."""
    from gradtool.config.settings import CheckConfig
    from gradtool.targets.infer import infer_case
    from gradtool.targets.resolve import make_target

    try:
        case = infer_case(make_target(cls, cls.__name__), CheckConfig(), 0)
    except Exception:  # noqa: BLE001 - inputs it cannot infer: left out, and counted
        return None
    return tuple(case.problem.given_args())


def ours(cls: type, args: tuple, ledger: str) -> tuple[float, Counter, str]:
    import gradtool

    os.environ["GRADTOOL_LEDGER"] = ledger
    counter: Counter = Counter()
    counted = h.counting(cls, counter)
    given = tuple(a.detach().clone().requires_grad_(a.requires_grad)
                  if isinstance(a, torch.Tensor) else a for a in args)
    start = time.process_time()
    try:
        report = gradtool.check(counted, given)
        verdict = ",".join(f"{c.name}:{c.outcome.value}" for _, _, c in report.checks())
    except Exception as exc:  # noqa: BLE001 - alike with the ledger and without: compared
        verdict = f"raised {type(exc).__name__}"
    return time.process_time() - start, counter, verdict


def theirs(cls: type, args: tuple) -> tuple[float, Counter]:
    counter: Counter = Counter()
    fn = h.counting(cls, counter).apply
    given = tuple(a.detach().clone().requires_grad_(a.is_floating_point() or a.is_complex())
                  if isinstance(a, torch.Tensor) else a for a in args)
    start = time.process_time()
    for check in (gradcheck, gradgradcheck):
        try:
            check(fn, given, fast_mode=False, raise_exception=False)
        except Exception:  # noqa: BLE001 - a backward gradgradcheck cannot differentiate
            pass
    return time.process_time() - start, counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--fixture", action="append", choices=FIXTURES)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    suite, left = [], []
    for fixture in args.fixture or FIXTURES:
        for name, cls in functions(fixture):
            given = inferred(cls)
            (left if given is None else suite).append((fixture, name, cls, given))
    print(f"torch {torch.__version__}, one thread, {len(suite)} Functions ({len(left)} left out: "
          f"inputs not inferred), warm-up then {args.repeats} round(s); load average "
          f"{os.getloadavg()[0]:.2f} at the start")
    runs = {"ledger": [], "no ledger": [], "gradcheck": []}
    counts = {k: Counter() for k in runs}
    differs, per_fixture = [], []
    for r in range(-1, args.repeats):  # round -1: the warm-up, not counted
        totals = Counter()
        for fixture, name, cls, given in suite:
            order = ["ledger", "no ledger", "gradcheck"]
            for tool in order[r % 3:] + order[:r % 3]:
                if tool == "gradcheck":
                    seconds, calls = theirs(cls, given)
                else:
                    seconds, calls, verdict = ours(cls, given, "1" if tool == "ledger" else "0")
                    if r == 0:
                        counts[tool + " verdicts"] = counts.get(tool + " verdicts", {})
                        counts[tool + " verdicts"][name] = verdict
                totals[tool] += seconds
                totals[(fixture, tool)] += seconds
                if r == 0:
                    counts[tool].update(calls)
        if r >= 0:
            for tool in runs:
                runs[tool].append(totals[tool])
            per_fixture.append(totals)
    os.environ.pop("GRADTOOL_LEDGER", None)
    for name, verdict in counts["ledger verdicts"].items():
        if counts["no ledger verdicts"][name] != verdict:
            differs.append(name)
    g = statistics.median(runs["gradcheck"])
    for tool in ("ledger", "no ledger"):
        t = statistics.median(runs[tool])
        print(f"gradtool, {tool}: CPU {t:.2f} s against gradcheck + gradgradcheck {g:.2f} s = "
              f"{t / g:.2f}×; evaluations {counts[tool]['forward']}/{counts[tool]['backward']} "
              f"against {counts['gradcheck']['forward']}/{counts['gradcheck']['backward']}")
    for fixture in dict.fromkeys(f for f, *_ in suite):
        ours_s, theirs_s = (statistics.median(t[(fixture, k)] for t in per_fixture)
                            for k in ("ledger", "gradcheck"))
        n = sum(1 for f, *_ in suite if f == fixture)
        print(f"  {fixture}: {n} Functions, CPU {ours_s:.2f} s against {theirs_s:.2f} s = "
              f"{ours_s / theirs_s:.2f}× (with the ledger)")
    if left:
        print(f"left out (inputs not inferred): {', '.join(f'{f}.{n}' for f, n, *_ in left)}")
    print(f"verdicts that differ with the ledger and without: {differs or 'none'}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
