"""The body of `gradtool trace`: run a script in a worker recording its custom calls, check them.

Like the check supervisor it imports no torch: the script runs in a recording worker
(run/trace.py), whose calls arrive one by one, each already saved to a .pt file; the checks then
run through the supervisor of `gradtool check` (supervise.py), one job per distinct call.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import click

from ..errors import ExitCode, GradtoolError, NothingToCheck
from ..results import Rejected, Report
from ..run.trace_messages import Checked, Ended, Layouts, Recorded, Refused, TraceMessage
from .options import TraceOptions
from .supervise import TICK_S, exit_cause

LINGER_S = 5.0  # how long a finished script's process may take to exit (its threads, atexit)


@dataclass
class Recording:
    """What the recording worker reported: the distinct calls, how the script ended."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    grads: dict[int, list[str]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    checked: dict[int, Any] = field(default_factory=dict)  # index -> result, checked in place
    ending: tuple[str, str] | None = None   # ("ok" | "raised" | "exit" | "died" | "timeout", ..)
    interrupted: str | None = None

    @property
    def failed(self) -> bool:
        return self.ending is not None and self.ending[0] != "ok"


def run_trace(options: TraceOptions) -> ExitCode:
    from .commands import config_from, settings_from

    spec = _script_spec(options)
    settings, _ = settings_from(options)
    config = config_from(settings)
    folder, temporary = _folder(options.save)
    spec.update(out_dir=folder, max_calls=options.max_calls or 1000, config=config)
    keep = not temporary
    try:
        recording = record(spec, config.timeout)
        _name_entries(recording.entries)
        if options.list_:
            return _list(recording, spec, saved=not temporary)
        code, failed = _check(recording, spec, config, settings, options)
        if failed and temporary and any(e["target"] for e in recording.entries):
            keep = True  # the reproduce lines read these files
            click.echo(f"gradtool: the recorded inputs are kept in {folder} for the reproduce "
                       "lines (--save DIR chooses the folder)", err=True)
        return code
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _script_spec(options: TraceOptions) -> dict[str, Any]:
    """What to run: a script path or a module (-m), and its arguments."""
    module, script, args = options.module, options.script, list(options.args)
    if module and script:
        args.insert(0, script)  # `trace -m pkg.train x y`: x is the module's first argument
        script = None
    if not module and not script:
        raise GradtoolError("give a script to trace: gradtool trace train.py [-- ARGS...]",
                            "or a module: gradtool trace -m package.train [-- ARGS...]")
    if script and not Path(script).is_file():
        raise GradtoolError(f"script not found: {script}",
                            "give the path of a Python file, relative to the current folder")
    return {"path": script, "module": module, "args": args}


def _folder(save: str | None) -> tuple[str, bool]:
    if not save:
        return tempfile.mkdtemp(prefix="gradtool-trace-"), True
    try:
        Path(save).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GradtoolError(f"cannot create --save {save}: {exc.strerror or exc}",
                            "give a writable folder") from None
    return save, False


def record(spec: dict[str, Any], timeout: float) -> Recording:
    """Run the script once in a worker; every call it announced is kept, however it ends."""
    context = multiprocessing.get_context("spawn" if "torch" in sys.modules else "fork")
    ours, theirs = context.Pipe()
    # Not a daemon: the script may start processes of its own (DataLoader workers).
    process = context.Process(target=_serve, args=(theirs, spec))
    recording, stop = Recording(), []
    previous = {s: signal.signal(s, lambda n, _f: stop.append(signal.Signals(n).name))
                for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    try:
        process.start()
        theirs.close()
        while recording.ending is None:
            wait([ours, process.sentinel], timeout=TICK_S)
            _drain(ours, recording)
            if recording.ending is not None:
                break
            if process.exitcode is not None:
                _drain(ours, recording)
                recording.ending = recording.ending or ("died", exit_cause(process.exitcode))
            elif stop:
                recording.interrupted, recording.ending = stop[0], ("interrupted", stop[0])
            elif timeout and time.monotonic() - start > timeout:
                recording.ending = ("timeout", f"{timeout:g}")
    finally:
        process.join(LINGER_S if recording.ending and recording.ending[0] == "ok" else 0)
        if process.exitcode is None:
            process.kill()
            process.join()
        ours.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return recording


def _serve(conn: Any, spec: dict[str, Any]) -> None:
    from ..run.trace import serve

    serve(conn, spec)


def _drain(conn: Any, recording: Recording) -> None:
    try:
        while conn.poll():
            _handle(conn.recv(), recording)
    except (EOFError, OSError):
        pass  # it died; its sentinel says so


def _handle(message: TraceMessage, recording: Recording) -> None:
    if isinstance(message, Recorded):
        recording.entries.append(message.entry)
    elif isinstance(message, Layouts):
        recording.grads.setdefault(message.index, list(message.grads))
    elif isinstance(message, Checked):
        recording.checked[message.index] = message.result
    elif isinstance(message, Ended):
        recording.ending, recording.summary = tuple(message.status), message.summary
    elif isinstance(message, Refused):
        raise GradtoolError(message.message, message.fix)
    else:
        raise RuntimeError(f"the gradtool trace worker hit a bug in gradtool:\n"
                           f"{message.traceback}")


def _name_entries(entries: list[dict[str, Any]]) -> None:
    """'RowSumSq at train.py:23, input 8x40 float32' and the command that replays the call."""
    from ..run.recorded import _reproduce, call_name

    taken: set[str] = set()
    for entry in entries:
        name = call_name(entry)
        entry["name"] = name if name not in taken else f"{name} #{entry['index']}"
        taken.add(entry["name"])
        entry["reproduce"] = _reproduce(entry) if entry["target"] else ""


def _ending_text(recording: Recording, spec: dict[str, Any]) -> str | None:
    """How the script failed, in one message (None when it ran to its end)."""
    if not recording.failed:
        return None
    what, detail = recording.ending  # type: ignore[misc]
    script = spec.get("path") or f"-m {spec.get('module')}"
    text = {"raised": f"the script raised:\n{detail}",
            "exit": f"the script exited with code {detail} (sys.exit)",
            "died": f"the script's process died: {detail}",
            "timeout": f"the script timed out after {detail} s (--timeout) and was stopped",
            "interrupted": f"the script was interrupted ({detail})"}[what]
    recorded = len(recording.entries)
    return (f"{script}: {text}\n{recorded} distinct custom call(s) recorded before that "
            + ("are checked" if what != "interrupted" else "are listed, not checked"))


def _list(recording: Recording, spec: dict[str, Any], saved: bool) -> ExitCode:
    """`gradtool trace --list`: what was recorded, without checking."""
    for entry in recording.entries:
        click.echo(entry["name"])
        if not entry["target"]:
            how = entry["problem"]
        elif saved:
            how = f"replay: {entry['reproduce']}"
        else:
            how = f"target {entry['target']} (--save DIR keeps its inputs for replay)"
        click.echo(f"  called {_times(entry, recording)}; {how}")
        if entry["index"] in recording.grads:
            click.echo(f"  grad_outputs in backward: {'; '.join(recording.grads[entry['index']])}")
    click.echo(_tally(recording))
    ending = _ending_text(recording, spec)
    if ending:
        click.echo(f"gradtool: {ending}", err=True)
        return ExitCode.INTERRUPTED if recording.interrupted else ExitCode.CHECKS_FAILED
    return ExitCode.OK if recording.entries else ExitCode.NOTHING


def _tally(recording: Recording) -> str:
    summary = recording.summary
    repeats = sum(int(v) for v in summary.get("repeats", {}).values())
    text = f"{len(recording.entries)} distinct custom call(s) recorded " \
           f"({len(recording.entries) + repeats} call(s) in all)"
    if summary.get("dropped"):
        text += f"; {summary['dropped']} call(s) of new signatures past --max-calls not recorded"
    if summary.get("no_grad"):
        text += f"; {summary['no_grad']} call(s) without gradient (no_grad, or no input " \
                "requiring grad) not recorded: their backward never runs"
    return text


def _check(recording: Recording, spec: dict[str, Any], config: Any, settings: dict[str, Any],
           options: TraceOptions) -> tuple[ExitCode, bool]:
    """Check each replayable call in the supervised workers; (exit code, whether it failed)."""
    from .commands import supervised
    from .output import emit

    ending = _ending_text(recording, spec)
    usable = [e for e in recording.entries if e["target"]]
    unusable = [Rejected(e["name"], _unusable(e)) for e in recording.entries
                if not e["target"] and e["index"] not in recording.checked]
    if recording.interrupted:
        report = Report((), config.effective, _versions(), tuple(unusable),
                        not_run=tuple(e["name"] for e in usable), interrupted=recording.interrupted)
    elif not recording.entries and not recording.failed:
        raise NothingToCheck(f"{spec.get('path') or spec.get('module')} made no custom "
                             "autograd.Function or custom op call with inputs requiring grad: "
                             "nothing to check. " + _tally(recording))
    else:
        folders = [str(Path(spec["path"]).resolve().parent)] if spec.get("path") else []
        collect = partial(_jobs, usable, config, [*folders, os.getcwd()])
        report = supervised(collect, config, [e["name"] for e in usable], options) \
            if usable else Report((), config.effective, _versions(), (), 0.0)
    report = _with_checked(report, recording, _rerun(spec))
    report = _annotated(report, recording, unusable, ending, spec)
    emit(report, settings, options)
    if ending and not recording.interrupted:
        click.echo(f"gradtool: {ending.splitlines()[0]}", err=True)
    if report.interrupted:
        return ExitCode.INTERRUPTED, True
    bad = any(t.outcome.is_bad(config.strict) for t in report.targets)
    if recording.failed or bad:
        return ExitCode.CHECKS_FAILED, True
    return (ExitCode.USAGE, True) if report.rejected else (ExitCode.OK, False)


def _unusable(entry: dict[str, Any]) -> str:
    """Why a call is not checked, and the other ways to check it."""
    problem = entry["problem"] or "cannot be replayed"
    if "saved and replayed" not in problem:
        return problem
    return (f"{problem}; check it from Python where those arguments live: "
            f"gradtool.check({entry['label']}, inputs=(...)) or assert_gradients, or check the "
            "module that calls it (gradtool check file.py:Model)")


def _rerun(spec: dict[str, Any]) -> str:
    """The command that records and checks again: the trace itself."""
    from ..run.reproduce import shell_quote

    what = f"-m {spec['module']}" if spec.get("module") else shell_quote(spec.get("path") or "")
    args = " ".join(shell_quote(a) for a in spec.get("args") or ())
    return f"gradtool trace {what}" + (f" -- {args}" if args else "")


def _with_checked(report: Report, recording: Recording, rerun: str) -> Report:
    """The calls checked in the recording process (arguments that cannot be saved), by their
    recorded names, in the report beside the replayed ones; a Rejected one is rejected."""
    names = {e["index"]: e["name"] for e in recording.entries}
    targets, rejected = list(report.targets), list(report.rejected)
    spent = 0.0  # their checks' and setup's seconds, in the run's duration (not 0.00s)
    for index, result in sorted(recording.checked.items()):
        name = names.get(index, getattr(result, "target", "?"))
        if isinstance(result, Rejected):
            rejected.append(Rejected(name, result.message))
        else:
            note = ("checked in the traced process, on the recorded arguments held as they "
                    "were (a class made inside a function, or a callable or an object no file "
                    "can hold)")
            cases = tuple(replace(c, notes=(*c.notes, note), reproduce=rerun)
                          for c in result.cases)
            targets.append(replace(result, target=name, cases=cases))
            spent += sum(k.duration_s for c in result.cases for k in c.checks) + \
                sum(c.setup_s for c in result.cases)
    return replace(report, targets=tuple(targets), rejected=tuple(rejected),
                   duration_s=report.duration_s + spent)


def _jobs(entries: list[dict[str, Any]], config: Any, folders: list[str]) -> Any:
    """Collection in a checking worker; loading the script's modules may print: to stderr."""
    from ..run.recorded import trace_jobs

    sys.stdout.flush()
    os.dup2(2, 1)

    return trace_jobs(entries, config, folders)


def _annotated(report: Report, recording: Recording, unusable: list[Rejected],
               ending: str | None, spec: dict[str, Any]) -> Report:
    """Each call's notes (how often, its backward's grad_outputs); the script's own failure."""
    by_name = {e["name"]: e for e in recording.entries}
    targets = []
    for target in report.targets:
        entry = by_name.get(target.target)
        notes = _notes(entry, recording, report.config.get("device", "cpu")) if entry else []
        cases = tuple(replace(c, notes=(*c.notes, *notes)) for c in target.cases)
        targets.append(replace(target, cases=cases))
    rejected = list(report.rejected) + [r for r in unusable if r not in report.rejected]
    if ending and not recording.interrupted:
        script = spec.get("path") or spec.get("module") or "script"
        rejected.append(Rejected(f"script {script}", ending))
    return replace(report, targets=tuple(targets), rejected=tuple(rejected))


def _notes(entry: dict[str, Any], recording: Recording, device: str) -> list[str]:
    notes = [f"recorded from the script: called {_times(entry, recording)} with this signature"]
    grads = recording.grads.get(entry["index"])
    notes.append(f"grad_outputs its backward received: {'; '.join(grads)}" if grads else
                 "its backward did not run in the script (only its forward was used)")
    recorded = entry.get("devices", [])
    if any(d.split(":")[0] != device.split(":")[0] for d in recorded):  # loaded onto --device
        hint = "" if device != "cpu" else f" (--device {recorded[-1]} replays it there)"
        notes.append(f"recorded on {', '.join(recorded)}; replayed on {device}{hint}")
    return notes


def _times(entry: dict[str, Any], recording: Recording) -> str:
    """'3 time(s)'; the repeats are counted in the worker and sent when the script ends."""
    if recording.ending is None or recording.ending[0] not in ("ok", "raised", "exit"):
        return "at least once (the script was stopped before its counts were sent)"
    return f"{1 + int(recording.summary.get('repeats', {}).get(entry['index'], 0))} time(s)"


def _versions() -> dict[str, str]:
    """The report's versions when no worker checked anything (read without importing torch)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {"gradtool": __version__, "torch": of("torch"), "numpy": of("numpy"),
            "python": platform.python_version()}
