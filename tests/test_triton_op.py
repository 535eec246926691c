"""A Triton kernel wrapped with torch.library.triton_op, checked on CPU under triton's
interpreter (TRITON_INTERPRET=1); skipped where triton is not installed (pip install
'gradtool[triton]')."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES

pytest.importorskip("triton")

PROBE = """
import triton, torch
@triton.jit
def kernel(x):
    pass
torch.library.wrap_triton(kernel)
"""


@pytest.fixture(scope="module", autouse=True)
def interpreter_accepted():
    # Some torch versions (2.6) wrap only compiled kernels: under the interpreter (no GPU)
    # wrap_triton refuses the kernel, so there is nothing to check.
    import torch

    if not hasattr(torch.library, "triton_op"):
        pytest.skip("torch.library.triton_op is in torch 2.6 and later")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    if "wrap_triton only works" in probe.stderr:
        pytest.skip("this torch's wrap_triton refuses a kernel under triton's interpreter")
    assert probe.returncode == 0, probe.stderr


def test_triton_op_gradients_under_the_interpreter():
    # A subprocess: TRITON_INTERPRET is read when @triton.jit runs, and must not leak into the
    # other tests of this worker.
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "gradtool", "check", "triton_ops.py",
                          "--format", "json", "--no-isolate"],
                         capture_output=True, text=True, cwd=FIXTURES, env=env, timeout=600)
    report = json.loads(out.stdout)
    found = {(t["target"].split(":")[-1], c["name"]): c for t in report["targets"]
             for case in t["cases"] for c in case["checks"]}
    assert out.returncode == 1, out.stderr
    for name in ("contract", "gradient", "double_backward", "op_schema", "op_autograd"):
        assert found[("scaled_silu", name)]["outcome"] == "passed", found[("scaled_silu", name)]
    assert found[("scaled_silu", "op_fake")]["outcome"] == "skipped"
    assert "TRITON_INTERPRET=1" in found[("scaled_silu", "op_fake")]["summary"]
    bad = found[("scaled_silu_bad_grad", "gradient")]
    assert bad["outcome"] == "failed"
    assert bad["source"].endswith(f"triton_ops.py:{_line('def _backward_wrong')}")
    assert "performance drop" not in out.stderr


def _line(text: str) -> int:
    lines = (FIXTURES / "triton_ops.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)
