"""The CLI's output: the report on stdout and in its files, the progress bar, colour, pipes."""

from __future__ import annotations

import os
import sys
from inspect import signature
from pathlib import Path
from typing import Any

import click

from ..config import registry
from ..errors import GradtoolError
from ..results import Report
from .options import ReportOptions


def emit(report: Report, settings: dict[str, Any], options: ReportOptions) -> None:
    """The report on stdout (--format), each report file given (config/registry.py FORMATS:
    an option or its [tool.gradtool] key), and GitHub annotations when enabled."""
    from ..render.json import render_json

    fmt = settings.get("format") or "terminal"
    if fmt == "json":
        click.echo(render_json(report))
    else:
        print_terminal(report, options)
    written = report_files(settings, options)
    for name, path in written.items():
        form = registry.FORMATS[name]
        render = form.renderer()
        links = {k: v for k, v in written.items() if k in signature(render).parameters}
        text = render(report, **links)
        write_file(path, text if text.endswith("\n") else text + "\n", f"{name} report")
    from ..render.annotations import annotations_enabled, render_github

    if annotations_enabled(settings.get("annotations"), os.environ):
        text = render_github(report, Path(os.environ.get("GITHUB_WORKSPACE") or Path.cwd()))
        if text:
            click.echo(text.rstrip("\n"), err=fmt == "json")


def report_files(settings: dict[str, Any], options: ReportOptions) -> dict[str, str]:
    """Format name -> the path its report goes to: the option's, else pyproject's key."""
    given = dict(options.files)
    found = {name: given.get(name) or (settings.get(form.pyproject_key)
                                       if form.pyproject_key else None)
             for name, form in registry.FORMATS.items()}
    return {name: path for name, path in found.items() if path}


def print_terminal(report: Report, options: ReportOptions) -> None:
    from ..render.terminal import HEATMAP, heat_text, report_lines

    out = console(sys.stdout, options.color or "auto")
    for text, style in report_lines(report, options.verbose, options.quiet):
        if style == HEATMAP:  # -v's text heat map: a colour per shade
            out.print(heat_text(text))
        else:
            out.print(text, style=style or None, markup=False)


def write_file(path: str, text: str, what: str) -> None:
    """Write a report file, creating its folder (as pytest's --junitxml does)."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GradtoolError(f"cannot write the {what} to {path}: {exc.strerror or exc}",
                            "check that the folder exists and is writable") from None


def silence_stdout() -> None:
    """Point stdout at /dev/null (its reader left), so the exit flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


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

            self.bar = Progress(transient=True, console=console(sys.stderr, "auto"))
            self.bar.start()
            self.task = self.bar.add_task("checking", total=self.total, completed=self.done)
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done - 1, description=name[-50:])

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def console(stream: Any, color: str):
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # rich would exit 1; the verdict decides the exit code

    colored = use_color(color, stream)
    return PipeAwareConsole(file=stream, no_color=not colored, highlight=False, soft_wrap=True,
                   force_terminal=colored if color == "always" else None,
                   color_system="auto" if colored else None)


def use_color(choice: str, stream: Any) -> bool:
    """--color always/never win; auto means a TTY (or FORCE_COLOR) and no NO_COLOR."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(getattr(stream, "isatty", lambda: False)())
