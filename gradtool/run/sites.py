"""Where user code applied a custom Function or called a custom op: the file:line a report
names, with the line of the user's own code when that is inside an installed package."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from types import FrameType
from typing import Callable

from ..targets.load import display_path
from .applyhook import HOOK_FILE

_PACKAGE = str(Path(__file__).resolve().parents[1]).replace("\\", "/")  # gradtool/
# the standard library's folders (runpy, multiprocessing, threading): never the user's line
_STDLIB = tuple({sysconfig.get_paths()[key].replace("\\", "/") + "/"
                 for key in ("stdlib", "platstdlib")})


def user_site(frame: FrameType | None) -> str | None:
    """file:line of the innermost caller that is neither torch's nor gradtool's (code without
    a file, exec or a REPL, only when nothing else is found); inside an installed package (a
    library's adjoint solver applying its Function), with the line of the user's code that
    called into it."""
    first = _innermost(frame, _ours)
    real = _innermost(first, lambda path: _ours(path) or _fileless(path))
    if real is None:
        return _site(first) if first is not None else None
    if not _installed(_path(real)):
        return _site(real)
    # up to the first frame of gradtool's own (itself perhaps installed): when gradtool called
    # the package (a library's module checked as the target) there is no user line, and the
    # frames above gradtool's are its worker's (multiprocessing, the console script)
    caller = _innermost(real.f_back, lambda path: not _gradtool(path) and (
        "/torch/" in path or _fileless(path) or _installed(path) or _stdlib(path)))
    if caller is None or _gradtool(_path(caller)):
        return _site(real)
    return f"{_site(real)} (called from {_site(caller)})"


def installed(path: str) -> bool:
    """Whether a file belongs to an installed package, torch included (not the user's)."""
    return _installed(path.replace("\\", "/")) or "/torch/" in path.replace("\\", "/")


def _innermost(frame: FrameType | None, skip: Callable[[str], bool]) -> FrameType | None:
    while frame is not None and skip(_path(frame)):
        frame = frame.f_back
    return frame


def _path(frame: FrameType) -> str:
    return frame.f_code.co_filename.replace("\\", "/")


def _site(frame: FrameType) -> str:
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def _ours(path: str) -> bool:
    # the hook's forward has no file: without this, code run from stdin or exec (fileless
    # too) would be named after gradtool's hook
    return path.startswith(_PACKAGE) or "/torch/" in path or path.startswith(HOOK_FILE)


def _gradtool(path: str) -> bool:
    return path.startswith(_PACKAGE) or path.startswith(HOOK_FILE)


def _stdlib(path: str) -> bool:
    return any(path.startswith(root) for root in _STDLIB)


def _fileless(path: str) -> bool:
    return path.startswith("<")


def _installed(path: str) -> bool:
    return "/site-packages/" in path or "/dist-packages/" in path
