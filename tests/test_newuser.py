"""A new user's project as it is on disk (tests/fixtures/newuser: fusedlib, not installed):
targets that import, messages that send the right way, reproducers that run as printed,
progress and estimates for a slow kernel, and pytest hygiene."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gradtool
from conftest import FIXTURES
from gradtool.errors import InputError, TargetError

pytest_plugins = ["pytester"]

PROJECT = FIXTURES / "newuser"
# The console script, not `python -m gradtool`: -m puts the working directory on sys.path
# itself, which is what the targets must not depend on.
GRADTOOL = str(Path(sys.executable).with_name("gradtool"))


def run(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A command line as a user types it (a printed reproduce line), from their folder."""
    words = shlex.split(command)
    if words[0] == "gradtool":
        words[0] = GRADTOOL
    return subprocess.run(words, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.fixture
def project(tmp_path):
    """A copy of the project, so nothing is written into the repository."""
    shutil.copytree(PROJECT, tmp_path / "newuser")
    return tmp_path / "newuser"


@pytest.fixture
def inside(monkeypatch):
    """In-process, from the project's folder, with sys.path as it was."""
    monkeypatch.chdir(PROJECT)
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def importable(inside):
    """...and the project importable by the test itself (as its own conftest would make it)."""
    sys.path.insert(0, str(PROJECT))


# --- the library, in-process --------------------------------------------------------------


def test_an_uninstalled_package_resolves_by_file_and_by_dotted_name(inside):
    for target in ("fusedlib/block.py:Double", "fusedlib.block:Double"):
        report = gradtool.check(target, ["3x4"], checks=("gradient",))
        assert report.ok(), report.text()


def test_an_import_error_shows_the_users_own_frame(inside):
    for target in ("fusedlib/broken.py", "fusedlib.broken"):
        with pytest.raises(TargetError) as info:
            gradtool.check(target)
        text = str(info.value)
        assert "raised ValueError: no kernel config for this GPU" in text
        assert "fusedlib/broken.py:5 in configure" in text, text
        # gradtool's own frames are left out: its package folder is named nowhere (a clone's
        # own path may well hold "gradtool/": that says nothing)
        assert str(Path(gradtool.__file__).parent) not in text, text
        assert "importlib" not in text, text


def test_a_module_that_is_nowhere_names_where_it_looked_and_what_to_pass(inside):
    with pytest.raises(TargetError) as info:
        gradtool.check("fusedlib.nothere:F")
    text = str(info.value)
    assert f"looked in the working directory {os.getcwd()}" in text
    assert "pass the file itself: path/to/fusedlib/nothere.py" in text


def test_a_package_name_taken_by_another_project_loads_the_file_by_path(tmp_path, monkeypatch):
    """tests/ops.py of a project whose `tests` package name another `tests` holds already."""
    import types

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "ops.py").write_text(
        (PROJECT / "fusedlib" / "slow.py").read_text().replace("time.sleep(SLEEP_S)", ""))
    (tmp_path / "needs.py").write_text("import not_installed_kernels\n")
    other = types.ModuleType("tests")
    other.__path__ = [str(tmp_path / "elsewhere" / "tests")]
    monkeypatch.setitem(sys.modules, "tests", other)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gradtool.check("tests/ops.py:Sleepy", ["3x4"], checks=("gradient",)).ok()
    with pytest.raises(TargetError, match="not_installed_kernels is not importable from .*: "
                                          "install it") as raised:
        gradtool.check("needs.py")
    # a single-file module is a file, not a folder: the hint names both
    assert "not_installed_kernels/ or not_installed_kernels.py" in str(raised.value.hint)


def test_a_forward_returning_a_number_is_named_as_the_cause(inside):
    report = gradtool.check("fusedlib/block.py:as_number")
    [rejected] = report.rejected
    assert "forward returned float" in rejected.message
    assert "return the output as a tensor" in rejected.message
    assert "candidate shapes" not in rejected.message


def test_a_shape_typed_as_a_literal_is_refused_where_the_schema_takes_a_tensor(importable):
    import torch
    from fusedlib.swiglu import swiglu

    with pytest.raises(InputError) as info:
        gradtool.check(swiglu, ["3,4", "3x4"])
    assert "gives 'x'" in str(info.value) and "the tuple (3, 4)" in str(info.value)
    assert "-i 3x4 or -i '(3,4)'" in str(info.value)
    assert gradtool.check(swiglu, ["3x4", "3x4"], checks=("gradient",)).ok()
    calls = []

    def scaled(x: torch.Tensor, k: int) -> torch.Tensor:
        calls.append(x)
        return x * k

    with pytest.raises(InputError, match=r"a tensor of that shape is -i '\(64,\)'"):
        gradtool.check(scaled, ["64", "2"])
    assert not calls  # refused before the target ran
    assert gradtool.check(scaled, ["(64,)", "2"], checks=("gradient",)).ok() and calls


def test_an_op_name_typo_gets_did_you_mean(inside):
    for name in ("fusedlib/swiglu.py:fusedlib::swigl", "fusedlib/swiglu.py:fusedlb::swiglu"):
        with pytest.raises(TargetError, match="did you mean 'fusedlib::swiglu'"):
            gradtool.check(name, ["3x4", "3x4"])


def test_a_trailing_x_is_an_error(inside):
    with pytest.raises(InputError, match=r"(?s)ends in 'x'.*write a 1-d shape as \(3,\)"):
        gradtool.check("fusedlib/block.py:Double", ["3x"])


def test_torch_trace_logging_is_silenced_while_gradtool_runs_and_restored(importable):
    from fusedlib.swiglu import swiglu

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    trace = logging.getLogger("torch.__trace")
    trace.addHandler(handler)  # as pytest's capture handlers are: trace records then flow
    try:
        gradtool.check(swiglu, ["3x4", "3x4"])  # op_fake runs fake tensors, symbolic shapes
        assert records == []
        assert trace.disabled is False
    finally:
        trace.removeHandler(handler)


def test_look_at_is_relative_to_the_working_directory(inside):
    from gradtool.render.words import relative

    assert relative(f"{PROJECT}/fusedlib/block.py:12") == "fusedlib/block.py:12"
    assert relative("/elsewhere/x.py:3") == "/elsewhere/x.py:3"
    assert relative("fusedlib/block.py:12") == "fusedlib/block.py:12"


def test_an_error_from_a_literal_shape_names_the_shape_syntax():
    from gradtool.render.words import literal_hint
    from gradtool.results import CaseResult, CheckResult, InputInfo, Outcome

    def case(description, summary, outcome=Outcome.ERROR):
        check = CheckResult("contract", outcome, summary)
        return CaseResult("case 0", 0, (InputInfo("x", description, False),), (check,), False), \
            check

    assert literal_hint(*case("64", "AttributeError raised: 'int' object has no attribute "
                                    "'to'")) == [
        "hint: 'x' is the int 64, given as a literal; a tensor of that shape is -i '(64,)'"]
    assert literal_hint(*case("(3, 4)", "Expected a value of type 'Tensor' for argument 'x' "
                                        "but instead found type 'tuple'."))[0].endswith("-i 3x4")
    assert literal_hint(*case("5", "ZeroDivisionError raised: division by zero")) == []
    assert literal_hint(*case("64", "'int' object", Outcome.FAILED)) == []


def test_assert_gradients_points_at_the_users_test(pytester):
    pytester.makepyfile(test_user=f"""
        import sys
        sys.path.insert(0, {str(PROJECT)!r})
        import gradtool
        from fusedlib.block import Tripled

        def test_it():
            gradtool.assert_gradients(Tripled, ["3x4"], checks=("gradient",))
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "test_user.py:7: AssertionError" in text
    assert "api.py" not in text


# --- the command line and its reproducers, in processes ------------------------------------


def test_the_cli_gives_each_message_from_the_project_folder(project):
    ok = run("gradtool check fusedlib.block:Double -i 3x4 --check gradient", project)
    assert ok.returncode == 0, ok.stderr
    cases = {
        "fusedlib/broken.py": "fusedlib/broken.py:5 in configure",
        "fusedlib/block.py:as_number": "forward returned float",
        "fusedlib/swiglu.py:fusedlib::swigl": "did you mean 'fusedlib::swiglu'",
        "fusedlib/swiglu.py:swiglu -i 3,4 -i 3x4": "a tensor of that shape is -i 3x4",
        "fusedlib/block.py:Double -i 3x": "write a 1-d shape as (3,)",
    }
    for args, words in cases.items():
        out = run(f"gradtool check {args}", project)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert words in out.stdout + out.stderr, (args, out.stdout, out.stderr)


def _reproduce_line(text: str) -> str:
    return next(line.split("reproduce: ", 1)[1] for line in text.splitlines()
                if "reproduce: " in line)


def test_every_kind_of_reproduce_line_runs_as_printed(project, tmp_path):
    """CLI, library and trace (the fixture: the next test): each printed
    line, run from the folder the user was in, fails the same check again."""
    cli = run("gradtool check fusedlib/block.py:Tripled -i 3x4 --check gradient", project)
    assert cli.returncode == 1
    lines = [(_reproduce_line(cli.stdout), project)]
    # The library from a test folder beside the project (the project on sys.path only there).
    elsewhere = tmp_path / "tests"
    elsewhere.mkdir()
    library = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(project)!r}); "
         "import gradtool; from fusedlib.block import Tripled; "
         "print(gradtool.check(Tripled, ['3x4'], checks=('gradient',)).text())"],
        cwd=elsewhere, capture_output=True, text=True, timeout=300)
    lines.append((_reproduce_line(library.stdout), elsewhere))
    # `MyFn.apply` given to the library: named by its class in issue 47's branch, not here.
    trace = run("gradtool trace train.py", project)
    assert trace.returncode == 1, trace.stdout + trace.stderr
    lines.append((_reproduce_line(trace.stdout), project))
    for line, folder in lines:
        again = run(line, folder)
        assert again.returncode == 1, (line, again.stdout, again.stderr)
        assert "FAIL" in again.stdout and "gradient" in again.stdout, (line, again.stdout)


def test_the_fixtures_reproduce_line_runs_as_printed_from_the_test_folder(pytester):
    pytester.makepyfile(test_kernels=f"""
        import sys
        sys.path.insert(0, {str(PROJECT)!r})
        from fusedlib.block import Tripled

        def test_it(gradtool_check):
            gradtool_check(Tripled, ["3x4"], checks=("gradient",))
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    line = _reproduce_line(result.stdout.str())
    again = run(line, pytester.path)
    assert again.returncode == 1 and "FAIL" in again.stdout, (line, again.stdout, again.stderr)


# --- cost and progress of a slow kernel ----------------------------------------------------


def test_a_slow_check_piped_says_its_estimate_progress_and_how_far_it_got(project):
    out = run("gradtool check fusedlib/slow.py:Sleepy -i 3x4 --timeout 14", project,
              FUSEDLIB_SLEEP_S="3")
    assert out.returncode == 1, out.stdout + out.stderr
    progress = [line for line in out.stderr.splitlines() if "gradtool: progress " in line]
    assert progress and "checks" in progress[0] and "elapsed" in progress[0], out.stderr
    assert "left" in progress[0] or "time left unknown" in progress[0]
    assert "is estimated at ~" in out.stderr and "--mode probe" in out.stderr, out.stderr
    assert "timed out after 14 s in " in out.stdout, out.stdout
    assert "check (forward call " in out.stdout, out.stdout


def test_list_shows_the_estimated_cost(project):
    out = run("gradtool list fusedlib/slow.py:Sleepy -i 3x4", project, FUSEDLIB_SLEEP_S="0.5")
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if "estimated cost" in l)
    # one forward timed (list runs no backward); the gradient check's 4 forwards of 0.5 s
    assert " s a forward;" in line and "a backward" not in line, line
    assert re.search(r"gradient ~[23]s", line), line
    fast = run("gradtool list fusedlib/block.py:Double -i 3x4", project)
    assert "estimated cost: under 1 s" in fast.stdout


def test_the_terminal_display_under_a_pseudo_terminal(project):
    import pty
    import select

    main, child = pty.openpty()
    process = subprocess.Popen([GRADTOOL, "check", "fusedlib/slow.py:Sleepy", "-i", "3x4"],
                               cwd=project, stdin=child, stdout=child, stderr=child,
                               env={**os.environ, "FUSEDLIB_SLEEP_S": "0.3", "COLUMNS": "160"})
    os.close(child)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            seen += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=120)
    os.close(main)
    text = seen.decode(errors="replace")
    assert process.returncode == 0, text
    assert "fusedlib/slow.py:Sleepy · " in text and " check (forward call " in text, text
    assert "4/4" in text and "/7" not in text and "s left" in text, text  # the 4 that apply


# --- the progress watch, on a fake clock ---------------------------------------------------


class FakeWorker:
    def __init__(self, index, state):
        self.index, self._state, self.steps = index, state, []

    def state(self):
        return dict(self._state)


class FakeSupervisor:
    """What progress.Watch reads of a Supervisor: the collection, workers, results, pending."""

    def __init__(self, jobs, workers):
        from collections import deque
        from types import SimpleNamespace

        self.collected = SimpleNamespace(jobs=jobs)
        self.workers, self.results, self.pending = workers, {}, deque()

    def _job(self, index):
        return self.collected.jobs[index]


def test_the_watch_times_calls_announces_a_long_check_once_and_tells_progress_in_time():
    from types import SimpleNamespace

    from gradtool.cli.progress import EVERY_S, LONG_S, Watch

    now = [0.0]
    lines: list[str] = []
    watch = Watch(lines.append, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="slow.py:Sleepy", cases=[SimpleNamespace(label="case 0")], mode="auto",
                          checks=("contract", "gradient", "layout"))
    state = {"target": job.name, "case": "case 0", "check": "", "phase": "", "call": 0}
    worker = FakeWorker(0, state)
    supervisor = FakeSupervisor([job], [worker])
    for second in range(40):  # a forward call every 3 s, the gradient check from 6 s
        now[0] = float(second)
        worker._state.update(check="gradient" if second >= 6 else "",
                             phase="forward", call=second // 3 + 1)
        watch.tick(supervisor)
    announced = [line for line in lines if "is estimated at" in line]
    assert len(announced) == 1 and "the gradient check is estimated at ~12 s" in announced[0]
    assert "3 s a forward call" in announced[0] and "--mode probe" in announced[0]
    progress = [line for line in lines if line.startswith("gradtool: progress ")]
    assert len(progress) == 1 + (39 - int(LONG_S)) // int(EVERY_S)  # at 10 s, then every 15 s
    assert progress[0].startswith(f"gradtool: progress 0/3 checks, {int(LONG_S)}s elapsed, ~")
    assert "left — slow.py:Sleepy: gradient check (forward call 4)" in progress[0]


def test_the_watch_counts_the_checks_a_case_plans_and_never_hints_the_mode_it_runs_in():
    from types import SimpleNamespace

    from gradtool.cli.progress import Watch
    from gradtool.cli.protocol import Step

    now = [0.0]
    lines: list[str] = []
    watch = Watch(lines.append, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="slow.py:Sleepy", cases=[SimpleNamespace(label="case 0")],
                          mode="probe", checks=("contract", "gradient", "double_backward",
                                                "forward_ad", "vmap", "complex", "layout"))
    worker = FakeWorker(0, {"check": "contract", "phase": "forward", "call": 1})
    supervisor = FakeSupervisor([job], [worker])
    assert watch.done_total(supervisor) == (0, 7)  # before its plan: every check of its kind
    worker.steps += [Step(0, "plan", {"case": "case 0", "checks": ("contract", "gradient",
                                                                   "double_backward", "layout")}),
                     Step(0, "check", {"case": "case 0"})]
    assert watch.done_total(supervisor) == (1, 4)
    for second in range(30):  # the gradient check's forward calls, 3 s each
        now[0] = float(second)
        worker._state.update(check="gradient", call=second // 3 + 1)
        watch.tick(supervisor)
    announced = [line for line in lines if "is estimated at" in line]
    assert announced and "--mode probe" not in announced[0], announced
    assert "a smaller -i" in announced[0]
    assert any(line.startswith("gradtool: progress 1/4 checks") for line in lines), lines


def test_the_watch_says_nothing_of_a_quick_run():
    from types import SimpleNamespace

    from gradtool.cli.progress import Watch

    now = [0.0]
    lines: list[str] = []
    watch = Watch(lines.append, live=False, clock=lambda: now[0])
    job = SimpleNamespace(name="fast.py:F", cases=[SimpleNamespace(label="case 0")], mode="auto", checks=("gradient",))
    worker = FakeWorker(0, {"check": "gradient", "phase": "forward", "call": 0})
    supervisor = FakeSupervisor([job], [worker])
    for tick in range(50):  # 5 s, a call every 0.1 s
        now[0] = tick / 10
        worker._state["call"] = tick
        watch.tick(supervisor)
    assert lines == []


def test_time_left_counts_workers_side_by_side_not_one_after_another():
    from types import SimpleNamespace

    from gradtool.cli.progress import Watch

    def left(workers: int) -> float:
        now = [0.0]
        watch = Watch(lambda _: None, live=False, clock=lambda: now[0])
        jobs = [SimpleNamespace(name=f"t{k}", cases=[SimpleNamespace(label="case 0")], mode="auto", checks=("gradient", "layout"))
                for k in range(workers)]
        states = [FakeWorker(k, {}) for k in range(workers)]
        supervisor = FakeSupervisor(jobs, states)
        for second in range(7):  # each worker: a forward call every 2 s in its gradient check
            now[0] = float(second)
            for worker in states:
                worker._state.update(check="gradient", phase="forward", call=second // 2 + 1)
            watch.tick(supervisor)
        return watch.left_s(supervisor, now[0])

    one = left(1)
    assert one is not None and one > 0
    assert left(2) == pytest.approx(one)
