"""Where a run is now (target, case, check, phase, call count), published for a supervisor."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

_sink: Callable[[bytes], None] | None = None
_told: Callable[[str, dict[str, Any]], None] | None = None  # a worker's pipe: what finished
# done/total: evaluations (forward and backward calls) the current check has made, and the
# number it is expected to make once its mode is known (0: not known yet)
_where: dict[str, Any] = {"target": "", "case": "", "check": "", "phase": "", "call": 0,
                          "done": 0, "total": 0, "case_done": 0, "case_total": 0, "after": 0}
# case_done/case_total: the same over the whole case (the probe phase's and every check's),
# the total its cost plan counted before the first check (run/plan.py; 0: not planned); after:
# the evaluations planned for the checks after the current one
_plan: dict[str, int] = {}  # the case's cost plan: check -> evaluations, in the run's order


def install(sink: Callable[[bytes], None] | None) -> None:
    """Publish every change to `sink` (a worker's shared memory); None stops publishing."""
    global _sink
    _sink = sink


def install_reports(told: Callable[[str, dict[str, Any]], None] | None) -> None:
    """Send each finished step (a case's plan, a check's result) to `told` as it happens: a
    run stopped later (Ctrl-C, a timeout, a lost worker) keeps what finished."""
    global _told
    _told = told


def reporting() -> bool:
    return _told is not None


def report(kind: str, **data: Any) -> None:
    """A step finished: 'plan' (a case set up: its inputs and the checks that apply) or
    'check' (one check's result)."""
    if _told is not None:
        _told(kind, data)


def enter(**fields: Any) -> None:
    """The run moved on: a new target, case or check (the phase and the counts start over)."""
    _where.update(fields, phase="", call=0, done=0, total=0)
    if "case" in fields:  # a new case: its count starts over, its plan not made yet
        _plan.clear()
        _where.update(case_done=0, case_total=0, after=0)
    elif fields.get("check") in _plan:
        names = list(_plan)
        _where["after"] = sum(_plan[n] for n in names[names.index(fields["check"]) + 1:])
    _publish()


def expect_case(plan: dict[str, int]) -> None:
    """The current case's cost plan (run/plan.py, made once the probe phase ended): each check's
    evaluations, in the order they run. The case's total then covers every check, and `after`
    the checks after the running one: the progress line's time left counts the checks still to
    come."""
    _plan.clear()
    _plan.update(plan)
    total = sum(max(0, int(n)) for n in plan.values())
    _where.update(case_total=int(_where["case_done"]) + total, after=total)
    _publish()


def expect(evaluations: int) -> None:
    """The current check will make about this many more evaluations (its mode is chosen: a
    full Jacobian's columns and rows, a probe's directions): the progress line's time left is
    the measured cost per evaluation times those left, and a stop says done/total."""
    _where["total"] = int(_where["done"]) + max(0, int(evaluations))
    _publish()


def _publish() -> None:
    if _sink is not None:
        _sink(json.dumps(_where).encode())


class Calls(Counter):
    """Problem.calls: counts forward/backward evaluations and publishes the latest one."""

    def __setitem__(self, key: str, value: int) -> None:
        grew = value - self.get(key, 0)
        super().__setitem__(key, value)
        if _sink is not None:
            done, case = _where["done"] + max(0, grew), _where["case_done"] + max(0, grew)
            _where.update(phase=key, call=value, done=done,
                          total=max(done, _where["total"]) if _where["total"] else 0,
                          case_done=case, case_total=max(case, _where["case_total"])
                          if _where["case_total"] else 0)
            _publish()


def describe(state: dict[str, Any]) -> str:
    """'forward of Bad, case 0 (gradient check, forward call 37)' from a published state."""
    what = f"{state.get('phase') or 'setup'} of {state.get('target') or 'a target'}"
    if state.get("case"):
        what += f", {state['case']}"
    detail = [f"{state['check']} check"] if state.get("check") else []
    if state.get("phase"):
        detail.append(f"{state['phase']} call {state['call']}{how_far(state)}")
    return what + (f" ({', '.join(detail)})" if detail else "")


def place(state: dict[str, Any]) -> str:
    """'gradient check (forward call 1787; 1790/3220 evaluations, 56%)', or 'setup of Bad,
    case 0' before any check began."""
    if not state.get("check"):
        return describe(state)
    text = f"{state['check']} check"
    return text + (f" ({state['phase']} call {state['call']}{how_far(state)})"
                   if state.get("phase") else "")


def how_far(state: dict[str, Any]) -> str:
    """'; 1790/3220 evaluations, 56%' once the check's total is known, else ''."""
    done, total = state.get("done", 0), state.get("total", 0)
    if not total:
        return ""
    return f"; {done}/{total} evaluations, {100 * done // max(1, total)}%"
