"""A worker process of `gradtool check`: collects the jobs, then runs those it is sent by index."""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .. import heartbeat
from ..errors import GradtoolError, InternalError, NothingToCheck

BEAT_BYTES = 4096


def job_facts(job: Any) -> dict[str, Any]:
    """What the supervisor needs to describe a job it cannot import: names, cases, timeout."""
    from ..run.reproduce import reproduce_for

    t = job.target
    cases = [(c.label, c.seed, reproduce_for(job, c.inputs, c.seed, c.origin) + " --no-isolate",
              _inputs(c.inputs, job)) for c in job.cases]
    return {"name": t.name, "kind": t.kind, "qualname": t.qualname, "source": t.source,
            "spec": job.spec, "cases": cases,
            "timeout": job.config.timeout, "checks": list(job.config.checks)}


def _inputs(specs: list[Any] | None, job: Any) -> list[tuple[str, str]] | None:
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
    return found


def serve(conn: Any, beat: Any, collect: Callable[[], tuple[list[Any], list[Any]]],
          max_rss: int | None) -> None:
    """Collect (deterministically, as every worker does), report what was found, run by index."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    import_torch()
    quiet_expected_warnings()
    try:
        jobs, rejected = collect()
        from ..run.runner import check_devices, versions

        check_devices(jobs)
        conn.send(("ready", {"jobs": [job_facts(j) for j in jobs], "rejected": rejected,
                             "versions": versions()}))
    except GradtoolError as exc:
        conn.send(("usage", isinstance(exc, NothingToCheck), str(exc)))
        return
    except BaseException:
        conn.send(("internal", traceback.format_exc()))
        return
    heartbeat.install(lambda data: _publish(beat, data))
    if max_rss:
        limit_memory(max_rss)
    from ..run.runner import run_one

    while (index := conn.recv()) is not None:
        try:
            conn.send(("done", index, run_one(jobs[index])))
        except InternalError:  # a bug in gradtool: exit 3 with its traceback, as in-process
            conn.send(("internal", traceback.format_exc()))
            return


def import_torch() -> None:
    """Import torch with the cyclic collector paused, then freeze what the import made.

    torch's import leaves ~170k long-lived objects. Every full collection afterwards walks them
    all (~70 ms on the reference machine: more than a small check's whole work), and the import
    itself triggers two more (~50 ms). Frozen, they are never scanned again; they live until the
    process ends anyway. Objects made later (the user's modules, gradtool's) are collected as
    usual. Only in a process gradtool owns, and only when it is the one importing torch: a host
    that has torch already (click's test runner, a notebook) keeps its collector as it is."""
    if "torch" in sys.modules:
        return
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        import torch  # noqa: F401
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def quiet_expected_warnings() -> None:
    """In gradtool's own processes: torch's warnings about what gradtool does on purpose (value-
    only forwards under no_grad through reentrant checkpointing) are noise in a report."""
    import warnings

    warnings.filterwarnings("ignore", message="None of the inputs have requires_grad=True",
                            category=UserWarning)
    from ..targets.ops import silence_vmap_fallback  # batched evaluations of custom ops

    silence_vmap_fallback()


def _publish(beat: Any, data: bytes) -> None:
    beat[:BEAT_BYTES] = data[:BEAT_BYTES - 1].ljust(BEAT_BYTES, b"\0")


def limit_memory(max_rss: int) -> None:
    """Cap this process's data segment: an allocation past it fails (an `error`), not an OOM kill.

    RLIMIT_DATA (not RLIMIT_AS): since Linux 4.7 it counts private anonymous mappings, where
    torch's CPU allocator puts tensors, but not the libraries' reserved address space, which
    RLIMIT_AS counts and which alone exceeds any sensible limit once torch is loaded."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (max_rss, hard))
