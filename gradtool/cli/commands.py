"""The bodies of the CLI commands (imported lazily, so `gradtool --help` never loads torch)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..config.settings import CheckConfig
from ..errors import ExitCode, GradtoolError, NothingToCheck
from ..results import Report
from ..targets.inputs import parse_input


def settings_from(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge the command line over [tool.gradtool] over the defaults."""
    from ..config.pyproject import discover, merge

    cli = {
        "seed": kw.get("seed"), "dtype": kw.get("dtype"), "device": kw.get("device"),
        "eps": kw.get("eps"), "atol": kw.get("atol"), "rtol": kw.get("rtol"),
        "nondet_tol": kw.get("nondet_tol"), "mode": kw.get("mode"),
        "checks": list(kw.get("checks") or []) or None, "strict": kw.get("strict"),
        "probes": kw.get("probes"), "max_memory": kw.get("max_memory"),
        "timeout": kw.get("timeout"),
        "format": kw.get("fmt") if kw.get("fmt") in ("terminal", "json") else None,
        "junit_xml": kw.get("junit_xml"), "annotations": kw.get("annotations"),
        "html": kw.get("html"),
        "paths": list(kw.get("targets") or []) or None,
    }
    return merge(discover(Path.cwd()), cli)


def config_from(settings: dict[str, Any], resample: int | None = None) -> CheckConfig:
    from ..config.pyproject import check_config_kwargs

    kwargs = check_config_kwargs(settings)
    kwargs["checks"] = tuple(kwargs.get("checks") or ())
    return CheckConfig(**kwargs, resample=resample or 0)


def parse_inputs(raw: tuple[str, ...] | list[str]) -> list[Any] | None:
    return [parse_input(text) for text in raw] if raw else None


def _sources(kw: dict[str, Any], config: CheckConfig) -> dict[str, Any]:
    """What the options give besides targets: inputs, a factory's cases, constructor arguments."""
    from ..targets.factory import parse_init

    inputs = parse_inputs(kw.get("inputs") or ())
    cases = None
    if kw.get("inputs_from"):
        if inputs is not None:
            raise GradtoolError("give --input or --inputs-from, not both")
        from ..run.runner import CaseSpec
        from ..targets.factory import load_inputs

        cases = [CaseSpec(label, specs, config.seed, kw["inputs_from"]) for label, specs in
                 load_inputs(kw["inputs_from"], config.seed, config.dtype, config.device)]
    from ..targets.sizes import parse_sweep

    sweeps = [parse_sweep(text) for text in kw.get("sweeps") or ()]
    return {"inputs": inputs, "cases": cases, "init": parse_init(kw.get("init") or ()),
            "imports": tuple(kw.get("imports") or ()), "sweeps": sweeps}


def run_check(kw: dict[str, Any]) -> int:
    settings, sources = settings_from(kw)
    if kw.get("show_config"):
        from ..config.pyproject import render_effective

        click.echo(render_effective(settings, sources))
        return ExitCode.OK
    config = config_from(settings, kw.get("resample")).with_(
        reference=kw.get("reference"), autocast=kw.get("autocast"))
    if kw.get("trust_callables"):
        config = config.with_(trust_callables=True)
    targets = list(settings.get("paths") or [])
    if not targets:
        raise NothingToCheck("nothing to check: give a target (module:Name, file.py:Name, a "
                             "spec file or folder), or set paths in [tool.gradtool]")
    from functools import partial  # picklable, for workers that are spawned, not forked

    options = {name: kw.get(name) for name in ("inputs", "inputs_from", "init", "imports",
                                                "sweeps")}
    collect = partial(_jobs_for, targets, config, options)
    if kw.get("isolate", True):
        report = _supervise(collect, config, targets, kw)
    else:
        from .worker import import_torch, quiet_expected_warnings

        import_torch()
        quiet_expected_warnings()
        jobs, rejected = collect()
        report = _run(jobs, rejected, config, quiet=kw.get("quiet", False))
    if kw.get("save_inputs"):
        _save_inputs(kw["save_inputs"], collect()[0])  # in this process, and only when asked
    if kw.get("repro") and not report.ok(config.strict):
        report = _reproduce(report, collect, kw)
    try:
        _emit(report, settings, kw)
    except BrokenPipeError:  # `gradtool check ... | head`: the verdict still decides the code
        silence_stdout()
    if report.interrupted:
        return ExitCode.INTERRUPTED
    if report.rejected:
        return ExitCode.USAGE
    return ExitCode.OK if report.ok(config.strict) else ExitCode.CHECKS_FAILED


def _reproduce(report: Report, collect: Any, kw: dict[str, Any]) -> Report:
    """--repro: shrink each failing target's case and write its test (in this process, after
    the run, and only when something failed)."""
    from dataclasses import replace

    from ..run.repro import DEFAULT_BUDGET, write_reproducers
    from .worker import quiet_expected_warnings

    quiet_expected_warnings()
    try:
        written = write_reproducers(report, collect()[0], kw["repro"],
                                    kw.get("repro_budget") or DEFAULT_BUDGET)
    except KeyboardInterrupt:  # Ctrl-C while shrinking: the run's own report still stands
        click.echo("gradtool: --repro interrupted; no reproducer written", err=True)
        return report
    return replace(report, reproducers=written)


def _jobs_for(targets: list[str], config: CheckConfig, options: dict[str, Any]):
    """Collection from the command line's target options (in a worker, when isolated: a
    factory given with --inputs-from is the user's code too)."""
    return _collect(targets, config, **_sources(options, config))


def _save_inputs(path: str, jobs: list[Any]) -> None:
    """Rebuild each case (same seed, same values) and write its inputs for --inputs-from."""
    from ..run.runner import case_for
    from ..targets.factory import save_inputs

    if len(jobs) != 1:
        raise GradtoolError(f"--save-inputs writes the inputs of one target; {len(jobs)} ran",
                            "name one target")
    job = jobs[0]
    built = [case_for(job, spec) for spec in job.cases]
    save_inputs(path, [(c.label, c.specs, c.problem.args) for c in built])


def _collect(targets: list[str], config: CheckConfig, inputs: list[Any] | None,
             cases: list[Any] | None = None, init: dict[str, Any] | None = None,
             imports: tuple[str, ...] = (), sweeps: list[Any] | None = None):
    from ..results import Rejected
    from ..run.collect import collect_one

    if imports:  # before any target: they register the ops named as ns::name
        from ..targets.ops import import_all

        import_all(imports)
    jobs, rejected, errors = [], [], []
    for arg in targets:
        try:
            found, bad = collect_one(arg, config, inputs, cases, init, imports, sweeps)
        except GradtoolError as exc:
            errors.append(exc)
            rejected.append(Rejected(arg, str(exc)))
            continue
        jobs += found
        rejected += bad
    if not jobs and errors and len(errors) == len(rejected):
        raise errors[0]  # one bad target alone: a short error, exit 2
    if not jobs and not rejected:
        raise NothingToCheck(f"nothing to check in {', '.join(targets)}")
    return jobs, rejected


def _supervise(collect: Any, config: CheckConfig, targets: list[str], kw: dict[str, Any]
               ) -> Report:
    """Run in worker processes (see supervise.py), with the late progress bar on a TTY."""
    from .supervise import Supervisor

    workers = kw.get("workers") or "1"
    count = (os.cpu_count() or 1) if workers == "auto" else int(workers)
    shown = not kw.get("quiet") and sys.stderr.isatty()
    progress: list[LateProgress] = []  # its second starts once the workers have collected

    def step(name: str) -> None:
        if shown and supervisor.total > 1:
            progress or progress.append(LateProgress(supervisor.total))
            progress[0].step(name)

    supervisor = Supervisor(collect, config, count, kw.get("max_rss"), step, _warm_renderers)
    try:
        return supervisor.run(targets)
    finally:
        for bar in progress:
            bar.stop()


def _warm_renderers() -> None:
    """The report's imports (rich ~60-250 ms), made while the workers import torch."""
    import rich.console  # noqa: F401

    from ..render import annotations, json, terminal  # noqa: F401


def _run(jobs: list[Any], rejected: list[Any], config: CheckConfig, quiet: bool) -> Report:
    from ..run import runner

    if quiet or not sys.stderr.isatty() or len(jobs) < 2:
        return runner.run(jobs, config, rejected)
    progress = LateProgress(len(jobs))
    try:
        return runner.run(jobs, config, rejected, progress.step)
    finally:
        progress.stop()


class LateProgress:
    """A progress bar on stderr that appears only once a run has taken about a second."""

    def __init__(self, total: int, delay: float = 1.0) -> None:
        import time

        self.total, self.done, self.delay = total, 0, delay
        self.start = time.perf_counter()
        self.bar: Any = None

    def step(self, name: str) -> None:
        import time

        if self.bar is None and time.perf_counter() - self.start > self.delay:
            from rich.progress import Progress

            self.bar = Progress(transient=True, console=_console(sys.stderr, "auto"))
            self.bar.start()
            self.task = self.bar.add_task("checking", total=self.total, completed=self.done)
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done - 1, description=name[-50:])

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _console(stream: Any, color: str):
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # rich would exit 1; the verdict decides the exit code

    colored = use_color(color, stream)
    return PipeAwareConsole(file=stream, no_color=not colored, highlight=False, soft_wrap=True,
                   force_terminal=colored if color == "always" else None,
                   color_system="auto" if colored else None)


def _emit(report: Report, settings: dict[str, Any], kw: dict[str, Any]) -> None:
    from ..render.json import render_json

    fmt = settings.get("format") or "terminal"
    if fmt == "json":
        click.echo(render_json(report))
    else:
        _print_terminal(report, kw)
    if kw.get("json_path"):
        write_file(kw["json_path"], render_json(report) + "\n", "JSON report")
    if settings.get("html"):
        from ..render.html import render_html

        write_file(settings["html"], render_html(report), "HTML report")
    if settings.get("junit_xml"):
        from ..render.junit import render_junit
        from ..render.terminal import check_text

        write_file(settings["junit_xml"], render_junit(report, check_text, settings.get("html")),
                   "JUnit XML report")
    from ..render.annotations import annotations_enabled, render_github

    if annotations_enabled(settings.get("annotations"), os.environ):
        text = render_github(report, Path(os.environ.get("GITHUB_WORKSPACE") or Path.cwd()))
        if text:
            click.echo(text.rstrip("\n"), err=fmt == "json")


def silence_stdout() -> None:
    """Point stdout at /dev/null (its reader left), so the exit flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def write_file(path: str, text: str, what: str) -> None:
    """Write a report file, creating its folder (as pytest's --junitxml does)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GradtoolError(f"cannot write the {what} to {path}: {exc.strerror or exc}",
                            "check that the folder exists and is writable") from None


def _print_terminal(report: Report, kw: dict[str, Any]) -> None:
    from ..render.terminal import HEATMAP, heat_text, report_lines

    console = _console(sys.stdout, kw.get("color") or "auto")
    for text, style in report_lines(report, kw.get("verbose", False), kw.get("quiet", False)):
        if style == HEATMAP:  # -v's text heat map: a colour per shade
            console.print(heat_text(text))
        else:
            console.print(text, style=style or None, markup=False)


def run_list(kw: dict[str, Any]) -> int:
    """What check would run: targets, their kinds and inputs (inferred ones are inferred)."""
    from .listing import rule_lines

    settings, _ = settings_from(kw)
    config = config_from(settings)
    targets = list(settings.get("paths") or [])
    if kw.get("rules"):
        for line in rule_lines(config):
            click.echo(line)
        if not kw.get("targets"):
            return ExitCode.OK
    if not targets:
        raise NothingToCheck("nothing to list: give a target, spec file or folder")
    jobs, rejected = _collect(targets, config, **_sources(kw, config))
    from .listing import list_lines

    for line in list_lines(jobs, rejected, config):
        click.echo(line)
    return ExitCode.USAGE if rejected else ExitCode.OK


def run_graph(kw: dict[str, Any]) -> int:
    """Record the forward of one target and render its autograd graph."""
    from ..graph.build import record
    from ..graph.render import render

    settings, _ = settings_from(kw)
    config = config_from(settings)
    jobs, rejected = _collect([kw["target"]], config, **_sources(kw, config))
    if rejected:
        raise GradtoolError(rejected[0].message)
    if len(jobs) != 1:
        from ..run.collect import is_spec_argument

        hint = ("name the Function itself, e.g. gradtool graph path/to/file.py:Name -i 3x4"
                if is_spec_argument(kw["target"])
                else "name one: " + ", ".join(j.target.name for j in jobs[:4]))
        raise GradtoolError(f"{kw['target']} holds {len(jobs)} targets; graph shows one", hint)
    from ..run.runner import case_for

    job = jobs[0]
    try:
        case = case_for(job, job.cases[0])
        problem = case.problem
        args = [a.detach().requires_grad_(True) if i in problem.diff else a
                for i, a in enumerate(problem.args)]
        graph = record(problem.fn, args, problem.names, grads=kw.get("grads", False),
                       seed=case.seed)
    except GradtoolError:
        raise
    except Exception as exc:  # the user's forward raised: report it, like a check error
        from ..tracebacks import trim

        click.echo(f"gradtool: {job.target.name}: forward raised\n{trim(exc)}", err=True)
        return ExitCode.CHECKS_FAILED
    fmt = kw.get("fmt") or "tree"
    if kw.get("output"):
        write_file(kw["output"], render(graph, fmt, kw.get("depth")), "graph")
    elif fmt == "tree":
        from ..graph.render import styled_tree

        tree = styled_tree(graph, kw.get("depth"))
        tree.rstrip()
        _console(sys.stdout, kw.get("color") or "auto").print(tree)
    else:
        click.echo(render(graph, fmt, kw.get("depth")), nl=False)
    # --grads is a diagnosis: a gradient that dies or explodes fails the command.
    failed = kw.get("grads") and (graph.problems or graph.backward_error)
    return ExitCode.CHECKS_FAILED if failed else ExitCode.OK


def use_color(choice: str, stream: Any) -> bool:
    """--color always/never win; auto means a TTY (or FORCE_COLOR) and no NO_COLOR."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(getattr(stream, "isatty", lambda: False)())
