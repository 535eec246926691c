"""Recorded calls (`gradtool trace`, the gradtool_trace fixture) turned into jobs for the runner."""

from __future__ import annotations

import sys
from typing import Any

from ..config.settings import CheckConfig
from ..errors import GradtoolError
from ..results import Rejected, Report
from ..targets.factory import load_inputs
from ..targets.kinds import named
from ..targets.resolve import make_target, resolve
from .runner import CaseSpec, Job

LABEL = "recorded call"


def call_name(entry: dict[str, Any]) -> str:
    """'RowSumSq at train.py:23, input 8x40 float32': class or op, call site, input layouts."""
    inputs = entry["inputs"]
    return (f"{entry['label']} at {entry['site'] or 'an unknown line'}, "
            f"input{'s' if len(inputs) > 1 else ''} {'; '.join(inputs)}")


def trace_jobs(entries: list[dict[str, Any]], config: CheckConfig, folders: list[str]
               ) -> tuple[list[Job], list[Rejected]]:
    """In a check worker: one job per recorded call, its target loaded by name (as the reproduce
    line loads it), its case the saved inputs."""
    for folder in reversed(folders):  # where the script found its own modules
        if folder not in sys.path:
            sys.path.insert(0, folder)
    jobs, rejected = [], []
    for entry in entries:
        try:
            [target] = resolve(entry["target"])
            target.name = entry["name"]
            jobs.append(_job(target, entry, config))
        except GradtoolError as exc:
            rejected.append(Rejected(entry["name"], str(exc)))
        except SystemExit as exc:  # a script without a __main__ guard, loaded by name
            rejected.append(Rejected(entry["name"], (
                f"loading {entry['target']} ran the script, which called sys.exit({exc.code!r}): "
                "put its run under `if __name__ == \"__main__\":` or its Functions in a module")))
    return jobs, rejected


def _job(target: Any, entry: dict[str, Any], config: CheckConfig) -> Job:
    cases = [CaseSpec(LABEL, specs, config.seed, entry["file"]) for _, specs
             in load_inputs(entry["file"], config.seed, config.dtype, config.device)]
    return Job(target, cases, config, reproduce=entry.get("reproduce") or None)


def live_jobs(entries: list[dict[str, Any]], owners: dict[int, Any], config: CheckConfig
              ) -> tuple[list[Job], list[Rejected]]:
    """In the recording process itself (a test): the live classes, however they were defined."""
    from torch._library.custom_ops import OPDEFS

    jobs, rejected = [], []
    for entry in entries:
        name = call_name(entry)
        owner = owners.get(entry["index"])
        obj = OPDEFS.get(owner) if named(entry["kind"]).op else owner
        try:
            if obj is None or entry["problem"] and "saved" in entry["problem"]:
                raise GradtoolError(entry["problem"] or f"{name}: cannot be replayed")
            target = make_target(obj, name)
            target.name = name  # an op target names itself by its registration file otherwise
            entry = {**entry, "reproduce": _reproduce(entry)}
            jobs.append(_job(target, entry, config))
        except GradtoolError as exc:
            rejected.append(Rejected(name, str(exc)))
    return jobs, rejected


def _reproduce(entry: dict[str, Any]) -> str:
    from .reproduce import shell_quote

    if not entry["target"]:
        return f"(not replayable by name: {entry['problem']})"
    return f"gradtool check {shell_quote(entry['target'])} --inputs-from {shell_quote(entry['file'])}"


def check_live(entries: list[dict[str, Any]], owners: dict[int, Any], config: CheckConfig
               ) -> Report:
    """Check each recorded call in this process (the pytest fixture's way)."""
    from .runner import run

    jobs, rejected = live_jobs(entries, owners, config)
    return run(jobs, config, rejected)
