"""Where a supervised run is, read from the workers' heartbeats: a live display on a terminal,
plain `progress` lines in a log, and a check's estimate with how to cut it when it is long."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import heartbeat

# (forward, backward) calls a default check makes on a case too slow for full mode (auto mode
# probes it), measured with `--format json` (each check's `calls`); a rough lower bound.
CHECK_CALLS = {"contract": (1, 6), "gradient": (4, 6), "double_backward": (4, 6),
               "layout": (3, 7)}
OTHER_CALLS = (4, 6)
LONG_S = 10.0    # a check predicted longer is announced, with the cheapest ways to cut it
EVERY_S = 15.0   # a plain progress line this often once the run is past LONG_S (CI logs)
SHOW_AFTER_S = 1.0  # the terminal display appears only once a run has taken this long


def estimate_s(check: str, per_call: dict[str, float]) -> float:
    """A check's predicted seconds from the time a forward and a backward call took (one not
    timed yet counts nothing: an estimate only grows as calls are timed, so a long one is
    announced once it is known, never a short one from a guess)."""
    forwards, backwards = CHECK_CALLS.get(check, OTHER_CALLS)
    return forwards * per_call.get("forward", 0.0) + backwards * per_call.get("backward", 0.0)


def how_to_cut(check: str, checks: tuple[str, ...], mode: str = "auto") -> str:
    """The cheapest ways to cut a long check, cheapest first (never the mode it runs in)."""
    ways = [*(["--mode probe"] if mode != "probe" else []), "a smaller -i (fewer elements)"]
    if len(checks) > 1:
        ways.insert(0, f"--check naming only the checks you need (leaving {check} out)")
    return ", or ".join(ways)


@dataclass
class Running:
    """What one worker's job has shown so far."""

    index: int
    started: float
    checks: list[str] = field(default_factory=list)  # the checks begun, in order
    check_started: float = 0.0   # when the current count began (the probe's, then the check's)
    check_began: float = 0.0     # when the current check began: what its whole time counts from
    call: tuple[str, int] = ("", 0)
    changed: float = 0.0
    intervals: dict[str, list[float]] = field(default_factory=dict)  # seconds a call took
    announced: bool = False
    done: int = 0    # the current check's evaluations so far
    total: int = 0   # ... and those its mode needs (0: not known yet)
    spent: tuple[float, int] = (0.0, 0)  # seconds and evaluations of the checks it finished
    # the evaluations the case's cost plan counts for the checks after the current one
    # (run/plan.py); None: the case was not planned (a check it could not count)
    after: int | None = None

    def check_left(self, now: float) -> float | None:
        """The current check's seconds left: its measured seconds per evaluation (all it took
        so far over the evaluations it made) times the evaluations left; None until known."""
        if not self.total or not self.done:
            return None
        return max(0, self.total - self.done) * (now - self.check_started) / self.done

    def per_evaluation(self, now: float) -> float | None:
        """Seconds an evaluation takes, measured over this job's checks so far (the finished
        ones and the current one: all they took over the evaluations they made); None before
        any evaluation."""
        seconds, evaluations = self.spent
        evaluations += self.done
        if not evaluations:
            return None
        return (seconds + now - self.check_started) / evaluations

    def per_call(self) -> dict[str, float] | None:
        """Seconds a call takes, by phase (forward, backward); None before any was timed."""
        return {phase: statistics.median(times[-20:])
                for phase, times in self.intervals.items()} or None


class Watch:
    """Fed every supervisor tick; tells the run's progress on `write` (plain lines) or a live
    rich display (live=True)."""

    def __init__(self, write: Callable[[str], None], live: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write, self.live, self.clock = write, live, clock
        self.start = clock()
        self.last_line: float | None = None
        self.first_job: float | None = None   # when the first job was handed out
        self.running: dict[int, Running] = {}  # by job index
        self.planned: dict[int, dict[str, int]] = {}  # job index -> case -> checks that apply
        self.finished_s: list[float] = []      # durations of finished jobs
        self.display: Any = None

    def tick(self, supervisor: Any) -> None:
        if supervisor.collected is None:
            return
        now = self.clock()
        busy = {w.index: w for w in supervisor.workers if w.index is not None}
        for index in [i for i in self.running if i not in busy]:
            self.finished_s.append(now - self.running.pop(index).started)
        for index, worker in busy.items():
            seen = self.running.setdefault(index, Running(index, now, changed=now))
            self._follow(seen, worker.state(), now, supervisor._job(index))
        self._tell(supervisor, now)

    def _follow(self, seen: Running, state: dict[str, Any], now: float, job: Any) -> None:
        check, call = state.get("check") or "", (state.get("phase") or "", state.get("call", 0))
        done = state.get("done", 0)
        began = bool(check) and (not seen.checks or seen.checks[-1] != check)
        # a count that starts over under the same name: the probe phase (told under the first
        # check) ended and the check itself began
        if began or done < seen.done:
            if seen.checks:  # what came before finished: its cost per evaluation is known
                seen.spent = (seen.spent[0] + now - seen.check_started, seen.spent[1] + seen.done)
            seen.check_started = now
        if began:
            seen.checks.append(check)
            seen.check_began, seen.announced = now, False
        seen.done, seen.total = done, state.get("total", 0)
        seen.after = state.get("after", 0) if state.get("case_total") else None
        if call != seen.call:
            # a call is published as it starts: the time since the last one began is what
            # that one took (calls between two ticks share the time evenly)
            if seen.call[0] and (call[0] != seen.call[0] or call[1] > seen.call[1]):
                count = call[1] - seen.call[1] if call[0] == seen.call[0] else 1
                seen.intervals.setdefault(seen.call[0], []).append(
                    (now - seen.changed) / count)
            seen.call, seen.changed = call, now
        per_call = seen.per_call()
        if check and not seen.announced and per_call is not None:
            predicted = estimate_s(check, per_call)
            measured = seen.check_left(now)
            if measured is not None:  # the mode's evaluations at their measured cost; early
                # on, cheap backwards can make that average hide slow forwards still to come
                predicted = max(predicted, measured + now - seen.check_began)
            if predicted > LONG_S:
                seen.announced = True
                calls = ", ".join(f"{t:.2g} s a {phase} call" for phase, t in per_call.items())
                self._say(f"gradtool: {job.name}: the {check} check is estimated at "
                          f"~{predicted:.0f} s ({calls}); to cut it: "
                          f"{how_to_cut(check, job.checks, job.mode)}")

    def done_total(self, supervisor: Any) -> tuple[int, int]:
        """(checks finished, checks in the run), over every case of every job: a case's checks
        are those its plan says apply once it is set up (a real target skips complex, a
        Function without jvp forward_ad), before that every check its kind can run."""
        for worker in supervisor.workers:
            if worker.index is not None:
                self.planned.setdefault(worker.index, {}).update(
                    (s.data["case"], len(s.data["checks"])) for s in worker.steps
                    if s.kind == "plan")
        jobs = supervisor.collected.jobs
        size = [sum(self.planned.get(i, {}).get(case.label, len(job.checks))
                    for case in job.cases) for i, job in enumerate(jobs)]
        done = sum(size[i] for i in supervisor.results)
        done += sum(sum(s.kind == "check" for s in w.steps) for w in supervisor.workers
                    if w.index is not None and w.index not in supervisor.results)
        return done, sum(size)

    def left_s(self, supervisor: Any, now: float) -> float | None:
        """Seconds left: the running checks' estimates (workers run side by side: the longest
        counts), then the jobs not begun, shared among the workers."""
        lefts, per_check = [0.0], []
        for seen in self.running.values():
            per_call = seen.per_call()
            measured = seen.check_left(now)
            if per_call is None and measured is None:
                return None
            per_call = per_call or {}
            job = supervisor._job(seen.index)
            current = seen.checks[-1] if seen.checks else ""
            left = measured if measured is not None else \
                max(0.0, estimate_s(current, per_call) - (now - seen.check_began))
            # a check not begun counts only if it runs on most targets (CHECK_CALLS): the
            # others (forward_ad without a jvp, complex) are mostly skipped at once
            rest = [c for c in job.checks if c not in seen.checks and c in CHECK_CALLS]
            cost = _not_begun(per_call, seen.per_evaluation(now))
            lefts.append(left + _planned(seen, now, per_call) if seen.after is not None
                         else left + sum(map(cost, rest)))
            per_check.append(sum(cost(c) for c in job.checks if c in CHECK_CALLS))
        left, pending = max(lefts), len(supervisor.pending)
        if pending:
            known = self.finished_s or per_check
            if not known:
                return None
            left += pending * statistics.mean(known) / max(1, len(supervisor.workers))
        return left

    def line(self, supervisor: Any, now: float) -> str:
        done, total = self.done_total(supervisor)
        left = self.left_s(supervisor, now)
        where = "; ".join(f"{supervisor._job(i).name}: {heartbeat.place(w.state())}"
                          for i, w in sorted((w.index, w) for w in supervisor.workers
                                             if w.index is not None))
        remaining = f"~{_duration(left)} left" if left is not None else "time left unknown"
        return (f"progress {done}/{total} checks, {_duration(now - self.start)} elapsed, "
                f"{remaining}" + (f" — {where}" if where else ""))

    def _tell(self, supervisor: Any, now: float) -> None:
        if self.live:
            # its second starts with the first job: a quick run shows no display
            if self.first_job is None and self.running:
                self.first_job = now
            if self.first_job is not None and now - self.first_job >= SHOW_AFTER_S:
                self._show(supervisor, now)
        elif now - self.start >= LONG_S and (self.last_line is None
                                             or now - self.last_line >= EVERY_S):
            self.last_line = now
            self.write("gradtool: " + self.line(supervisor, now))

    def _show(self, supervisor: Any, now: float) -> None:
        """The rich display: target, check, phase, done/total, time left."""
        done, total = self.done_total(supervisor)
        left = self.left_s(supervisor, now)
        where = next((f"{supervisor._job(w.index).name} · {heartbeat.place(w.state())}"
                      for w in supervisor.workers if w.index is not None), "")
        if self.display is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            from .output import console

            self.display = Progress(TextColumn("{task.description}"), BarColumn(),
                                    MofNCompleteColumn(), TextColumn("{task.fields[left]}"),
                                    transient=True, console=console(sys.stderr, "auto"))
            self.display.start()
            self.task = self.display.add_task("", total=total, left="")
        self.display.update(self.task, completed=done, total=total, description=where[-70:],
                            left=f"~{_duration(left)} left" if left is not None else "")

    def _say(self, text: str) -> None:
        if self.display is not None:
            self.display.console.print(text, markup=False, highlight=False)
        else:
            self.write(text)

    def stop(self) -> None:
        if self.display is not None:
            self.display.stop()


def _not_begun(per_call: dict[str, float], per_evaluation: float | None
               ) -> Callable[[str], float]:
    """A check not begun, in seconds: its evaluations (CHECK_CALLS) at the measured cost per
    evaluation where one was measured (what the job's checks took over the evaluations they
    made, overheads included), else at the calls' timed costs."""
    if per_evaluation is None:
        return lambda check: estimate_s(check, per_call)
    return lambda check: sum(CHECK_CALLS.get(check, OTHER_CALLS)) * per_evaluation


def _planned(seen: Running, now: float, per_call: dict[str, float]) -> float:
    """The checks after the running one, in seconds: the evaluations the case's cost plan
    counted for them at the measured cost per evaluation (else a forward call's)."""
    per = seen.per_evaluation(now)
    if per is None:
        per = max(per_call.values(), default=0.0)
    return (seen.after or 0) * per


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def cost_text(per_call: dict[str, float], checks: list[str],
              full: dict[str, int] | None = None) -> str:
    """`gradtool list`'s estimate: the run's seconds and each long check's, from one call's time;
    `full`: the forwards a check makes in --mode full (a Jacobian's columns), where it is on."""
    each = {c: estimate_s(c, per_call) for c in checks}
    for check, forwards in (full or {}).items():
        if check in each:  # an upper bound: batched or coloured columns cost less
            each[check] = max(each[check], forwards * per_call.get("forward", 0.0))
    total = sum(each.values()) + 2 * per_call.get("forward", 0.0)  # the probe phase's forwards
    if total < 1:
        return "estimated cost: under 1 s"
    long = [f"{c} ~{_duration(t)}" for c, t in each.items() if t >= 1]
    timed = ", ".join(f"{t:.2g} s a {phase}" for phase, t in per_call.items())
    text = f"estimated cost: ~{_duration(total)} ({timed}; {', '.join(long)})"
    if full and total > LONG_S:
        text += ("; --mode full evaluates forward twice per input element (at most: batched "
                 "columns cost less): --mode auto or probe, or a smaller -i, cut it")
    return text
