"""pytest plugin: YAML op specs as test items (opt-in), the fixtures, and --gradtool-gradcheck.

Loaded in every pytest run once installed (entry point ``pytest11: gradtool``), so importing it
must stay cheap: no torch, no gradtool internals at module level; everything is imported lazily
and only when a run opts in (``--gradtool`` or the ini option ``gradtool = true``) or a test asks
for the fixture.

Collection: every *.yaml / *.yml file that is a gradtool spec file (a mapping with a top-level
``specs:`` key, or only ``version:``/``specs:`` keys) becomes a ``SpecFile``; each spec in it a
``SpecNode`` named after the spec; each (case, check) of the spec one ``SpecItem`` named
``check[case label]`` (just ``check`` for a spec with one unnamed case), e.g.
``specs/linear.yaml::LinearFunction::gradient[with bias]``. One item per check keeps outcomes
precise (an expected-failure gradient is one xfailed item, its contract still passes) and spreads
well over pytest-xdist workers. Settings come from [tool.gradtool] as for ``gradtool check``.

``--gradtool-gradcheck`` (or the ini option ``gradtool_gradcheck = true``) routes every
torch.autograd.gradcheck / gradgradcheck call of the session to the drop-in (run/swap.py); the
terminal summary counts them, a worker's calls summed by the pytest-xdist controller.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gradtool.results import CaseResult, CheckResult, Report, TargetResult
    from gradtool.run.runner import Job
    from gradtool.spec.schema import Spec

SPEC_SUFFIXES = (".yaml", ".yml")
FILE_KEYS = frozenset({"version", "specs"})  # gradtool.specs.FILE_KEYS, without importing it
_TOP_LEVEL_SPECS = re.compile(r"^specs\s*:", re.MULTILINE)

_settings_key = pytest.StashKey[dict[str, Any]]()
# The run/swap.py Swap routing this process's calls (benchmarks/drop_in.py reads its calls).
SWAP_KEY = pytest.StashKey[Any]()
_worker_calls_key = pytest.StashKey[list[Any]]()  # the controller's: its workers' calls
_xpassed_key = pytest.StashKey[list[str]]()  # tests marked as expected failures that passed
GRADCHECK_OUTPUT = "gradtool_gradcheck"  # a worker's routed calls, in its workeroutput


class GradtoolInconclusive(UserWarning):
    """A check whose finite differences were unreliable: shown, but it fails only when strict."""


class GradtoolWarning(UserWarning):
    """A check that passed with a warning finding (legal, worth telling): fails only when strict."""


class CheckFailed(Exception):
    """Raised by a SpecItem whose check failed; its message is the CLI's plain report."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradtool", "gradient checks of YAML op specs")
    group.addoption("--gradtool", action="store_true", default=False,
                    help="collect gradtool YAML spec files (*.yaml, *.yml) as test items")
    parser.addini("gradtool", type="bool", default=False,
                  help="collect gradtool YAML spec files as test items (like --gradtool)")
    group.addoption("--gradtool-gradcheck", action="store_true", default=False,
                    help="route every torch.autograd.gradcheck / gradgradcheck call to "
                         "gradtool's drop-in (gradtool.gradcheck: torch's contract, gradtool's "
                         "reports)")
    parser.addini("gradtool_gradcheck", type="bool", default=False,
                  help="route torch's gradcheck calls to gradtool (like --gradtool-gradcheck)")
    group.addoption("--gradtool-save-inputs", metavar="DIR", default=None,
                    help="with --gradtool-gradcheck: save each failing call's inputs in DIR "
                         "(torch.save of (args, kwargs)), named in its report's reproduce: line "
                         "(the environment variable GRADTOOL_SAVE_INPUTS does the same)")


def enabled(config: pytest.Config) -> bool:
    """Whether this run opted in to spec collection."""
    return bool(config.getoption("gradtool", False) or config.getini("gradtool"))


def gradcheck_enabled(config: pytest.Config) -> bool:
    """Whether this run routes torch's gradcheck calls to the drop-in."""
    return bool(config.getoption("gradtool_gradcheck", False)
                or config.getini("gradtool_gradcheck"))


# First, so names a conftest or a plugin binds in its own pytest_configure are routed too.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gradtool_trace(**settings): check every custom "
                            "autograd.Function / custom op call the test makes")
    # Validate [tool.gradtool] up front, so a typo is one usage error rather than N failures.
    if enabled(config):
        project_settings(config)
    if gradcheck_enabled(config):
        config.stash[_worker_calls_key] = []
        folder = config.getoption("gradtool_save_inputs", None)
        if folder:  # read by the drop-in on a failure (dropin/saved.py), in xdist workers too
            os.environ["GRADTOOL_SAVE_INPUTS"] = str(Path(folder).resolve())
        if not _xdist_controller(config):  # the controller runs no test: no torch there
            config.stash[SWAP_KEY] = _routed_swap()
        os.environ["GRADTOOL_GRADCHECK"] = "1"  # a suite's marks may ask (docs: xfail)
        from gradtool.run.swap import Xpassed

        config.stash[_xpassed_key] = []
        config.pluginmanager.register(Xpassed(config.stash[_xpassed_key]), "gradtool-xpassed")


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) \
        and getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def _routed_swap() -> Any:
    """torch's two functions routed to the drop-in, each call labelled with its test."""
    from gradtool.dropin import gradcheck, gradgradcheck
    from gradtool.run.swap import Swap

    def where() -> str:  # "tests/test_x.py::test_y (call)": the phase is not part of the test
        return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]

    swap = Swap({"gradcheck": gradcheck, "gradgradcheck": gradgradcheck}, where)
    swap.install()
    return swap


def pytest_unconfigure(config: pytest.Config) -> None:
    swap = config.stash.get(SWAP_KEY, None)
    if swap is not None:
        swap.restore()
    if _xpassed_key in config.stash:  # set by this session's pytest_configure
        os.environ.pop("GRADTOOL_GRADCHECK", None)
        if config.getoption("gradtool_save_inputs", None):
            os.environ.pop("GRADTOOL_SAVE_INPUTS", None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    swap = session.config.stash.get(SWAP_KEY, None)
    if swap is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput[GRADCHECK_OUTPUT] = [call.row() for call in swap.calls]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: a finished worker's routed calls, for the summary."""
    rows = getattr(node, "workeroutput", {}).get(GRADCHECK_OUTPUT)
    if rows and _worker_calls_key in node.config.stash:
        node.config.stash[_worker_calls_key].extend(rows)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _worker_calls_key not in config.stash:
        return
    from gradtool.run.swap import Call

    swap = config.stash.get(SWAP_KEY, None)
    calls = (swap.calls if swap else []) + [Call(*row) for row in config.stash[_worker_calls_key]]
    terminalreporter.write_sep("-", "gradtool --gradtool-gradcheck")
    terminalreporter.write_line(gradcheck_summary(calls))
    from gradtool.run.swap import expected_failures_passed

    line = expected_failures_passed(calls, config.stash.get(_xpassed_key, []))
    if line:
        terminalreporter.write_line(line)


def gradcheck_summary(calls: list[Any]) -> str:
    """'12 gradcheck calls ran through gradtool in 1.52 s: 10 passed, 2 failed, 0 raised ...'."""
    if not calls:
        return ("no torch.autograd.gradcheck or gradgradcheck call was made "
                "(nothing ran through gradtool)")
    count = {o: sum(c.outcome == o for c in calls)
             for o in ("passed", "failed", "raised", "internal")}
    second = sum(c.name == "gradgradcheck" for c in calls)
    kinds = f" ({len(calls) - second} gradcheck, {second} gradgradcheck)" if second else ""
    return (f"{len(calls)} gradcheck calls{kinds} ran through gradtool in "
            f"{sum(c.seconds for c in calls):.2f} s: {count['passed']} passed, "
            f"{count['failed']} failed, {count['raised']} raised another exception"
            + (f"; {count['internal']} stopped by an internal error of gradtool (a bug in "
               "gradtool, not in the code checked: please report it with its traceback)"
               if count["internal"] else ""))


def project_settings(config: pytest.Config) -> dict[str, Any]:
    """CheckConfig keyword arguments from [tool.gradtool] (defaults where unset), cached per run."""
    if _settings_key not in config.stash:
        from gradtool.config.pyproject import check_config_kwargs, discover
        from gradtool.errors import GradtoolError

        try:
            project = discover(config.rootpath)
        except GradtoolError as exc:
            raise pytest.UsageError(f"gradtool: {exc}") from None
        config.stash[_settings_key] = check_config_kwargs(project.settings)
    return config.stash[_settings_key]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> SpecFile | None:
    if file_path.suffix in SPEC_SUFFIXES and enabled(parent.config) and is_spec_file(file_path):
        return SpecFile.from_parent(parent, path=file_path)
    return None


def is_spec_file(path: Path) -> bool:
    """A gradtool spec file, as opposed to CI configs, docker-compose files and other YAML."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if "specs" not in text and "version" not in text:
        return False  # the common case, decided without parsing
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        # Broken YAML that declares specs is ours: collection then reports the syntax error.
        return bool(_TOP_LEVEL_SPECS.search(text))
    return isinstance(data, dict) and bool(data) and ("specs" in data or set(data) <= FILE_KEYS)


class SpecFile(pytest.File):
    """One YAML spec file; an invalid file is one collection error with every SpecError in it."""

    def collect(self) -> Iterator[SpecNode]:
        from gradtool.errors import GradtoolError
        from gradtool.spec.schema import load_file

        try:
            specs = load_file(display_path(self.path))
        except GradtoolError as exc:
            raise self.CollectError(str(exc)) from None
        for spec in specs:
            yield SpecNode.from_parent(self, name=node_name(spec.name), spec=spec)


class SpecNode(pytest.Collector):
    """One spec: resolves its target (a bad one fails this spec only) and yields its checks."""

    def __init__(self, *, spec: Spec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def collect(self) -> Iterator[SpecItem]:
        from dataclasses import replace

        from gradtool.config.registry import BY_NAME
        from gradtool.config.settings import CheckConfig
        from gradtool.errors import GradtoolError
        from gradtool.run.collect import Run

        try:
            [job], _ = Run((self.spec,), CheckConfig(**project_settings(self.config)))()
        except GradtoolError as exc:
            raise self.CollectError(str(exc)) from None
        single = len(job.cases) == 1 and job.cases[0].label == "case 0"
        for case in job.cases:
            for check in job.config.checks:
                if job.target.kind.applies(BY_NAME[check]):
                    continue  # a check not for this kind (the op checks): no item
                name = check if single else f"{check}[{node_name(case.label)}]"
                one = replace(job, cases=[case], config=job.config.with_(checks=(check,)))
                yield SpecItem.from_parent(self, name=name, job=one)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.spec.line - 1, self.spec.name


class SpecItem(pytest.Item):
    """One check on one case of a spec; outcomes map to pytest's (xfail, skip, fail)."""

    def __init__(self, *, job: Job, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job

    def runtest(self) -> None:
        from gradtool.results import Rejected
        from gradtool.run.runner import run_one

        from gradtool.api import torch_trace_silenced

        with torch_trace_silenced():
            target = run_one(self.job)  # as a CLI worker runs a job
        if isinstance(target, Rejected):  # e.g. inputs that cannot be built for this case
            raise CheckFailed(f"ERROR {self.job.target.name}\n  {target.message}")
        case = target.cases[0]
        settle(target, case, case.checks[0], self.job.config.strict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int, str]:
        spec = self.parent.spec if isinstance(self.parent, SpecNode) else None
        line = spec.line - 1 if spec else 0
        return self.path, line, f"{self.job.target.name} {self.name}"


def settle(target: TargetResult, case: CaseResult, check: CheckResult, strict: bool) -> None:
    """Turn one gradtool outcome into pytest's: return (pass), skip, xfail, warn, or raise."""
    from gradtool.render.terminal import check_text
    from gradtool.results import Outcome

    outcome = check.outcome
    if outcome is Outcome.SKIPPED:
        pytest.skip(check.summary or "skipped by gradtool")
    if outcome is Outcome.XFAILED:
        pytest.xfail(check.expected_failure or "declared expected to fail")
    if outcome is Outcome.INCONCLUSIVE and not strict:
        warnings.warn(GradtoolInconclusive(check_text(target, case, check)), stacklevel=1)
        return
    if outcome.is_bad(strict) or (strict and check.warnings):
        raise CheckFailed(check_text(target, case, check))
    if check.warnings:  # legal, but worth telling: a warning, as for inconclusive outcomes
        warnings.warn(GradtoolWarning(check_text(target, case, check)), stacklevel=1)


def display_path(path: Path) -> str:
    """Relative to the current folder when inside it, so reports read like the CLI's."""
    try:
        return Path(os.path.relpath(path)).as_posix() if path.is_relative_to(Path.cwd()) \
            else str(path)
    except ValueError:  # another drive on Windows
        return str(path)


def node_name(text: str) -> str:
    # '::' separates node ids; a spec named 'a::b' must not read as two nodes.
    return " ".join(text.split()).replace("::", ":")


@pytest.fixture
def gradtool_check(request: pytest.FixtureRequest) -> Callable[..., Report]:
    """check(target, inputs=None, kwargs=None, **settings) -> Report; fails the test with the
    plain report. inputs and kwargs take the test's own tensors, as gradtool.check does.

    Settings default to [tool.gradtool] (the ones `gradtool check` uses); keyword arguments
    override them (any CheckConfig field: seed, atol, rtol, mode, checks, strict, ...).
    """
    defaults = project_settings(request.config)

    def check(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
              **settings: Any) -> Report:
        __tracebackhide__ = True
        from gradtool.api import check as run_checks
        from gradtool.render.terminal import render_plain

        merged = {**defaults, **settings}
        report = run_checks(target, inputs, kwargs, **merged)
        if not report.ok(bool(merged.get("strict"))):
            pytest.fail("gradtool found gradient problems:\n" + render_plain(report, quiet=True))
        return report

    return check


class Tracer:
    """What the gradtool_trace fixture gives a test: the custom calls recorded so far, and
    check(), which the plugin also runs right after the test body (a failure fails the test)."""

    def __init__(self, folder: str, settings: dict[str, Any], max_calls: int = 1000) -> None:
        from gradtool.run.trace import Recorder, hooked

        self.messages: list[tuple[Any, ...]] = []
        self.settings, self.checked, self.report = settings, False, None
        self.recorder = Recorder(folder, max_calls, "", self.messages.append)
        self._hook: Any = hooked(self.recorder)
        self._hook.__enter__()

    @property
    def calls(self) -> list[str]:
        """'RowSumSq at test_model.py:12, input 8x40 float32' for each distinct call so far."""
        from gradtool.run.recorded import call_name
        from gradtool.run.trace_messages import recorded

        return [call_name(entry) for entry in recorded(self.messages)]

    def stop(self) -> None:
        """Stop recording (idempotent); the hooks are put back."""
        if self._hook is not None:
            hook, self._hook = self._hook, None
            hook.__exit__(None, None, None)

    def check(self) -> Report:
        """Check every distinct call recorded; fail the test with the report if one is wrong."""
        __tracebackhide__ = True
        from gradtool.config.settings import CheckConfig
        from gradtool.render.terminal import render_plain
        from gradtool.run.recorded import check_live
        from gradtool.run.trace_messages import recorded

        self.stop()
        self.checked, config = True, CheckConfig(**self.settings)
        entries = recorded(self.messages)
        from gradtool.api import torch_trace_silenced

        with torch_trace_silenced():
            self.report = check_live(entries, self.recorder.owners, config)
        if not self.report.ok(config.strict):
            pytest.fail("gradtool found gradient problems in the custom calls this test made:\n"
                        + render_plain(self.report, quiet=True), pytrace=False)
        return self.report


@pytest.fixture
def gradtool_trace(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracer]:
    """Record every custom autograd.Function / custom op call the test makes (distinct
    signatures) and check each on the inputs it received, right after the test body.

    Settings come from [tool.gradtool]; a `gradtool_trace` marker's keywords override them."""
    tracer = _tracer(request.node, str(tmp_path_factory.mktemp("gradtool_trace")))
    try:
        yield tracer
    finally:
        tracer.stop()


def _tracer(item: Any, folder: str) -> Tracer:
    marker = item.get_closest_marker("gradtool_trace")
    overrides = dict(marker.kwargs) if marker else {}
    max_calls = int(overrides.pop("max_calls", 1000))
    return Tracer(folder, {**project_settings(item.config), **overrides}, max_calls)


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test marked gradtool_trace gets the fixture: its recordings in pytest's pruned folders."""
    names = getattr(item, "fixturenames", ["gradtool_trace"])  # (a doctest item has none)
    if item.get_closest_marker("gradtool_trace") and "gradtool_trace" not in names:
        names.append("gradtool_trace")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test using the fixture (or marked gradtool_trace) has its recorded calls checked once
    its body passed: a wrong gradient fails the test itself, not its teardown."""
    tracer = getattr(item, "funcargs", {}).get("gradtool_trace")
    try:
        result = yield
    except BaseException:
        tracer is None or tracer.stop()  # the calls of a failed body are not checked
        raise
    if isinstance(tracer, Tracer) and not tracer.checked:
        tracer.check()
    return result
