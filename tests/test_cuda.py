"""The GPU tier: every check on a real CUDA device (skipped where torch sees none).

CI has no GPU; tests/test_device.py guards the same rule there. These run whenever a GPU is
at hand (`pytest -m cuda`), and docs/compatibility.md says on which card they last ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, ROOT

import gradtool

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]

F = torch.nn.functional
CLEAN = {"passed", "skipped", "xfailed"}


def _verdicts(report) -> dict[tuple[str, str, str], str]:
    return {(t.target, c.label, k.name): k.outcome.value for t, c, k in report.checks()}


def _clean(report) -> bool:
    return set(_verdicts(report).values()) <= CLEAN


def test_bundled_specs_on_cuda_give_the_cpu_verdicts():
    on_cpu = _verdicts(gradtool.check("specs/"))
    on_cuda = _verdicts(gradtool.check("specs/", device="cuda"))
    assert on_cuda == on_cpu


def test_the_cli_checks_the_bundled_specs_on_cuda():
    out = subprocess.run([sys.executable, "-m", "gradtool", "check", "specs/", "--device", "cuda",
                          "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def _ops(device: str, dtype: torch.dtype) -> dict[str, tuple]:
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)

    return {
        "linear": (F.linear, (t(16, 64), t(32, 64), t(32))),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), (t(16, 64), t(64), t(64))),
        "softmax": (lambda x: torch.softmax(x, -1), (t(16, 64),)),
        "conv2d": (F.conv2d, (t(2, 3, 8, 8), t(4, 3, 3, 3))),
        "attention": (F.scaled_dot_product_attention, (t(1, 2, 16, 32), t(1, 2, 16, 32),
                                                        t(1, 2, 16, 32))),
        "cumsum": (lambda x: torch.cumsum(x, 0), (t(16, 64),)),
    }


@pytest.mark.parametrize("name", list(_ops("cpu", torch.float64)))
def test_torch_ops_with_the_users_cuda_tensors_pass_at_float64(name):
    fn, args = _ops("cuda", torch.float64)[name]
    report = gradtool.check(fn, args, checks=("contract", "gradient", "double_backward", "layout"))
    assert _clean(report), _verdicts(report)
    assert report.config["device"].startswith("cuda")


@pytest.mark.parametrize("name", ["linear", "softmax", "cumsum"])
def test_low_precision_on_cuda_is_judged_against_float64_there(name):
    fn, args = _ops("cuda", torch.float32)[name]
    report = gradtool.check(fn, args, checks=("gradient",))
    assert _clean(report), _verdicts(report)


def test_a_module_with_cuda_parameters():
    module = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    module = module.double().cuda()
    x = torch.randn(4, 8, dtype=torch.float64, device="cuda")
    report = gradtool.check(module, (x,))
    assert _clean(report), _verdicts(report)
    assert all(p.device.type == "cuda" for p in module.parameters())  # left where it was


def test_a_wrong_backward_on_cuda_fails_as_on_the_cpu():
    verdicts = {}
    for device in ("cpu", "cuda"):
        report = gradtool.check("specs/examples/mul_constant.py:MulConstantUnscaled",
                                inputs=("3x3", "5"), device=device)
        verdicts[device] = {k: v for (_, _, k), v in _verdicts(report).items()}
    assert verdicts["cuda"] == verdicts["cpu"]
    assert verdicts["cuda"]["gradient"] == "failed"


def test_a_compiled_triton_op_on_cuda():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "gradtool", "check", "triton_ops.py",
                          "--device", "cuda", "--format", "json", "--no-isolate"],
                         capture_output=True, text=True, cwd=FIXTURES, env=env, timeout=600)
    report = json.loads(out.stdout)
    found = {(t["target"].split(":")[-1], c["name"]): c["outcome"] for t in report["targets"]
             for case in t["cases"] for c in case["checks"]}
    assert out.returncode == 1, out.stderr
    for name in ("contract", "gradient", "double_backward", "op_schema", "op_fake",
                 "op_autograd"):
        assert found[("scaled_silu", name)] == "passed", (name, found)
    assert found[("scaled_silu_bad_grad", "gradient")] == "failed"


def test_trace_of_a_cuda_training_script_replays_on_the_device():
    out = subprocess.run([sys.executable, "-m", "gradtool", "trace", "--device", "cuda",
                          "--format", "json", "train.py", "--", "--kernel", "fixed",
                          "--device", "cuda"],
                         capture_output=True, text=True, cwd=FIXTURES / "trace", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert len(report["targets"]) == 2  # RowSumSq and ScaledTanh, each replayed on the GPU
    for target in report["targets"]:
        assert {c["outcome"] for case in target["cases"] for c in case["checks"]} <= CLEAN
        assert "cuda" in target["cases"][0]["inputs"][0]["description"]


def test_reports_and_reproducers_from_a_cuda_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gradtool", "check",
                          "specs/examples/mul_constant.py:MulConstantUnscaled", "-i", "3x3",
                          "-i", "5", "--device", "cuda", "--json", str(tmp_path / "r.json"),
                          "--html", str(tmp_path / "r.html"), "--repro", str(tmp_path / "repro")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert json.loads((tmp_path / "r.json").read_text())["config"]["device"] == "cuda"
    assert "gradient" in (tmp_path / "r.html").read_text()
    [test_file] = (tmp_path / "repro").glob("test_*.py")
    assert "cuda" in test_file.read_text()
    replay = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(test_file)], capture_output=True, text=True, cwd=ROOT,
                            timeout=600)
    assert replay.returncode == 1 and "1 failed" in replay.stdout, replay.stdout
