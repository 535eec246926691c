"""Tracebacks: trim one to the user's frames, and tell by its frames whether gradtool raised."""

from __future__ import annotations

import contextlib
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from types import CodeType
from typing import TypeVar

_PACKAGE = str(Path(__file__).resolve().parent)
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_BOUNDARIES: set[CodeType] = set()
_INTERPRETERS: set[CodeType] = set()
F = TypeVar("F", bound=Callable[..., object])
# Set by the gradcheck drop-in: an exception from the user's code propagates unchanged, as from
# torch's gradcheck, instead of becoming an `error` result.
_PROPAGATE: ContextVar[bool] = ContextVar("gradtool_propagate_user_errors", default=False)


@contextlib.contextmanager
def user_errors_propagate() -> Iterator[None]:
    """Within: the checks re-raise the user's exceptions (checks/_common.py:error_result)."""
    token = _PROPAGATE.set(True)
    try:
        yield
    finally:
        _PROPAGATE.reset(token)


def propagating() -> bool:
    """Whether the user's exceptions propagate (inside user_errors_propagate)."""
    return _PROPAGATE.get()


def calls_user_code(fn: F) -> F:
    """Mark a gradtool function whose job is to call the user's code (a forward, or autograd's
    engine running a backward): an exception coming out of what it calls is the user's."""
    _BOUNDARIES.add(fn.__code__)  # type: ignore[attr-defined]
    return fn


def interprets_user_code(fn: F) -> F:
    """Mark a gradtool function that evaluates what the user wrote (a spec's expr, surrogate or
    oracle): whatever it raises, at any depth, is about the user's text."""
    _INTERPRETERS.add(fn.__code__)  # type: ignore[attr-defined]
    return fn


def raised_in_gradtool(exc: BaseException) -> bool:
    """Whether gradtool's own code raised exc (a bug in gradtool), judged by the frames.

    The innermost frame that is neither torch's, numpy's nor the standard library's decides:
    the user's code, or a gradtool function marked calls_user_code (the error came from what
    it called: a torch op in a C++ backward, a builtin used as forward) -> the user's; any
    other gradtool function -> gradtool's. Below an interprets_user_code frame, the user's.
    """
    codes = []
    tb = exc.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if any(code in _INTERPRETERS for code in codes):
        return False
    for code in reversed(codes):
        path = str(code.co_filename).replace("\\", "/")
        if _neutral(path):
            continue
        return path.startswith(_PACKAGE.replace("\\", "/")) and code not in _BOUNDARIES
    return False


def _neutral(path: str) -> bool:
    """Library frames between gradtool and the user: they decide nothing about blame."""
    return ("/torch/" in path or "/numpy/" in path or path.startswith("<frozen")
            or path.startswith(_STDLIB.replace("\\", "/") + "/") and "site-packages" not in path)


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


def gradtool_frame(exc: BaseException) -> str | None:
    """'file:line' of the innermost gradtool frame, for an internal error's message."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.replace("\\", "/").startswith(_PACKAGE.replace("\\", "/"))]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _is_user(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return not (path.startswith(_PACKAGE.replace("\\", "/")) or "/torch/" in path
                or path.startswith("<"))
