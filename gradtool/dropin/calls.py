"""Whose error it is, in the drop-in: its call sites of the checked code, and gradtool's own.

An exception coming out of the function checked (or out of autograd's engine running its
backward, or torch's public gradcheck running it) is the user's and propagates unchanged, as from
torch's gradcheck; these call sites are marked (tracebacks.py:calls_user_code) so that the frames
tell it. Anything else raised inside the drop-in's own code is a bug in gradtool: `owned` turns
it into gradtool's InternalError, which says so and how to report it, never re-raised as if the
checked code raised it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import GradtoolError, InternalError
from ..tracebacks import calls_user_code, gradtool_frame, raised_in_gradtool

REPORT = ("please report it to gradtool's maintainers with this traceback; meanwhile torch's "
          "own torch.autograd.gradcheck judges this call (under pytest: run without "
          "--gradtool-gradcheck)")


@calls_user_code
def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs): the checked function, or torch's public gradcheck running it."""
    return fn(*args, **kwargs)


@calls_user_code
def grad(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """torch.autograd.grad: autograd's engine running the checked function's backward."""
    return torch.autograd.grad(*args, **kwargs)


@contextlib.contextmanager
def owned(expected: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Within: an exception raised by gradtool's own code (not one of `expected`, the verdicts
    and refusals it raises on purpose) becomes gradtool's InternalError."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, (*expected, GradtoolError, InternalError)) or \
                not raised_in_gradtool(exc):
            raise
        error = InternalError(exc, gradtool_frame(exc))
        error.args = (f"{error.args[0]}\n{REPORT}",)
        raise error from exc
