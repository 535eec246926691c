"""pytest plugin for drop_in.py: every gradcheck call of the session, timed, written to a file.

Loaded with `-p drop_in_probe` (benchmarks/ on PYTHONPATH). Under --gradtool-gradcheck it reads
the calls gradtool's plugin recorded; without it, it routes torch's gradcheck and gradgradcheck
to themselves through the same run/swap.py router, so both runs are timed the same way. The
calls go to the JSON file named by GRADTOOL_DROPIN_OUT at the end of the session.

With GRADTOOL_DROPIN_PAIRED=1 each call runs both functions, torch's and the drop-in, one after
the other (the order alternating, torch's RNG state the same for both), and the test goes on with
torch's result: verdicts compared on identical inputs, times measured at the same moment.
Where drop_in_seed.py planted a bug, each side of a pair also says how many times the seeded
Functions ran (`evals`: [applies, backwards], summed over the targets).

The suites draw unseeded random inputs (module-level tensors, randn in tests): torch's RNG is
seeded at the start and before each test from its node id, so both runs check the same values.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import pytest

_OWN = pytest.StashKey[object]()
_PAIRS = pytest.StashKey[list]()


def _paired(name, torch_fn, pairs, where):
    """Both functions on the call, torch's RNG state alike; torch's result or exception goes on."""
    import time

    import torch

    import gradtool.dropin
    from gradtool.run.swap import input_elements

    ours = getattr(gradtool.dropin, name)
    failure = sys.modules["torch.autograd.gradcheck"].GradcheckError

    def run(*args, **kwargs):
        state, results, evals = torch.get_rng_state(), {}, {}
        order = [("torch", torch_fn), ("gradtool", ours)]
        for label, fn in order if len(pairs) % 2 == 0 else order[::-1]:
            torch.set_rng_state(state)
            before = _seeded()
            start, outcome, error = time.perf_counter(), "passed", None
            try:
                outcome = "passed" if fn(*args, **kwargs) else "failed"
            except Exception as exc:  # noqa: BLE001 (the test sees torch's, re-raised below)
                outcome, error = ("failed" if isinstance(exc, failure) else "raised"), exc
            results[label] = (outcome, time.perf_counter() - start, error)
            evals[label] = [after - then for after, then in zip(_seeded(), before)]
        pairs.append({"name": name, "where": where(), "elements": input_elements(args, kwargs),
                      **{
            label: [outcome, seconds, f"{type(error).__name__}: {str(error).strip()[:300]}"
                    if error else ""] for label, (outcome, seconds, error) in results.items()},
                      **({"evals": evals} if "drop_in_seed" in sys.modules else {})})
        outcome, _, error = results["torch"]
        if error is not None:
            raise error
        return outcome == "passed"

    return run


def _seeded() -> list[int]:
    """[applies, backwards] of the Functions drop_in_seed.py planted bugs in, summed (zeros
    when no bug was planted)."""
    seed = sys.modules.get("drop_in_seed")
    tallies = seed.counts().values() if seed is not None else ()
    return [sum(t[0] for t in tallies), sum(t[1] for t in tallies)]


def pytest_configure(config: pytest.Config) -> None:
    import torch

    from gradtool.pytest_plugin import gradcheck_enabled

    torch.set_num_threads(1)  # two cores shared: one thread each way, comparable
    torch.manual_seed(0)  # the draws test modules make when they are imported
    if gradcheck_enabled(config):
        return  # gradtool's plugin routes and records
    if os.environ.get("GRADTOOL_DROPIN_PAIRED"):
        config.stash[_PAIRS] = []

    from gradtool.run.swap import NAMES, Swap

    module = sys.modules["torch.autograd.gradcheck"]
    where = lambda: os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]  # noqa: E731
    pairs = config.stash.get(_PAIRS, None)
    swap = Swap({name: getattr(module, name) if pairs is None
                 else _paired(name, getattr(module, name), pairs, where) for name in NAMES}, where)
    swap.install()
    config.stash[_OWN] = swap


def pytest_runtest_setup(item: pytest.Item) -> None:
    import torch

    torch.manual_seed(zlib.crc32(item.nodeid.encode()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    from gradtool.pytest_plugin import SWAP_KEY

    config = session.config
    swap = config.stash.get(_OWN, None) or config.stash.get(SWAP_KEY, None)
    rows = [call.row() for call in swap.calls] if swap is not None else []
    pairs = config.stash.get(_PAIRS, [])
    with open(os.environ["GRADTOOL_DROPIN_OUT"], "w") as handle:
        json.dump({"calls": rows, "pairs": pairs, "exitstatus": int(session.exitstatus),
                   "tests": {"failed": session.testsfailed,
                             "collected": session.testscollected}}, handle)


def pytest_unconfigure(config: pytest.Config) -> None:
    swap = config.stash.get(_OWN, None)
    if swap is not None:
        swap.restore()
