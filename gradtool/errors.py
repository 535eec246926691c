"""User-facing errors: each carries the exit code it maps to and a message that names the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """Stable exit codes (documented in README): the one list every command returns from."""

    OK = 0
    CHECKS_FAILED = 1
    USAGE = 2
    INTERNAL = 3
    NOTHING = 5
    INTERRUPTED = 130


class GradtoolError(Exception):
    """A mistake in what the user asked for (not a gradient failure, not a gradtool bug)."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class TargetError(GradtoolError):
    """A target string that cannot be resolved to something checkable."""


class InputError(GradtoolError):
    """An --input value (or a spec's input) that cannot be parsed or sampled."""


class SpecError(GradtoolError):
    """An invalid YAML op spec; names file:line and the key path."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None,
                 key: str | None = None, hint: str | None = None) -> None:
        where = path or ""
        if path and line is not None:
            where = f"{path}:{line}"
        prefix = ": ".join(p for p in (where, key) if p)
        super().__init__(f"{prefix}: {message}" if prefix else message, hint)
        self.path, self.line, self.key = path, line, key
        self.reason = message  # without the where/key prefix, for a validator re-placing it


class ConfigError(GradtoolError):
    """A bad option value or [tool.gradtool] setting."""


class NothingToCheck(GradtoolError):
    """The targets resolved to nothing checkable."""

    exit_code = ExitCode.NOTHING


class InternalError(Exception):
    """An exception raised by gradtool's own code: a bug in gradtool, never the user's (exit 3)."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, exc: BaseException, where: str | None) -> None:
        at = f" at {where}" if where else ""
        super().__init__(f"this is a bug in gradtool: {type(exc).__name__} raised in gradtool's "
                         f"own code{at}: {exc}")
        # raised with the original's frames: its traceback ends where gradtool went wrong, not
        # at the line that wrapped it
        self.with_traceback(exc.__traceback__)


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """Return 'did you mean X?' for the closest candidate, or None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None
