"""`gradtool list`: what would be checked, with inputs, without running any check."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..config.settings import CheckConfig
from ..errors import GradtoolError
from ..results import Rejected
from ..run.runner import Job, case_for


def list_lines(jobs: Sequence[Job], rejected: Sequence[Rejected], config: CheckConfig
               ) -> Iterator[str]:
    """One line per target and case; inputs are inferred (forward runs) where not given."""
    for job in jobs:
        origin = f"  (spec {job.spec})" if job.spec else ""
        yield f"{job.target.name}  [{job.target.kind}]{origin}"
        for spec in job.cases:
            yield "  " + _case_line(job, spec)
    for bad in rejected:
        yield f"REJECTED {bad.source}: {bad.message.splitlines()[0]}"


def _case_line(job: Job, spec) -> str:
    try:
        case = case_for(job, spec)
    except GradtoolError as exc:
        return f"{spec.label}: cannot build inputs: {exc}"
    except Exception as exc:  # the user's forward raised while inferring
        return f"{spec.label}: {type(exc).__name__}: {exc}"
    how = "inferred" if case.inferred else "given"
    inputs = ", ".join(f"{i.name} {i.description}" for i in case.infos)
    return f"{spec.label} ({how}, seed {spec.seed}): {inputs}"
