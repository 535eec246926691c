"""`gradtool trace`: a real run's custom calls recorded and checked; a script's failure loses none."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from conftest import FIXTURES, ROOT

TRACE = FIXTURES / "trace"
SCRIPT = "tests/fixtures/trace/train.py"
SCHEMA = json.loads((ROOT / "gradtool" / "schemas" / "report.schema.json").read_text())
BUGGY = f"RowSumSqTailBug at {SCRIPT}:23, input 8x40 float32"
ACTIVATION = f"ScaledTanh at {SCRIPT}:22, input 8x40 float32"


def trace(*args: str, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradtool", "trace", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def traced(tmp_path, *args: str, script_args=()):
    """Trace the training script with a JSON report; (process, report, {target: outcome})."""
    out = trace("--save", str(tmp_path / "calls"), "--json", str(tmp_path / "r.json"),
                "--junit-xml", str(tmp_path / "r.xml"), *args, SCRIPT, "--", *script_args)
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, SCHEMA)
    verdicts = {t["target"]: worst(t) for t in report["targets"]}
    return out, report, verdicts


def worst(target: dict) -> str:
    outcomes = {k["outcome"] for c in target["cases"] for k in c["checks"]}
    return next((o for o in ("error", "failed") if o in outcomes), "passed")


def test_the_function_wrong_at_the_scripts_width_is_named_with_call_site_and_shape(tmp_path):
    out, report, verdicts = traced(tmp_path, "-n", "2", "--annotations", "github")
    assert out.returncode == 1, out.stderr
    assert verdicts == {ACTIVATION: "passed", BUGGY: "failed"}
    assert list(verdicts) == [ACTIVATION, BUGGY]  # the order of the run, with two workers
    assert "::error file=tests/fixtures/trace/kernels.py,line=18,title=gradtool gradient " \
           "failed%3A RowSumSqTailBug at " in out.stdout  # at the wrong backward
    bad = next(t for t in report["targets"] if t["target"] == BUGGY)
    case = bad["cases"][0]
    gradient = next(k for k in case["checks"] if k["name"] == "gradient")
    assert gradient["mode"].startswith("float32 vs float64")  # judged as a low-precision target
    saved = tmp_path / "calls" / "001_RowSumSqTailBug.pt"
    assert case["reproduce"] == ("gradtool check tests/fixtures/trace/kernels.py:RowSumSqTailBug "
                                 f"--inputs-from {saved}")
    assert "recorded from the script: called 3 time(s) with this signature" in case["notes"]
    assert "grad_outputs its backward received: 8 float32" in case["notes"]
    assert f"FAIL  {BUGGY}" in out.stdout and "step 2 loss" in out.stderr  # the script's prints
    failures = [(c.get("classname"), c.get("name")) for c in
                ET.parse(tmp_path / "r.xml").getroot().iter("testcase") if c.find("failure") is not None]
    assert failures == [(BUGGY, "recorded call::gradient")]  # JUnit names it the same way
    replay = subprocess.run(case["reproduce"].replace("gradtool", f"{sys.executable} -m gradtool",
                                                      1).split() + ["--check", "gradient"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 1 and "FAIL" in replay.stdout, replay.stdout + replay.stderr


@pytest.mark.parametrize("script_args", [("--kernel", "fixed"), ("--width", "48")],
                         ids=["bug fixed", "width a multiple of the block"])
def test_a_run_whose_calls_are_all_right_exits_0(tmp_path, script_args):
    out, report, verdicts = traced(tmp_path, script_args=script_args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(verdicts) == 2 and set(verdicts.values()) == {"passed"}
    assert report["rejected"] == []


@pytest.mark.parametrize("then, says", [
    ("raise", "the script raised:"),
    ("exit", "the script exited with code 3 (sys.exit)"),
    ("hang", "the script timed out after 30 s (--timeout) and was stopped"),
])
def test_a_script_that_fails_is_an_error_and_its_calls_are_still_checked(tmp_path, then, says):
    out, report, verdicts = traced(tmp_path, "--timeout", "30", script_args=("--then", then))
    assert out.returncode == 1
    assert verdicts == {ACTIVATION: "passed", BUGGY: "failed"}  # nothing recorded was lost
    [rejected] = report["rejected"]
    assert rejected["source"] == f"script {SCRIPT}" and says in rejected["message"]
    assert says.split(" (")[0] in out.stderr
    if then == "raise":
        assert "ValueError: the script failed after training" in rejected["message"]
        assert "train.py:45" in rejected["message"]  # the user's frame, trimmed


def test_list_shows_the_calls_without_checking_and_max_calls_bounds_them(tmp_path):
    out = trace("--list", "--max-calls", "1", "--save", str(tmp_path), SCRIPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == [
        ACTIVATION, "  called 3 time(s); replay: gradtool check tests/fixtures/trace/kernels.py:"
                    f"ScaledTanh --inputs-from {tmp_path}/000_ScaledTanh.pt"]
    assert [p.name for p in tmp_path.iterdir()] == ["000_ScaledTanh.pt"]
    assert "RowSumSqTailBug" not in out.stdout and "PASS" not in out.stdout
    assert "1 distinct custom call(s) recorded (3 call(s) in all); 3 call(s) of new signatures " \
           "past --max-calls not recorded; 2 call(s) without gradient" in out.stdout


def test_usage_errors_and_a_script_with_nothing_to_check(tmp_path):
    missing = trace("nope.py")
    assert missing.returncode == 2 and "script not found: nope.py" in missing.stderr
    nothing = trace(SCRIPT, "--", "--steps", "0")
    assert nothing.returncode == 5 and "made no custom" in nothing.stderr
    assert "2 call(s) without gradient" in nothing.stderr  # the eval forward under no_grad
    assert "after the script go to the script" not in nothing.stderr  # after --: the script's
    misplaced = trace(SCRIPT, "--steps", "0", "--html", str(tmp_path / "r.html"))
    assert "note: --html after the script go to the script" in misplaced.stderr
    assert not (tmp_path / "r.html").exists()
    module = trace("-m", "no_such_module_here")
    assert module.returncode == 2 and "no module named 'no_such_module_here'" in module.stderr


def test_a_module_run_records_custom_ops_through_both_entry_points(tmp_path):
    out = trace("-q", "--save", str(tmp_path), "-m", "ops_script", cwd=TRACE)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL  gradtool_trace::triple at ops_script.py:8, input 5 float64" in out.stdout
    assert "misses a factor 1.5" in out.stdout  # analytical = 2/3 of numerical
    # A recorded op is an op target: its op checks run and its inputs have the schema's names.
    assert "inputs (given, seed 0): x given" in out.stdout and "7 check(s)" in out.stdout
    assert f"reproduce: gradtool check trace_ops.py:triple --inputs-from {tmp_path}/000_" \
           in out.stdout
    assert "1 target(s)" in out.stdout  # both entry points, one signature: one check


def test_ctrl_c_stops_the_script_lists_the_recorded_calls_and_exits_130(tmp_path):
    import signal
    import time

    json_path = tmp_path / "r.json"
    process = subprocess.Popen([sys.executable, "-m", "gradtool", "trace", "--json",
                                str(json_path), SCRIPT, "--", "--then", "hang"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 120
    while "step 2" not in seen and time.monotonic() < deadline:
        seen += process.stderr.readline()  # the script's prints come on stderr
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, out + err
    report = json.loads(json_path.read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["interrupted"] == "SIGINT" and report["targets"] == []
    assert report["not_run"] == [ACTIVATION, BUGGY]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_replaying_on_a_device_this_machine_lacks_is_a_usage_error():
    out = trace("--device", "cuda", "train.py", "--", "--kernel", "fixed", "--steps", "1",
                cwd=TRACE)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--device 'cuda': this torch build has no usable CUDA" in out.stdout
    assert "deserialize" not in out.stdout  # told before any recorded value is loaded
