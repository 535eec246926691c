"""The supervisor of `gradtool check`: workers run the targets; a crash, hang or Ctrl-C loses none.

It imports no torch (workers do): collection imports the user's modules, so it happens in them."""

from __future__ import annotations

import json
import multiprocessing
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from .. import heartbeat
from ..config.settings import CheckConfig
from ..errors import GradtoolError, NothingToCheck
from ..results import CaseResult, CheckResult, InputInfo, Outcome, Rejected, Report, TargetResult
from .protocol import Done, JobOutline, Message, Ready, Step, Usage
from .worker import BEAT_BYTES, serve

TICK_S = 0.1  # how often deadlines and signals are looked at while workers are busy


@dataclass
class Worker:
    process: Any
    conn: Any
    beat: Any  # shared memory (a RawArray of bytes) the worker writes its heartbeat to
    index: int | None = None   # the job it runs now
    started: float = 0.0
    ready: bool = False        # collection done
    begun: list[str] = field(default_factory=list)  # the checks its job has begun, in order
    steps: list[Step] = field(default_factory=list)  # its job's cases set up, checks finished

    def state(self) -> dict[str, Any]:
        """What it was doing last (target, case, check, phase, call), as it published."""
        try:
            return json.loads(self.beat.value or b"{}")
        except ValueError:  # caught mid-write
            return {}


class Supervisor:
    """Hands job indices to workers, replaces the ones that die or overrun, stops on a signal."""

    def __init__(self, collect: Callable[[], Any], config: CheckConfig, workers: int,
                 max_rss: int | None, warm: Callable[[], None] | None = None, watch: Any = None) -> None:
        self.collect, self.config, self.size = collect, config, max(1, workers)
        self.watch = watch  # progress.Watch: told every tick where the workers are
        self.warm = warm  # the supervisor's own imports, made while the workers import torch
        self.max_rss = max_rss
        # Fork is cheap and safe while this process holds no torch; once it does (the CLI called
        # in-process, as by click's test runner), a forked child can deadlock on its threads' locks.
        self.context = multiprocessing.get_context("spawn" if "torch" in sys.modules else "fork")
        self.workers: list[Worker] = []
        self.collected: Ready | None = None  # the first worker's collection
        self.pending: deque[int] = deque()
        self.results: dict[int, TargetResult | Rejected] = {}
        self.stopped_by: str | None = None
        self.bugs: list[str] = []  # tracebacks of gradtool's own errors in a job (exit 3)

    def run(self, arguments: list[str]) -> Report:
        start = time.perf_counter()
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for _ in range(self.size):
                self._spawn()
            if self.warm is not None:
                self.warm()
            while not self.stopped_by and not self._finished():
                self._step()
            if self.stopped_by:
                self._stopped()
        finally:
            self._shut_down()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._report(arguments, time.perf_counter() - start)

    @property
    def total(self) -> int:
        """How many jobs there are (0 until a worker has collected them)."""
        return len(self.collected.jobs) if self.collected else 0

    def _stop(self, signum: int, _frame: Any) -> None:
        self.stopped_by = signal.Signals(signum).name

    def _finished(self) -> bool:
        return self.collected is not None and not self.pending and \
            all(w.index is None for w in self.workers)

    def _spawn(self) -> None:
        ours, theirs = self.context.Pipe()
        beat = self.context.RawArray("c", BEAT_BYTES)
        process = self.context.Process(target=serve, args=(theirs, beat, self.collect,
                                                           self.max_rss), daemon=True)
        process.start()
        theirs.close()
        self.workers.append(Worker(process, ours, beat))

    def _step(self) -> None:
        self._assign()
        wait([w.conn for w in self.workers] + [w.process.sentinel for w in self.workers],
             timeout=TICK_S)
        for worker in list(self.workers):
            self._read(worker)
            if worker.process.exitcode is not None and worker in self.workers:
                self._died(worker)
        self._follow()
        self._enforce_timeouts()
        if self.watch is not None:
            self.watch.tick(self)

    def _assign(self) -> None:
        for worker in self.workers:
            if worker.ready and worker.index is None and self.pending:
                worker.index, worker.started = self.pending.popleft(), time.monotonic()
                worker.begun, worker.steps = [], []
                worker.conn.send(worker.index)

    def _read(self, worker: Worker) -> None:
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv())
        except (EOFError, OSError):
            pass  # it died; the sentinel says so

    def _handle(self, worker: Worker, message: Message) -> None:
        if isinstance(message, Ready):
            if self.collected is None:
                self.collected = message
                self.pending.extend(range(len(message.jobs)))
            worker.ready = True
        elif isinstance(message, Step):
            if message.index == worker.index:
                worker.steps.append(message)
        elif isinstance(message, Done):
            self.results[message.index] = message.result
            worker.index = None
        elif isinstance(message, Usage):
            raise (NothingToCheck if message.nothing else GradtoolError)(message.message)
        elif worker.index is not None:  # a bug in gradtool on one target: the others still run
            self.bugs.append(message.traceback)
            last = message.traceback.strip().splitlines()[-1]
            self.results[worker.index] = self._error(
                worker, f"a bug in gradtool ({last[:200]}) in", heartbeat.place)
            worker.index, worker.ready = None, False  # it ends: a fresh one takes the rest
        else:
            raise RuntimeError(f"a gradtool worker hit a bug in gradtool:\n{message.traceback}")

    def _died(self, worker: Worker) -> None:
        code = worker.process.exitcode
        self._retire(worker)
        if worker.index is not None:
            cause = f"process died: {exit_cause(code)} while running"
            self.results[worker.index] = self._error(worker, cause, heartbeat.describe)
        elif self.collected is None and not self.workers:
            raise GradtoolError(f"process died: {exit_cause(code)} while importing the targets",
                                "run with --no-isolate to see where")
        if self.pending or self.collected is None:
            self._spawn()

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        for worker in list(self.workers):
            limit = self._job(worker.index).timeout if worker.index is not None else 0
            if limit and now - worker.started > limit:
                worker.process.kill()
                worker.process.join()
                self._retire(worker)
                self.results[worker.index] = self._error(
                    worker, f"timed out after {limit:g} s in", heartbeat.place)
                if self.pending:
                    self._spawn()

    def _follow(self) -> None:
        """Note each check a busy worker begins (a stopped one says which it had run)."""
        for worker in self.workers:
            check = worker.state().get("check") if worker.index is not None else None
            if check and (not worker.begun or worker.begun[-1] != check):
                worker.begun.append(check)

    def _stopped(self) -> None:
        """Ctrl-C or SIGTERM: each target still running is an `error` saying how far it got
        (check, phase, call); the targets not begun are `not run`."""
        for worker in self.workers:
            if worker.index is not None and worker.index not in self.results:
                self.results[worker.index] = self._error(
                    worker, f"stopped by {self.stopped_by} in", heartbeat.place)

    def _retire(self, worker: Worker) -> None:
        self.workers.remove(worker)
        worker.conn.close()

    def _job(self, index: int) -> JobOutline:
        assert self.collected is not None
        return self.collected.jobs[index]

    def _error(self, worker: Worker, cause: str, where: Callable[[dict[str, Any]], str]
               ) -> TargetResult:
        """The target a worker was running when it died, overran or was stopped: the checks
        it had finished (sent as each did), then an `error` naming why and where, then the
        checks that apply and were not begun."""
        job, state = self._job(worker.index), worker.state()
        if state.get("target") != job.name:
            state = {"target": job.name}
        plans = {s.data["case"]: s.data for s in worker.steps if s.kind == "plan"}
        finished = [s.data for s in worker.steps if s.kind == "check"]
        label = state.get("case") or (list(plans)[-1] if plans else job.cases[0].label)
        outlined = {c.label: c for c in job.cases}
        cases = []
        for done_label in [*plans, *([label] if label not in plans else [])]:
            checks = tuple(f["result"] for f in finished if f["case"] == done_label)
            if done_label == label:
                checks += (self._stop_check(worker, job, state, cause, where,
                                            plans.get(label), checks),)
            cases.append(self._case(job, outlined, done_label, plans.get(done_label), checks))
        return TargetResult(job.name, job.kind, job.qualname, job.source, tuple(cases), job.spec)

    def _stop_check(self, worker: Worker, job: JobOutline, state: dict[str, Any], cause: str,
                    where: Callable[[dict[str, Any]], str], plan: dict[str, Any] | None,
                    done: tuple[CheckResult, ...]) -> CheckResult:
        applies = list(plan["checks"]) if plan else list(job.checks)
        name = state.get("check") or (applies or list(job.checks))[0]
        finished = {c.name for c in done}
        rest = [c for c in applies if c != name and c not in finished]
        return CheckResult(
            name, Outcome.ERROR, f"{cause} {where(state)}",
            (self._what_happened(),
             *([f"checks finished before it: {', '.join(sorted(finished, key=applies.index))}"
                " (their results are above)"] if finished and set(finished) <= set(applies)
               else [f"checks finished before it: {', '.join(finished)}"] if finished else []),
             *([f"checks not begun: {', '.join(rest)}"] if rest else [])),
            source=(job.forward_source if state.get("phase") == "forward" and job.forward_source
                    else job.source), duration_s=time.monotonic() - worker.started)

    def _what_happened(self) -> str:
        rerun = "rerun this target with --no-isolate to debug it in-process"
        if self.bugs and not self.stopped_by:
            return ("gradtool's own code failed on this target (its traceback is on stderr: "
                    "please report it); the other targets were checked")
        if self.stopped_by:
            return (f"the run was stopped ({self.stopped_by}): the checks that had finished "
                    f"are kept, the rest did not run ({rerun})")
        fresh = "; a fresh worker runs the targets after it" if self.pending else ""
        return f"the worker process running this target was stopped{fresh} ({rerun})"

    @staticmethod
    def _case(job: JobOutline, outlined: dict[str, Any], label: str, plan: dict[str, Any] | None,
              checks: tuple[CheckResult, ...]) -> CaseResult:
        outline = outlined.get(label) or next(
            (c for c in job.cases if label.startswith(c.label)), job.cases[0])
        if plan is not None:
            inputs = tuple(plan["inputs"])
        else:
            inputs = tuple(InputInfo(n, text, True) for n, text in outline.inputs or ())
        return CaseResult(label, plan["seed"] if plan else outline.seed, inputs, checks,
                          outline.inputs is None, reproduce=outline.reproduce)

    def _shut_down(self) -> None:
        for worker in self.workers:
            if worker.index is None and worker.ready and not self.stopped_by:
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
            else:
                worker.process.kill()
        for worker in self.workers:
            worker.process.join(1)
            if worker.process.exitcode is None:
                worker.process.kill()

    def _report(self, arguments: list[str], duration: float) -> Report:
        collected = self.collected or Ready((), (), {})
        ordered = [self.results[i] for i in sorted(self.results)]
        not_run = tuple(job.name for i, job in enumerate(collected.jobs)
                        if i not in self.results)
        if self.collected is None and self.stopped_by:
            not_run = tuple(arguments)  # stopped while importing: the arguments are all we know
        rejected = (*collected.rejected, *(r for r in ordered if isinstance(r, Rejected)))
        return Report(tuple(r for r in ordered if isinstance(r, TargetResult)),
                      self.config.effective, collected.versions, rejected, duration,
                      not_run=not_run, interrupted=self.stopped_by)


def exit_cause(code: int | None) -> str:
    """'SIGSEGV (segmentation fault)' or 'exit code 3' from a process's exit code."""
    if code is not None and code < 0:
        sig = signal.Signals(-code)
        text = f"{sig.name} ({(signal.strsignal(sig) or '').lower()})"
        return text + (" — out of memory?" if sig == signal.SIGKILL else "")
    return f"exit code {code}"
