"""Ctrl-C and timeouts lose nothing finished (issue 57): the worker sends each check's result
as it finishes, so a target stopped in its second check keeps its first; the words say what
happened; "not begun" lists only the checks that apply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import FIXTURES, ROOT

MOD = str(FIXTURES / "misbehaving.py")


def test_ctrl_c_keeps_the_finished_checks_of_the_running_target(tmp_path):
    marker, json_path = tmp_path / "hanging", tmp_path / "r.json"
    command = [sys.executable, "-m", "gradtool", "check", f"{MOD}:fine",
               f"{MOD}:hangs_in_gradient", "-i", "(3,)", "--json", str(json_path)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "GRADTOOL_TEST_MARKER": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a supervisor tick: the contract's result has been read
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 130, stdout
    report = json.loads(json_path.read_text())
    checks = {k["name"]: k for k in report["targets"][1]["cases"][0]["checks"]}
    assert checks["contract"]["outcome"] == "passed", checks  # finished: kept
    stopped = checks["gradient"]
    assert stopped["outcome"] == "error" and stopped["summary"].startswith("stopped by SIGINT")
    text = " ".join(stopped["details"])
    assert "fresh workers" not in text and "went with the worker" not in text
    assert "the run was stopped (SIGINT)" in text
    assert "checks finished before it: contract" in text
    # a plain function of real tensors: forward_ad, vmap, complex do not apply to it
    begun = next(d for d in stopped["details"] if d.startswith("checks not begun"))
    assert "complex" not in begun and "vmap" not in begun, begun
    assert "PASS" in stdout and "contract" in stdout


def test_a_timeout_keeps_the_finished_checks(tmp_path):
    json_path = tmp_path / "r.json"
    command = [sys.executable, "-m", "gradtool", "check", f"{MOD}:hangs_in_gradient",
               f"{MOD}:fine", "-i", "(3,)", "--timeout", "3", "--json", str(json_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(json_path.read_text())
    checks = {k["name"]: k for k in report["targets"][0]["cases"][0]["checks"]}
    assert checks["contract"]["outcome"] == "passed", checks
    assert checks["gradient"]["summary"].startswith("timed out after 3 s in gradient check")
    assert "a fresh worker runs the targets after it" in " ".join(checks["gradient"]["details"])
    assert report["targets"][1]["cases"][0]["checks"][0]["outcome"] == "passed"


def test_a_bug_in_gradtool_on_one_target_leaves_the_others_verdicts(tmp_path):
    """Exit 3 with the traceback, and the file's other target still checked and shown."""
    bug = str(FIXTURES / "planted_bug_one.py")
    json_path = tmp_path / "r.json"
    out = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"{bug}:buggy", f"{bug}:fine", "-i", "(3,)",
         "--check", "gradient", "--json", str(json_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "bug in gradtool" in out.stderr and "KeyError" in out.stderr
    report = json.loads(json_path.read_text())
    outcomes = {t["target"].split(":")[-1]: t["cases"][0]["checks"][0]["outcome"]
                for t in report["targets"]}
    assert outcomes == {"buggy": "error", "fine": "passed"}, outcomes
    assert "PASS" in out.stdout
