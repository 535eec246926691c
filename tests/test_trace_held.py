"""`gradtool trace` checks what it records (issue 57): a custom Function called with arguments
no file can hold (a Python callable, an options object: an ODE adjoint-style Function) is
checked in the traced process on the recorded arguments held as they were; it used to be a
bare REJECTED with exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES

GRADTOOL = str(Path(sys.executable).with_name("gradtool"))


def test_an_adjoint_function_taking_a_callable_gets_a_verdict(tmp_path):
    shutil.copy(FIXTURES / "trace_held" / "ode_script.py", tmp_path / "ode_script.py")
    done = subprocess.run([GRADTOOL, "trace", "ode_script.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert "REJECTED" not in out, out
    assert "PASS  OdeintAdjointMethod at ode_script.py" in out and "gradient" in out, out
    # correct first order; its adjoint backward carries no graph: the double backward says so
    assert "FAIL  OdeintAdjointMethod" in out and "once_differentiable" in out
    assert "checked in the traced process" in out
    assert "reproduce: gradtool trace ode_script.py" in out
    assert done.returncode == 1, done.stderr
    passing = subprocess.run([GRADTOOL, "trace", "--check", "contract", "--check", "gradient",
                              "ode_script.py"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_the_run_s_time_counts_the_checks_made_in_the_traced_process(tmp_path):
    shutil.copy(FIXTURES / "trace_held" / "ode_script.py", tmp_path / "ode_script.py")
    done = subprocess.run([GRADTOOL, "trace", "--check", "gradient", "ode_script.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    summary = done.stdout.strip().splitlines()[-1]
    assert "1 passed in " in summary and " in 0.00s" not in summary, summary


FACTORY_SCRIPT = '''
import torch


def make_scale(factor):  # a new class at every call, as qpth's QPFunction(...) makes
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * factor
    return Scale


x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
for _ in range(2):
    make_scale(FACTOR).apply(x).sum().backward()
'''


def _trace_factory(tmp_path: Path, factor: str) -> subprocess.CompletedProcess:
    (tmp_path / "factory.py").write_text(FACTORY_SCRIPT.replace("FACTOR", factor))
    return subprocess.run([GRADTOOL, "trace", "--check", "gradient", "factory.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_function_made_by_a_factory_is_checked_once_in_the_traced_process(tmp_path):
    # it was REJECTED ("defined inside a function: define it at module level"), once per call
    done = _trace_factory(tmp_path, "3")
    out = done.stdout
    assert "REJECTED" not in out and done.returncode == 0, out + done.stderr
    assert out.count("PASS  make_scale.<locals>.Scale at factory.py") == 1, out
    assert "called 2 time(s)" in out and "a class made inside a function" in out


def test_a_wrong_function_made_by_a_factory_fails(tmp_path):
    done = _trace_factory(tmp_path, "2")
    assert "FAIL  make_scale.<locals>.Scale at factory.py" in done.stdout, done.stdout
    assert done.returncode == 1
