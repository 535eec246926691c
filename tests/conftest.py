"""Shared test helpers: load fixture modules by path, run checks, pick outcomes."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from slow_tests import SLOW_FILES, SLOW_TESTS

# Under pytest-xdist the workers already fill the cores: torch's own intra-op threads on top
# oversubscribe them, and on tiny tensors a thread hand-off costs ~10x the op (the quick tier took
# 543 s at load 8 on 2 cores, 266 s with one thread each). Each worker gets its share of the
# cores, its gradtool subprocesses too (OMP_NUM_THREADS); a run without -n keeps torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = ROOT / "specs" / "examples"


def load_fixture(name: str):
    """Import tests/fixtures/<name>.py once (registered in sys.modules)."""
    module_name = f"gradtool_fixture_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def outcomes(report) -> dict[str, str]:
    """{check name: outcome} for a one-target, one-case report."""
    return {check.name: check.outcome.value for _, _, check in report.checks()}


def result(report, name: str):
    return next(check for _, _, check in report.checks() if check.name == name)


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for a module's tests (restored after): on tiny tensors two
    threads per op cost ~10x the op on a loaded machine (the seeded-bug battery's dropped
    double-backward term, ~260 backward calls in drop-in slow: 8-14 s at load 8, 0.5 s)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def temporary_folders_under_pytest(tmp_path_factory):
    """The gradtool processes the tests start (and tempfile here) write their temporary folders
    under pytest's basetemp, which pytest prunes: `gradtool trace` keeps a failing run's recorded
    inputs for its reproduce lines, and the suite's failing traces would pile up in /tmp."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    yield
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


@pytest.fixture
def contract_cases():
    return load_fixture("contract_cases")


def pytest_collection_modifyitems(config, items):
    """Mark the tests tests/slow_tests.py lists `slow` (the quick tier deselects them)."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        if item.path.name in SLOW_FILES or name in SLOW_TESTS.get(item.path.name, ()):
            item.add_marker(pytest.mark.slow)
