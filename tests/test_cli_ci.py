"""End to end: the CLI as a CI step (JUnit, annotations, pyproject config, output hygiene, list)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import numpy
import pytest
import torch
import xmlschema
from click.testing import CliRunner, Result

import gradtool
from gradtool.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "specs" / "examples"
SCHEMA = xmlschema.XMLSchema(str(ROOT / "tests" / "data" / "junit.xsd"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour and style (SGR) sequences
FAILING = "specs/mul_constant.py"     # MulConstant passes, MulConstantUnscaled fails its gradient
PASSING = "specs/mul_constant.py:MulConstant"
SUMMARY = "2 target(s), 8 check(s): 1 failed, 7 passed"

# Variables that change what the CLI prints; every test starts without them (CI sets some).
ENV_CLEAR = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS",
             "GITHUB_ACTIONS", "GITHUB_WORKSPACE")

SENTINEL = '''
"""A Function whose backward leaves a file behind, to tell `list` from `check`."""
from pathlib import Path

import torch


class Marked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        with open(Path(__file__).with_name("backward-calls"), "a") as log:
            log.write("backward\\n")
        return grad * 2
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout with the example modules under specs/, as the current folder."""
    (tmp_path / ".git").mkdir()  # pyproject discovery stops here, never above
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("mul_constant.py", "linear.py", "mul_constant.yaml"):
        shutil.copy(EXAMPLES / name, specs / name)
    monkeypatch.chdir(tmp_path)
    for name in ENV_CLEAR:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def gradtool_cli(*args: str, env: Mapping[str, str] | None = None) -> Result:
    """Run `gradtool ARGS` in-process; stdout and stderr stay apart."""
    return CliRunner().invoke(main, list(args), env=dict(env or {}), prog_name="gradtool")


def pyproject(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text("[tool.gradtool]\n" + body, encoding="utf-8")


# --- JUnit XML -------------------------------------------------------------------------------


def test_junit_xml_validates_and_carries_the_plain_report(project):
    result = gradtool_cli("check", FAILING, "--junit-xml", "report.xml")
    assert result.exit_code == 1
    xml = (project / "report.xml").read_text(encoding="utf-8")
    SCHEMA.validate(xml)
    root = ET.fromstring(xml)
    cases = list(root.iter("testcase"))
    assert len(cases) == 8 and root.get("tests") == "8" and root.get("failures") == "1"
    [failed] = [c for c in cases if c.find("failure") is not None]
    assert failed.get("name").endswith("gradient")
    text = failed.find("failure").text
    assert text.startswith("FAIL specs/mul_constant.py:MulConstantUnscaled   gradient")
    assert "\n  diagnosis: " in text
    assert "reproduce: gradtool check specs/mul_constant.py:MulConstantUnscaled" in text


def test_junit_xml_of_specs_with_expected_failures_validates(project):
    result = gradtool_cli("check", "specs/mul_constant.yaml", "--junit-xml", "out/r.xml")
    assert result.exit_code == 0, result.output
    xml = (project / "out" / "r.xml").read_text(encoding="utf-8")
    SCHEMA.validate(xml)
    assert ET.fromstring(xml).get("failures") == "0"


# --- GitHub annotations ----------------------------------------------------------------------


def backward_lines(path: Path, cls: str) -> range:
    """The lines of cls.backward in path."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    [node] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    [method] = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "backward"]
    return range(method.lineno, method.end_lineno + 1)


def test_github_annotations_point_at_the_failing_backward(project):
    result = gradtool_cli("check", FAILING, env={"GITHUB_ACTIONS": "true"})
    assert result.exit_code == 1
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1
    match = re.match(r"::error file=([^,]+),line=(\d+),title=([^:]+)::(.+)$", errors[0])
    assert match, errors[0]
    assert match[1] == "specs/mul_constant.py"
    assert int(match[2]) in backward_lines(project / FAILING, "MulConstantUnscaled")
    assert "gradient failed" in match[3] and "%0A" in match[4]  # one command, escaped newlines


@pytest.mark.parametrize(("env", "flag", "shown"), [
    ({}, None, False),
    ({}, "github", True),
    ({"GITHUB_ACTIONS": "true"}, "none", False),
])
def test_annotations_follow_the_flag_and_the_environment(project, env, flag, shown):
    args = ["check", FAILING, *(["--annotations", flag] if flag else [])]
    result = gradtool_cli(*args, env=env)
    assert result.exit_code == 1
    assert ("::error " in result.output) is shown


# --- [tool.gradtool] -------------------------------------------------------------------------


def settings_table(text: str) -> dict[str, tuple[str, str]]:
    """`gradtool config` rows: key -> (value, source)."""
    rows = [re.split(r"\s{2,}", line.strip(), maxsplit=2) for line in text.splitlines()[1:]]
    return {row[0]: (row[1], row[2] if len(row) > 2 else "") for row in rows if row[0]}


def test_check_without_arguments_runs_the_configured_paths(project):
    pyproject(project, f'paths = ["{PASSING}"]\nseed = 3\n')
    result = gradtool_cli("check")
    assert result.exit_code == 0, result.output
    assert "MulConstant " in result.stdout and "MulConstantUnscaled" not in result.stdout
    assert "1 target(s), 4 check(s): 4 passed" in result.stdout


def test_command_line_targets_and_flags_override_the_config(project):
    pyproject(project, 'paths = ["specs/mul_constant.py:MulConstantUnscaled"]\n')
    assert gradtool_cli("check").exit_code == 1
    result = gradtool_cli("check", PASSING)
    assert result.exit_code == 0 and "Unscaled" not in result.stdout
    # A loose tolerance in the config hides the bug; the flag restores the strict one.
    pyproject(project, f'paths = ["{FAILING}"]\natol = 10.0\n')
    assert gradtool_cli("check").exit_code == 0
    assert gradtool_cli("check", "--atol", "1e-5").exit_code == 1


def test_config_and_show_config_print_settings_and_sources(project):
    pyproject(project, f'paths = ["{FAILING}"]\natol = 1e-4\nseed = 3\n')
    origin = "pyproject.toml [tool.gradtool]"
    table = settings_table(gradtool_cli("config").stdout)
    assert table["seed"][0] == "3" and table["seed"][1].startswith(origin)
    assert table["atol"][0] == "0.0001" and table["rtol"][1] == "default"
    result = gradtool_cli("check", "--show-config", "--seed", "7", "--mode", "full")
    assert result.exit_code == 0  # prints and exits: the failing target is not run
    shown = settings_table(result.stdout)
    assert shown["seed"] == ("7", "command line") and shown["mode"] == ('"full"', "command line")
    assert shown["atol"][1].startswith(origin) and shown["paths"][0] == f'["{FAILING}"]'


@pytest.mark.parametrize(("body", "named"), [
    ("atoll = 1e-3\n", ["unknown key 'atoll'", "did you mean 'atol'"]),
    ('mode = "fast"\n', ["mode", "fast", "auto, full, probe"]),
    ("paths = [\n", ["invalid TOML"]),
])
@pytest.mark.parametrize("command", [["check"], ["config"], ["check", "--show-config"]])
def test_bad_config_is_a_usage_error_naming_the_key(project, body, named, command):
    pyproject(project, body)
    result = gradtool_cli(*command)
    assert result.exit_code == 2
    assert result.stdout == ""
    for text in named:
        assert text in result.stderr


def test_junit_xml_path_from_the_config(project):
    pyproject(project, f'paths = ["{PASSING}"]\njunit-xml = "reports/gradtool.xml"\n')
    assert gradtool_cli("check").exit_code == 0
    SCHEMA.validate(str(project / "reports" / "gradtool.xml"))


# --- terminal output -------------------------------------------------------------------------


def test_quiet_prints_only_failures_and_the_summary(project):
    result = gradtool_cli("check", FAILING, "--quiet")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("PASS")]
    assert [line for line in lines if line.startswith("FAIL")] == \
        ["FAIL  specs/mul_constant.py:MulConstantUnscaled   gradient"]
    assert lines[-1].startswith(SUMMARY)


def test_verbose_adds_per_check_timing(project):
    timing = re.compile(r"\(\d+ ms\b[^)]*\)$")
    verbose = gradtool_cli("check", FAILING, "-v").stdout.splitlines()
    plain = gradtool_cli("check", FAILING).stdout.splitlines()
    for lines, timed in ((verbose, True), (plain, False)):
        headers = [line for line in lines if line.startswith(("PASS", "FAIL"))]
        assert len(headers) == 8
        assert all(bool(timing.search(line)) is timed for line in headers)


@pytest.mark.parametrize(("flag", "env", "colored"), [
    ("always", {}, True),
    ("never", {}, False),
    ("auto", {}, False),                 # not a terminal
    ("never", {"FORCE_COLOR": "1"}, False),
    ("always", {"NO_COLOR": "1"}, True),  # an explicit flag beats the environment
])
def test_color_flag(project, flag, env, colored):
    result = gradtool_cli("check", FAILING, "--color", flag, env=env)
    assert result.exit_code == 1
    assert bool(ANSI.search(result.stdout)) is colored
    assert "FAIL" in ANSI.sub("", result.stdout)


def run_in_terminal(args: list[str], env: Mapping[str, str], cwd: Path) -> tuple[str, str]:
    """Run a command with stdout and stderr on two pseudo-terminals; return what each got."""
    import pty
    import select

    (out_fd, out_tty), (err_fd, err_tty) = pty.openpty(), pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out_tty, stderr=err_tty,
                            env={**os.environ, **env}, cwd=cwd)
    os.close(out_tty)
    os.close(err_tty)
    got: dict[int, bytes] = {out_fd: b"", err_fd: b""}
    open_fds = [out_fd, err_fd]
    while open_fds:  # read both as they come, so neither terminal's buffer fills up
        for fd in select.select(open_fds, [], [], 120)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child has exited and closed its end
                chunk = b""
            if chunk:
                got[fd] += chunk
            else:
                open_fds.remove(fd)
                os.close(fd)
    proc.wait(timeout=120)
    return got[out_fd].decode("utf-8", "replace"), got[err_fd].decode("utf-8", "replace")


SLOW_MODULE = """
import time
import torch

_slept = []


class SlowSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if not _slept:  # once: makes the run last past the progress bar's one-second delay
            _slept.append(True)
            time.sleep(1.5)
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Square(SlowSquare):
    pass
"""


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX only")
def test_terminal_colour_progress_and_no_color(project):
    (project / "slow.py").write_text(SLOW_MODULE)
    env = {"TERM": "xterm-256color"}
    out, err = run_in_terminal([sys.executable, "-m", "gradtool", "check", "slow.py",
                                "--color", "auto"], env, project)
    assert ANSI.search(out), out       # a terminal gets colour
    assert "━" in err, err              # and, past a second, a progress bar on stderr
    command = [sys.executable, "-m", "gradtool", "check", FAILING, "--color", "auto"]
    out, err = run_in_terminal([*command, "--json", "short.json"], env, project)
    ran = [c for t in json.loads((project / "short.json").read_text())["targets"]
           for c in t["cases"][0]["checks"]]
    if sum(c["duration_s"] or 0 for c in ran) < 0.8:  # the bar's second starts with job 1
        assert "━" not in err, err      # a run shorter than a second shows no bar
    out, err = run_in_terminal([*command, "--quiet"], {**env, "NO_COLOR": "1"}, project)
    assert "FAIL" in out and not ANSI.search(out), out
    assert "━" not in err, err


# --- machine output --------------------------------------------------------------------------


def test_json_alone_on_stdout_human_messages_on_stderr(project):
    result = gradtool_cli("check", FAILING, "--format", "json", "--annotations", "github",
                          "--json", "copy.json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert [t["target"] for t in report["targets"]] == \
        ["specs/mul_constant.py:MulConstant", "specs/mul_constant.py:MulConstantUnscaled"]
    assert "::error " in result.stderr and "::error" not in result.stdout
    copy = json.loads((project / "copy.json").read_text(encoding="utf-8"))
    assert copy["targets"] == report["targets"]


def test_json_format_usage_error_leaves_stdout_empty(project):
    result = gradtool_cli("check", "specs/mul_constant.py:Nope", "--format", "json")
    assert result.exit_code == 2
    assert result.stdout == "" and "gradtool: error:" in result.stderr


def test_version_names_every_component(project):
    result = gradtool_cli("--version")
    assert result.exit_code == 0
    # The installed distribution's version (read without importing torch): a CUDA wheel's
    # torch.__version__ adds a local part (2.4.1+cu121) that its metadata does not have.
    torch_version = importlib.metadata.version("torch")
    for part in (f"gradtool {gradtool.__version__}", f"torch {torch_version}",
                 f"numpy {numpy.__version__}", f"Python {platform.python_version()}"):
        assert part in result.stdout


# --- list ------------------------------------------------------------------------------------


def test_list_shows_targets_and_inputs_without_running_checks(project):
    (project / "specs" / "sentinel.py").write_text(SENTINEL, encoding="utf-8")
    calls = project / "specs" / "backward-calls"
    result = gradtool_cli("list", "specs/sentinel.py", "-i", "3x4")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "specs/sentinel.py:Marked  [function]", "  case 0 (given, seed 0): x 3x4:float64",
        "    checks: contract, gradient, double_backward, layout; not applicable: forward_ad: the "
        "Function defines no jvp (forward-mode AD is not supported by it); vmap: no vmap rule "
        "(the Function sets no generate_vmap_rule and defines no vmap); complex: no complex "
        "inputs or outputs", "    estimated cost: under 1 s"]
    assert not calls.exists()  # no check ran backward (the estimate times a forward only)
    assert gradtool_cli("check", "specs/sentinel.py", "-i", "3x4").exit_code == 0
    assert calls.exists()  # the sentinel works: check does run backward


def test_list_infers_inputs_of_every_target_in_a_file(project):
    result = gradtool_cli("list", FAILING)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[::4] == [
        "specs/mul_constant.py:MulConstant  [function]",
        "specs/mul_constant.py:MulConstantUnscaled  [function]"]
    assert "(inferred, seed 0): tensor 3x4:float64, constant 2.5" in result.stdout
    assert "PASS" not in result.stdout and "FAIL" not in result.stdout


def test_list_target_with_inputs_and_spec_file(project):
    result = gradtool_cli("list", "specs/linear.py:LinearFunction", "-i", "4x3", "-i", "5x3",
                          "-i", "None")
    assert result.exit_code == 0, result.output
    assert "input 4x3:float64, weight 5x3:float64, bias None" in result.stdout
    result = gradtool_cli("list", "specs/mul_constant.yaml")
    assert result.exit_code == 0, result.output
    assert "(spec specs/mul_constant.yaml:" in result.stdout
    assert "constant 5 (given, seed 0): tensor 3x3:float64, constant 5" in result.stdout


# --- shell completion ------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_script(shell):
    script = shutil.which("gradtool")
    if script is None:
        pytest.skip("the gradtool console script is not installed")
    env = {**os.environ, "_GRADTOOL_COMPLETE": f"{shell}_source"}
    result = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "_GRADTOOL_COMPLETE" in result.stdout and "gradtool" in result.stdout


def test_completion_completes_commands_and_options():
    env = {"_GRADTOOL_COMPLETE": "bash_complete", "COMP_WORDS": "gradtool ch", "COMP_CWORD": "1"}
    assert CliRunner().invoke(main, [], env=env, prog_name="gradtool").output == "plain,check\n"
    env = {**env, "COMP_WORDS": "gradtool check --junit", "COMP_CWORD": "2"}
    assert "plain,--junit-xml" in CliRunner().invoke(main, [], env=env, prog_name="gradtool").output
