"""What `gradtool trace`'s recording worker tells its supervisor (and the pytest fixture reads):
small frozen records, no torch, so the supervisor's side imports none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class Recorded:
    """A distinct call, recorded as it happened: its facts (index, kind, label, site, the .pt
    file of its inputs, their descriptions, the target that replays it or why none can)."""

    entry: dict[str, Any]


@dataclass(frozen=True)
class Layouts:
    """The layouts of the grad_outputs the call's backward received, the first time it ran."""

    index: int
    grads: tuple[str, ...]


@dataclass(frozen=True)
class Ended:
    """The script ended: ("ok" | "raised" | "exit", detail), and the recorder's counts."""

    status: tuple[str, str]
    summary: dict[str, Any]


@dataclass(frozen=True)
class Checked:
    """A call whose arguments cannot be saved (a Python callable, an options object), checked
    in the recording process itself on its arguments held as they were: its TargetResult or
    Rejected (results.py records: no torch)."""

    index: int
    result: Any


@dataclass(frozen=True)
class Refused:
    """A usage error before the script ran (exit 2): what is wrong and the fix."""

    message: str
    fix: str


@dataclass(frozen=True)
class Crashed:
    """A bug in gradtool inside the recording worker, with its traceback (exit 3)."""

    traceback: str


TraceMessage = Union[Recorded, Layouts, Checked, Ended, Refused, Crashed]


def recorded(messages: list[Any]) -> list[dict[str, Any]]:
    """The entries of the Recorded messages among these, in order."""
    return [m.entry for m in messages if isinstance(m, Recorded)]
