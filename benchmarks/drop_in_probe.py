"""pytest plugin for drop_in.py: every gradcheck call of the session, timed, written to a file.

Loaded with `-p drop_in_probe` (benchmarks/ on PYTHONPATH). Under --gradtool-gradcheck it reads
the calls gradtool's plugin recorded; without it, it routes torch's gradcheck and gradgradcheck
to themselves through the same run/swap.py router, so both runs are timed the same way. The
calls go to the JSON file named by GRADTOOL_DROPIN_OUT at the end of the session.
"""

from __future__ import annotations

import json
import os

import pytest

_OWN = pytest.StashKey[object]()


def pytest_configure(config: pytest.Config) -> None:
    import torch

    from gradtool.pytest_plugin import gradcheck_enabled

    torch.set_num_threads(1)  # two cores shared: one thread each way, comparable
    if gradcheck_enabled(config):
        return  # gradtool's plugin routes and records

    from gradtool.run.swap import NAMES, Swap

    module = __import__("sys").modules["torch.autograd.gradcheck"]
    where = lambda: os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]  # noqa: E731
    swap = Swap({name: getattr(module, name) for name in NAMES}, where)
    swap.install()
    config.stash[_OWN] = swap


def pytest_sessionfinish(session: pytest.Session) -> None:
    from gradtool.pytest_plugin import SWAP_KEY

    config = session.config
    swap = config.stash.get(_OWN, None) or config.stash.get(SWAP_KEY, None)
    rows = [call.row() for call in swap.calls] if swap is not None else []
    with open(os.environ["GRADTOOL_DROPIN_OUT"], "w") as handle:
        json.dump({"calls": rows, "exitstatus": int(session.exitstatus),
                   "tests": {"failed": session.testsfailed,
                             "collected": session.testscollected}}, handle)


def pytest_unconfigure(config: pytest.Config) -> None:
    swap = config.stash.get(_OWN, None)
    if swap is not None:
        swap.restore()
