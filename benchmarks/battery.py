"""The seeded-bug battery's table per mode (tests/test_mutant_battery.py's cases): for each
comparison mode, the mutants visible there, how many fail, and whether every correct twin
passes. `python benchmarks/battery.py` prints the markdown table of benchmarks/README.md."""

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

    visible, caught, twins = defaultdict(int), defaultdict(int), defaultdict(int)
    errors = defaultdict(int)
    missed: list[str] = []
    start = time.perf_counter()
    for name, kind, position, mode in battery.QUICK + battery.SLOW:
        fn, values = battery._inputs(name)
        if mode == "module" and position == 0 and kind == battery.mu.SWAP:
            continue
        if not battery.visible(fn, values, kind, position, mode):
            continue
        visible[mode] += 1
        try:
            passed = battery.verdict(fn, values, (kind, position), mode)
        except Exception as exc:  # noqa: BLE001 - an older gradtool's internal error, counted
            errors[mode] += 1
            missed.append(f"{name} {kind} of input {position} in {mode}: {type(exc).__name__}")
            continue
        if passed:
            missed.append(f"{name} {kind} of input {position} in {mode}")
        else:
            caught[mode] += 1
    for mode in battery.MODES:
        for name in battery.FIXTURES:
            fn, values = battery._inputs(name)
            try:
                twins[mode] += battery.verdict(fn, values, None, mode)
            except Exception:  # noqa: BLE001 - counted as not passing
                errors[mode] += 1
    print("| mode | visible mutants | failed (caught) | errors | correct twins passed |")
    print("|---|---|---|---|---|")
    for mode in battery.MODES:
        print(f"| {mode} | {visible[mode]} | {caught[mode]} | {errors[mode]} | {twins[mode]} "
              f"of {len(battery.FIXTURES)} |")
    print(f"\n{time.perf_counter() - start:.0f} s; missed: {missed or 'none'}")


if __name__ == "__main__":
    main()
