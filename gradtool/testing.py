"""Helpers for test suites: assert_gradients (raises with the plain report) and check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import api
from .api import check
from .results import Report
from .targets.inputs import InputSpec

__all__ = ["assert_gradients", "check"]


def assert_gradients(target: Any, inputs: Sequence[InputSpec | str] | None = None,
                     **settings: Any) -> Report:
    """Check target; raise AssertionError with the CLI's plain report when anything fails.

    Same arguments as gradtool.check (inputs as --input strings like '3x4' or InputSpec objects;
    settings are CheckConfig fields). Returns the Report when every check passed.
    """
    __tracebackhide__ = True  # pytest: the failure points at the test's line, not at gradtool
    try:
        return api.assert_gradients(target, inputs, **settings)
    except AssertionError as exc:
        # Re-raised here so the traceback stops at the caller instead of gradtool's internals.
        raise AssertionError(str(exc)) from None
