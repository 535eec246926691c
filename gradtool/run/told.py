"""What a case tells beside its checks' results: its plan, sent to a supervisor as soon as
it is set up (a stop later keeps what finished and lists only the checks that apply), and the
notes its result keeps, and an error repeated by later checks told once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .. import heartbeat
from ..results import CheckResult, Outcome


def report_plan(job: Any, case: Any, spec: Any, checks: Sequence[str] | None) -> None:
    """To a supervisor: the case's inputs and the checks that apply to it (None: applies()
    ran user code that failed — the checks report it; every configured one is assumed)."""
    if not heartbeat.reporting():
        return
    heartbeat.report("plan", case=spec.label, seed=spec.seed, inputs=tuple(case.infos),
                     checks=tuple(job.config.checks if checks is None else checks))


def kept_notes(case: Any, checks: Sequence[CheckResult]) -> list[str]:
    """The case's notes; on a case that passed, none about shapes inference passed over (they
    explain a choice only when a check fails on the shape chosen)."""
    from ..targets.infer import PASSED_OVER

    passed = all(c.outcome in (Outcome.PASSED, Outcome.SKIPPED) for c in checks)
    return [n for n in case.notes if not (passed and n.startswith(PASSED_OVER))]


def error_id(result: CheckResult) -> tuple[str | None, str | None]:
    """An error's identity: its exception type and trimmed traceback (never its words)."""
    return result.exception, result.traceback


def repeats_told(checks: list[CheckResult], errors: list[tuple[str | None, str | None]]
                  ) -> list[CheckResult]:
    """The first check to report an error later checks repeated says under how many."""
    out = list(checks)
    for k, first in enumerate(checks):
        if first.outcome is not Outcome.ERROR or first.traceback is None:
            continue
        again = [c.name for c, e in zip(checks[k + 1:], errors[k + 1:])
                 if c.outcome is Outcome.ERROR and c.traceback is None and e == errors[k]]
        if again:
            out[k] = replace(first, details=(*first.details, f"the same error under "
                                             f"{len(again) + 1} checks: {first.name}, "
                                             f"{', '.join(again)}"))
    return out
