"""Helpers for test suites: assert_gradients (raises with the plain report) and check."""

from __future__ import annotations

from typing import Any

from . import api
from .api import check
from .results import Report

__all__ = ["assert_gradients", "check"]


def assert_gradients(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
                     **settings: Any) -> Report:
    """Check target; raise AssertionError with the CLI's plain report when anything fails.

    Same arguments as gradtool.check: inputs as the test's own tensors (gradcheck's convention),
    --input strings like '3x4', InputSpec objects, or nestings of them; kwargs for keyword
    arguments; settings are CheckConfig fields. Returns the Report when every check passed.
    """
    __tracebackhide__ = True  # pytest: the failure points at the test's line, not at gradtool
    try:
        return api.assert_gradients(target, inputs, kwargs, **settings)
    except AssertionError as exc:
        # Re-raised here so the traceback stops at the caller instead of gradtool's internals.
        raise AssertionError(str(exc)) from None
