"""Worker processes: a crash, exit, hang, memory hog or Ctrl-C in one target loses no result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from conftest import FIXTURES, ROOT
from gradtool.cli.supervise import exit_cause
from gradtool.heartbeat import describe, place

MOD = str(FIXTURES / "misbehaving.py")
SCHEMA = json.loads((ROOT / "gradtool" / "schemas" / "report.schema.json").read_text())


def gradtool(*args: str, tmp_path, **popen) -> tuple[subprocess.CompletedProcess, dict, ET.Element]:
    json_path, xml_path = tmp_path / "r.json", tmp_path / "r.xml"
    command = [sys.executable, "-m", "gradtool", "check", *args, "-i", "(3,)", "-q",
               "--json", str(json_path), "--junit-xml", str(xml_path)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    report = json.loads(json_path.read_text())
    jsonschema.validate(report, SCHEMA)
    return out, report, ET.parse(xml_path).getroot()


def summaries(report: dict) -> dict[str, tuple[str, str]]:
    """{target: (worst outcome, first summary)}"""
    result = {}
    for t in report["targets"]:
        checks = [k for c in t["cases"] for k in c["checks"]]
        bad = [k for k in checks if k["outcome"] == "error"] or checks
        result[t["target"].split(":")[-1]] = (bad[0]["outcome"], bad[0]["summary"])
    return result


def test_crash_exit_and_hang_are_errors_and_the_correct_target_still_passes(tmp_path):
    names = ["segfault", "hard_exit", "exits", "hangs", "says", "fine"]
    out, report, junit = gradtool(*[f"{MOD}:{n}" for n in names], "--timeout", "2",
                                  tmp_path=tmp_path)
    assert out.returncode == 1, out.stderr
    got = summaries(report)
    assert got["fine"][0] == "passed"
    assert got["segfault"] == ("error", "process died: SIGSEGV (segmentation fault) while "
                               "running forward of " + f"{MOD}:segfault, case 0 (contract check, "
                               "forward call 1; 1/2 evaluations, 50%)")
    assert got["hard_exit"][1].startswith("process died: exit code 4 while running forward of")
    assert got["exits"] == ("error", "SystemExit raised: 3")
    assert got["hangs"] == ("error", "timed out after 2 s in contract check (forward call 1; 1/2 "
                            "evaluations, 50%)")
    assert got["says"][1].startswith("forward returned str, not a tensor")
    hang = next(k for t in report["targets"] if t["target"].endswith("hangs")
                for c in t["cases"] for k in c["checks"])
    assert hang["duration_s"] < 2 + 1  # stopped within the timeout plus a second
    assert [t["target"].split(":")[-1] for t in report["targets"]] == names  # serial order
    cases = {c.get("classname").split(":")[-1]: c for c in junit.iter("testcase")}
    assert cases["segfault"].find("error") is not None and cases["fine"].find("error") is None
    assert "SIGSEGV" in out.stdout


def test_a_timeout_in_forward_points_at_forward(tmp_path):
    out, report, _ = gradtool(f"{MOD}:HangsInForward", "--timeout", "2", tmp_path=tmp_path)
    assert out.returncode == 1, out.stderr
    stopped = report["targets"][0]["cases"][0]["checks"][0]
    assert stopped["summary"].startswith("timed out after 2 s in "), stopped
    line = next(n for n, text in enumerate(open(MOD), 1) if "the line a timeout's" in text)
    assert stopped["source"].endswith(f"misbehaving.py:{line - 1}"), stopped["source"]
    assert report["targets"][0]["source"] != stopped["source"]  # the target's is backward's


def torch_data_bytes() -> int:
    """A process's data segment once torch is imported: ~0.2 GB for the CPU wheel, ~0.7 GB for
    a CUDA build (its libraries' mappings), which any --max-rss must leave room for."""
    code = ("import re, torch; "
            "print(re.search(r'VmData:\\s+(\\d+)', open('/proc/self/status').read())[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout) * 1024


def test_max_rss_turns_a_runaway_allocation_into_an_error(tmp_path):
    # 300 MB beyond torch's own footprint: gradtool's work fits, hogs' 400 MB does not.
    limit = torch_data_bytes() + 300 * 2**20
    out, report, _ = gradtool(f"{MOD}:hogs", f"{MOD}:fine", "--check", "contract",
                              "--max-rss", str(limit), tmp_path=tmp_path)
    got = summaries(report)
    assert out.returncode == 1 and got["fine"][0] == "passed"
    assert got["hogs"][0] == "error" and "allocate" in got["hogs"][1], got
    out, report, _ = gradtool(f"{MOD}:hogs", "--check", "contract", tmp_path=tmp_path)
    assert out.returncode == 0, report  # without the limit the same target passes


def test_ctrl_c_reports_finished_targets_lists_the_rest_and_exits_130(tmp_path):
    marker = tmp_path / "hanging"
    json_path, xml_path = tmp_path / "r.json", tmp_path / "r.xml"
    command = [sys.executable, "-m", "gradtool", "check", f"{MOD}:fine", f"{MOD}:hangs",
               f"{MOD}:segfault", "-i", "(3,)", "--json", str(json_path),
               "--junit-xml", str(xml_path)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "GRADTOOL_TEST_MARKER": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 130, stdout
    report = json.loads(json_path.read_text())
    jsonschema.validate(report, SCHEMA)
    # the target running when Ctrl-C came says how far it got; the one not begun is not run
    assert [t["target"].split(":")[-1] for t in report["targets"]] == ["fine", "hangs"]
    stopped = report["targets"][1]["cases"][0]["checks"][0]
    assert stopped["outcome"] == "error"
    assert stopped["summary"].startswith("stopped by SIGINT in "), stopped
    assert [n.split(":")[-1] for n in report["not_run"]] == ["segfault"]
    assert report["interrupted"] == "SIGINT"
    assert "NOT RUN" in stdout and "PASS" in stdout
    skipped = [c for c in ET.parse(xml_path).getroot().iter("testcase")
               if c.find("skipped") is not None]
    assert len(skipped) == 1


def test_two_workers_give_the_serial_verdicts_in_the_serial_order(tmp_path):
    specs = str(ROOT / "specs" / "examples")
    verdicts = []
    for extra in ([], ["-n", "2"]):
        out = subprocess.run([sys.executable, "-m", "gradtool", "check", specs, "--format",
                              "json", "--mode", "full", *extra],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
        report = json.loads(out.stdout)
        verdicts.append((out.returncode, [(t["target"], c["label"], k["name"], k["outcome"])
                                          for t in report["targets"] for c in t["cases"]
                                          for k in c["checks"]]))
    assert verdicts[0] == verdicts[1] and len(verdicts[0][1]) > 10


@pytest.mark.parametrize("code, cause", [
    (-11, "SIGSEGV (segmentation fault)"), (-9, "SIGKILL (killed) — out of memory?"),
    (4, "exit code 4")])
def test_exit_causes_are_named(code, cause):
    assert exit_cause(code) == cause


def test_the_heartbeat_says_where_a_worker_was():
    state = {"target": "Bad", "case": "case 0", "check": "gradient", "phase": "forward",
             "call": 37}
    assert describe(state) == "forward of Bad, case 0 (gradient check, forward call 37)"
    assert place(state) == "gradient check (forward call 37)"
    assert place({"target": "Bad", "case": "case 0"}) == "setup of Bad, case 0"


def test_a_spec_and_the_project_set_the_timeout(tmp_path):
    from gradtool.config.pyproject import discover
    from gradtool.config.settings import CheckConfig
    from gradtool.errors import ConfigError, SpecError
    from gradtool.run.collect import spec_jobs
    from gradtool.spec.schema import load_text

    text = "version: 1\nspecs:\n  - target: misbehaving.py:fine\n    timeout: 2.5\n"
    (spec,) = load_text(text, "a.yaml", FIXTURES)
    assert spec_jobs(spec, CheckConfig())[0].config.timeout == 2.5
    with pytest.raises(SpecError, match="timeout: expected a non-negative number"):
        load_text(text.replace("2.5", "soon"), "a.yaml", FIXTURES)
    (tmp_path / "pyproject.toml").write_text("[tool.gradtool]\ntimeout = 30\n")
    assert discover(tmp_path).settings["timeout"] == 30.0
    (tmp_path / "pyproject.toml").write_text("[tool.gradtool]\ntimeout = -1\n")
    with pytest.raises(ConfigError, match="timeout = -1: expected a non-negative number"):
        discover(tmp_path)


def test_a_bug_in_gradtool_inside_a_worker_exits_3_with_its_traceback(tmp_path):
    # The target module plants the bug when the worker imports it; the supervisor must not read
    # the worker's end as a death of the user's code.
    out = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"{FIXTURES}/planted_bug.py:double",
         "-i", "(3,)", "--check", "gradient"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "bug in gradtool" in out.stderr and "KeyError" in out.stderr



def test_a_forward_returning_a_non_tensor_points_at_forward():
    import torch

    import gradtool
    from gradtool.targets.load import source_of

    class Stringy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return "not a tensor"

        @staticmethod
        def backward(ctx, grad):
            return grad

    report = gradtool.check(Stringy, ["(3,)"], checks=["contract"])
    contract = report.targets[0].cases[0].checks[0]
    assert "forward returned str, not a tensor" in contract.summary
    assert contract.source == source_of(Stringy.forward) != source_of(Stringy.backward)


def test_ctrl_c_in_process_keeps_finished_results_and_lists_the_rest():
    import torch

    from gradtool.config.settings import CheckConfig
    from gradtool.run.runner import CaseSpec, Job, run
    from gradtool.targets.inputs import parse_input
    from gradtool.targets.resolve import make_target

    def interrupted(x):
        raise KeyboardInterrupt  # what Ctrl-C raises inside a --no-isolate run

    config = CheckConfig(checks=("gradient",))
    jobs = [Job(make_target(fn, name), [CaseSpec("case 0", [parse_input("(3,)")], 0)], config)
            for fn, name in ((torch.sin, "sin"), (interrupted, "stop"), (torch.cos, "cos"))]
    report = run(jobs, config)
    assert report.interrupted and report.not_run == ("stop", "cos")
    assert [t.target for t in report.targets] == ["sin"] and report.ok() is False
