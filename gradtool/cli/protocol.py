"""The messages between `gradtool check`'s supervisor and its workers: small frozen records.

A worker sends Ready (what it collected) once, then Steps as a job's checks finish and Done
per job index it is sent; Usage or
Internal ends it. The supervisor sends a job index, or None to stop. No torch: the supervisor
describes a job it cannot import from its JobOutline alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ..results import Rejected, TargetResult


@dataclass(frozen=True)
class CaseOutline:
    """One case of a job as the supervisor knows it: enough to report a death under it."""

    label: str
    seed: int
    reproduce: str
    inputs: tuple[tuple[str, str], ...] | None  # (name, description); None: inferred


@dataclass(frozen=True)
class JobOutline:
    """What the supervisor needs of a job it cannot import: names, cases, timeout, checks."""

    name: str
    kind: str
    qualname: str
    source: str | None
    spec: str | None
    cases: tuple[CaseOutline, ...]
    timeout: float
    checks: tuple[str, ...]  # those that can apply to its kind of target, in order
    mode: str = "auto"  # the Jacobian mode asked for: a long check's hints leave out that one
    forward_source: str | None = None  # a Function's forward, where a stop in forward points


@dataclass(frozen=True)
class Ready:
    """Collection is done: the jobs (run by index), the rejected arguments, the versions."""

    jobs: tuple[JobOutline, ...]
    rejected: tuple[Rejected, ...]
    versions: dict[str, str]


@dataclass(frozen=True)
class Done:
    """The result of the job at index."""

    index: int
    result: TargetResult | Rejected


@dataclass(frozen=True)
class Step:
    """A step of the job at index finished, sent as it does (heartbeat.report): 'plan' (a case
    set up: case, seed, inputs, the checks that apply) or 'check' (case, result)."""

    index: int
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """A usage error while collecting (exit 2), or nothing to check (exit 5)."""

    message: str
    nothing: bool = False


@dataclass(frozen=True)
class Internal:
    """A bug in gradtool inside the worker, with its traceback (exit 3)."""

    traceback: str


Message = Union[Ready, Done, Step, Usage, Internal]


def outline(job: Any) -> JobOutline:
    """A collected job, described for the supervisor."""
    from ..run.reproduce import reproduce_for

    t = job.target
    cases = tuple(CaseOutline(c.label, c.seed,
                              reproduce_for(job, c.inputs, c.seed, c.origin) + " --no-isolate",
                              _inputs(c.inputs, job)) for c in job.cases)
    from ..config.registry import BY_NAME

    checks = tuple(c for c in job.config.checks if c not in BY_NAME
                   or t.kind.applies(BY_NAME[c]) is None) or tuple(job.config.checks)
    return JobOutline(t.name, str(t.kind), t.qualname, t.source, job.spec, cases,
                      job.config.timeout, checks, job.config.mode, t.forward_source)


def _inputs(specs: list[Any] | None, job: Any) -> tuple[tuple[str, str], ...] | None:
    """(name, description) of given inputs; None when they are inferred (not known yet)."""
    if specs is None:
        return None
    from ..targets.inputs import Keyword

    names = list(job.target.arg_names or ())
    found = []
    for k, spec in enumerate(specs):
        name = spec.name if isinstance(spec, Keyword) else getattr(spec, "name", None)
        leaf = spec.spec if isinstance(spec, Keyword) else spec
        describe = getattr(leaf, "describe", None)  # a nested argument: its structure, shortened
        found.append((name or (names[k] if k < len(names) else f"arg{k}"),
                      describe(job.config.dtype) if describe else repr(leaf)[:80]))
    return tuple(found)
