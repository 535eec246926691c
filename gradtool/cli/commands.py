"""The bodies of the CLI commands (imported lazily, so `gradtool --help` never loads torch)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..config.settings import CheckConfig
from ..errors import ExitCode, GradtoolError, NothingToCheck
from ..results import Report
from .options import (CheckOptions, GraphOptions, IsolationOptions, ListOptions, Options,
                      ReportOptions, TargetOptions)
from .output import LateProgress, console, emit, silence_stdout, write_file

if TYPE_CHECKING:
    from ..run.collect import Run


def settings_from(options: Options) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge the command line over [tool.gradtool] over the defaults."""
    from ..config.pyproject import discover, merge

    return merge(discover(Path.cwd()), options.settings())


def config_from(settings: dict[str, Any], resample: int | None = None) -> CheckConfig:
    from ..config.pyproject import check_config_kwargs

    kwargs = check_config_kwargs(settings)
    kwargs["checks"] = tuple(kwargs.get("checks") or ())
    return CheckConfig(**kwargs, resample=resample or 0)


def collection(arguments: list[str], config: CheckConfig, options: TargetOptions) -> Run:
    """The run's collection from the command line's target options (in a worker, when
    isolated: a factory given with --inputs-from is the user's code too)."""
    from ..run.collect import Run, Sources

    return Run(tuple(arguments), config, Sources(options.inputs, options.inputs_from,
                                                 options.init, options.imports, options.sweeps))


def run_check(options: CheckOptions) -> ExitCode:
    settings, sources = settings_from(options)
    if options.show_config:
        from ..config.pyproject import render_effective

        click.echo(render_effective(settings, sources))
        return ExitCode.OK
    config = config_from(settings, options.resample).with_(
        reference=options.reference, autocast=options.autocast)
    if options.trust_callables:
        config = config.with_(trust_callables=True)
    targets = list(settings.get("paths") or [])
    if not targets:
        raise NothingToCheck("nothing to check: give a target (module:Name, file.py:Name, a "
                             "spec file or folder), or set paths in [tool.gradtool]")
    collect = collection(targets, config, options)
    if options.isolate:
        try:
            report = supervised(collect, config, targets, options)
        except WorkerBugs as bugs:
            return _told_bugs(bugs, settings, options)
    else:
        from .worker import import_torch, quiet_expected_warnings

        import_torch()
        quiet_expected_warnings()
        report = _run(collect, quiet=options.quiet)
    if options.save_inputs:
        _save_inputs(options.save_inputs, collect()[0])  # in this process, and only when asked
    if options.repro and not report.ok(config.strict):
        report = _reproduce(report, collect, options)
    try:
        emit(report, settings, options)
    except BrokenPipeError:  # `gradtool check ... | head`: the verdict still decides the code
        silence_stdout()
    return verdict(report, config.strict)


def _told_bugs(bugs: WorkerBugs, settings: Any, options: CheckOptions) -> ExitCode:
    """The report, then each bug's traceback and how to report it: exit 3."""
    try:
        emit(bugs.report, settings, options)
    except BrokenPipeError:
        silence_stdout()
    for text in bugs.tracebacks:
        click.echo(text, err=True)
    click.echo(f"gradtool: internal error (a bug in gradtool) on {len(bugs.tracebacks)} "
               "target(s), shown as errors above; the other targets' verdicts stand — please "
               "report it with the traceback above", err=True)
    return ExitCode.INTERNAL


def verdict(report: Report, strict: bool) -> ExitCode:
    """The exit code of a finished run."""
    if report.interrupted:
        return ExitCode.INTERRUPTED
    if report.rejected:
        return ExitCode.USAGE
    return ExitCode.OK if report.ok(strict) else ExitCode.CHECKS_FAILED


def _reproduce(report: Report, collect: Any, options: CheckOptions) -> Report:
    """--repro: shrink each failing target's case and write its test (in this process, after
    the run, and only when something failed)."""
    from dataclasses import replace

    from ..run.repro import DEFAULT_BUDGET, write_reproducers
    from .worker import quiet_expected_warnings

    quiet_expected_warnings()
    start = time.perf_counter()
    try:
        written = write_reproducers(report, collect()[0], options.repro,
                                    options.repro_budget or DEFAULT_BUDGET)
    except KeyboardInterrupt:  # Ctrl-C while shrinking: the run's own report still stands
        click.echo("gradtool: --repro interrupted; no reproducer written", err=True)
        return report
    # Shrinking is the run's own time (Report.time_parts): told in the run's duration.
    return replace(report, reproducers=written,
                   duration_s=report.duration_s + time.perf_counter() - start)


def _save_inputs(path: str, jobs: list[Any]) -> None:
    """Rebuild each case (same seed, same values) and write its inputs for --inputs-from."""
    from ..run.runner import case_for
    from ..targets.factory import save_inputs

    if len(jobs) != 1:
        raise GradtoolError(f"--save-inputs writes the inputs of one target; {len(jobs)} ran",
                            "name one target")
    job = jobs[0]
    built = [case_for(job, spec) for spec in job.cases]
    save_inputs(path, [(c.label, c.specs, c.problem.given_args()) for c in built])


def supervised(collect: Any, config: CheckConfig, targets: list[str],
               options: ReportOptions | IsolationOptions) -> Report:
    """Run in worker processes (see supervise.py), telling the progress (progress.py): a live
    display on a terminal, plain `progress` lines on a pipe once the run is long."""
    from .progress import Watch
    from .supervise import Supervisor

    workers = options.workers or "1"
    count = (os.cpu_count() or 1) if workers == "auto" else int(workers)
    watch = None if options.quiet else Watch(lambda text: click.echo(text, err=True),
                                             live=sys.stderr.isatty())
    supervisor = Supervisor(collect, config, count, options.max_rss, _warm_renderers, watch)
    try:
        report = supervisor.run(targets)
    finally:
        if watch is not None:
            watch.stop()
    if supervisor.bugs:
        raise WorkerBugs(report, tuple(supervisor.bugs))
    return report


class WorkerBugs(Exception):
    """gradtool's own error on some targets in their workers: the report (the others'
    verdicts, those targets as errors) is still shown, then the tracebacks, exit 3."""

    def __init__(self, report: Report, tracebacks: tuple[str, ...]) -> None:
        super().__init__(f"{len(tracebacks)} target(s) hit a bug in gradtool")
        self.report, self.tracebacks = report, tracebacks


def _warm_renderers() -> None:
    """The report's imports (rich ~60-250 ms), made while the workers import torch."""
    import rich.console  # noqa: F401

    from ..render import annotations, json, terminal  # noqa: F401


def _run(collect: Run, quiet: bool) -> Report:
    """--no-isolate: the run in this process, with the late progress bar on a terminal."""
    bars: list[LateProgress] = []

    def progress(jobs: int) -> Any:
        if quiet or not sys.stderr.isatty() or jobs < 2:
            return None
        bars.append(LateProgress(jobs))
        return bars[-1].step

    try:
        return collect.report(progress)
    finally:
        for bar in bars:
            bar.stop()


def run_list(options: ListOptions) -> ExitCode:
    """What check would run: targets, their kinds and inputs (inferred ones are inferred)."""
    from .listing import list_lines, rule_lines

    settings, _ = settings_from(options)
    config = config_from(settings)
    targets = list(settings.get("paths") or [])
    if options.rules:
        for line in rule_lines(config):
            click.echo(line)
        if not options.targets:
            return ExitCode.OK
    if not targets:
        raise NothingToCheck("nothing to list: give a target, spec file or folder")
    jobs, rejected = collection(targets, config, options)()
    for line in list_lines(jobs, rejected, config):
        click.echo(line)
    return ExitCode.USAGE if rejected else ExitCode.OK


def run_graph(options: GraphOptions) -> ExitCode:
    """Record the forward of one target and render its autograd graph."""
    from ..graph.build import record
    from ..graph.render import render

    config = config_from(settings_from(options)[0])
    jobs, rejected = collection([options.target], config, options)()
    if rejected:
        raise GradtoolError(rejected[0].message)
    if len(jobs) != 1:
        from ..run.collect import is_spec_argument

        hint = ("name the Function itself, e.g. gradtool graph path/to/file.py:Name -i 3x4"
                if is_spec_argument(options.target)
                else "name one: " + ", ".join(j.target.name for j in jobs[:4]))
        raise GradtoolError(f"{options.target} holds {len(jobs)} targets; graph shows one", hint)
    from ..run.runner import case_for

    job = jobs[0]
    try:
        case = case_for(job, job.cases[0])
        fn, args, names = case.problem.recordable()
        graph = record(fn, args, names, grads=options.grads, seed=case.seed)
    except GradtoolError:
        raise
    except Exception as exc:  # the user's forward raised: report it, like a check error
        from ..tracebacks import trim

        click.echo(f"gradtool: {job.target.name}: forward raised\n{trim(exc)}", err=True)
        return ExitCode.CHECKS_FAILED
    if options.output:
        write_file(options.output, render(graph, options.fmt, options.depth), "graph")
    elif options.fmt == "tree":
        from ..graph.render import styled_tree

        tree = styled_tree(graph, options.depth)
        tree.rstrip()
        console(sys.stdout, options.color).print(tree)
    else:
        click.echo(render(graph, options.fmt, options.depth), nl=False)
    # --grads is a diagnosis: a gradient that dies or explodes fails the command.
    failed = options.grads and (graph.problems or graph.backward_error)
    return ExitCode.CHECKS_FAILED if failed else ExitCode.OK


