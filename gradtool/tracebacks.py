"""Trim a user-code exception's traceback to the frames that belong to the user."""

from __future__ import annotations

import traceback
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent)


def trim(exc: BaseException, limit: int = 6) -> str:
    """The exception line plus the innermost user frames (not gradtool's, not torch's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user(f.filename)]
    lines = [f"  {f.filename}:{f.lineno} in {f.name}\n    {(f.line or '').strip()}"
             for f in frames[-limit:]]
    head = f"{type(exc).__name__}: {exc}".strip()
    return "\n".join([*lines, head]) if lines else head


def innermost_user_frame(exc: BaseException) -> str | None:
    """'file:line' of the deepest user frame, for source pointers."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _is_user(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return not (path.startswith(_PACKAGE.replace("\\", "/")) or "/torch/" in path
                or path.startswith("<"))
