"""The seeded-bug battery's table per mode (tests/test_mutant_battery.py's cases): for each
comparison mode, the mutants visible there, how many fail, and whether every correct twin
passes. `python benchmarks/battery.py [MODE ...]` prints the markdown table of
benchmarks/README.md (every mode, or those named)."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]


def main() -> None:
    import torch

    torch.set_num_threads(1)
    import test_mutant_battery as battery

    modes = sys.argv[1:] or battery.MODES
    visible, caught, twins = defaultdict(int), defaultdict(int), defaultdict(int)
    errors, took = defaultdict(int), defaultdict(float)
    missed: list[str] = []
    start = time.perf_counter()
    for name, kind, position, mode in battery.QUICK + battery.SLOW:
        if mode not in modes or not battery.seen(name, kind, position, mode)[0]:
            continue
        fn, values, _ = battery.mode_inputs(name, mode)
        visible[mode] += 1
        began = time.perf_counter()
        try:
            passed = battery.verdict(fn, values, (kind, position), mode, name)
        except Exception as exc:  # noqa: BLE001 - an older gradtool's internal error, counted
            errors[mode] += 1
            missed.append(f"{name} {kind} of input {position} in {mode}: {type(exc).__name__}")
            continue
        finally:
            took[mode] += time.perf_counter() - began
        if passed:
            missed.append(f"{name} {kind} of input {position} in {mode}")
        else:
            caught[mode] += 1
    fixtures = {mode: [n for n in battery.FIXTURES if mode != "sweep" or n in battery.SWEPT]
                for mode in modes}
    for mode in modes:
        for name in fixtures[mode]:
            fn, values, _ = battery.mode_inputs(name, mode)
            try:
                twins[mode] += battery.verdict(fn, values, None, mode, name)
            except Exception:  # noqa: BLE001 - counted as not passing
                errors[mode] += 1
    print("| mode | visible mutants | failed (caught) | errors | correct twins passed | "
          "mutants' time |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        print(f"| {mode} | {visible[mode]} | {caught[mode]} | {errors[mode]} | {twins[mode]} "
              f"of {len(fixtures[mode])} | {took[mode]:.1f} s |")
    print(f"\n{time.perf_counter() - start:.0f} s; missed: {missed or 'none'}")


if __name__ == "__main__":
    main()
