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
