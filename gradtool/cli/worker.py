"""A worker process of `gradtool check`: collects the jobs, then runs those it is sent by index."""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .. import heartbeat
from ..errors import GradtoolError, InternalError, NothingToCheck
from .protocol import Done, Internal, Ready, Step, Usage, outline

BEAT_BYTES = 4096


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
        conn.send(Ready(tuple(outline(j) for j in jobs), tuple(rejected), versions()))
    except GradtoolError as exc:
        conn.send(Usage(str(exc), isinstance(exc, NothingToCheck)))
        return
    except BaseException:
        conn.send(Internal(traceback.format_exc()))
        return
    heartbeat.install(lambda data: _publish(beat, data))
    if max_rss:
        limit_memory(max_rss)
    from ..run.runner import run_one

    running = [0]  # the job index the steps belong to
    heartbeat.install_reports(lambda kind, data: conn.send(Step(running[0], kind, data)))
    while (index := conn.recv()) is not None:
        running[0] = index
        try:
            conn.send(Done(index, run_one(jobs[index])))
        except InternalError:  # a bug in gradtool: exit 3 with its traceback, as in-process
            conn.send(Internal(traceback.format_exc()))
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
    from ..numerics.batching import silence_vmap_fallback  # batched evaluations of custom ops

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
