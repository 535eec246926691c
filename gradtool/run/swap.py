"""torch's gradcheck and gradgradcheck swapped for replacements wherever they are bound, and put back.

`pytest --gradtool-gradcheck` routes every call a test session makes to the drop-in. A call reads
`torch.autograd.gradcheck` at call time, but `from torch.autograd import gradcheck` binds the
function object into the importing module once: a conftest file or a project helper imported
before the swap holds torch's own function. So installing sets the two names in
`torch.autograd` and `torch.autograd.gradcheck`, then rebinds every module global that holds
torch's function object (any alias); modules imported later read the swapped names. Putting
back scans again, so names bound to a router after the install are restored too. A function
object captured elsewhere before the install (a default argument, a closure) keeps torch's.

A call made while a routed call runs (gradtool's own use of torch's helpers, or a checked
function that itself calls gradcheck) goes to torch's function unrouted.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InternalError

NAMES = ("gradcheck", "gradgradcheck")
_TORCH_MODULES = ("torch.autograd", "torch.autograd.gradcheck")
# gradtool's own modules keep torch's functions: the drop-in may call them.
_OWN = "gradtool."


@dataclass(frozen=True)
class Call:
    """One routed call: which function, how it ended, how long it took, and where it was made."""

    name: str        # gradcheck or gradgradcheck
    outcome: str     # passed, failed (False or GradcheckError), internal (gradtool's
    # InternalError: a bug in gradtool), raised (any other exception: the checked code's)
    seconds: float
    where: str = ""  # the caller's label (the pytest plugin: the test's node id)
    error: str = ""  # the exception's type and first line, for failed and raised
    elements: int = 0  # elements of the inputs requiring grad: the size of the problem

    def row(self) -> list[Any]:
        """Plain values, as pytest-xdist sends a worker's output to the controller."""
        return [self.name, self.outcome, self.seconds, self.where, self.error, self.elements]


class Swap:
    """Routes torch's gradcheck and gradgradcheck to replacements and records each call."""

    def __init__(self, replacements: dict[str, Callable[..., Any]],
                 where: Callable[[], str] = lambda: "") -> None:
        import torch.autograd.gradcheck  # noqa: F401 (loads the module whose names are swapped)

        self.calls: list[Call] = []
        self._where = where
        self._inside = threading.local()
        self._failure = sys.modules["torch.autograd.gradcheck"].GradcheckError
        found = {name: getattr(sys.modules["torch.autograd"], name) for name in NAMES}
        # A router left by an enclosing session (pytester in-process): route from what it wraps.
        self.originals = {n: getattr(f, "_gradtool_original", f) for n, f in found.items()}
        self._found = found
        self.routers = {n: self._router(n, self.originals[n], replacements[n]) for n in NAMES}
        self.installed = False

    def install(self) -> None:
        """Route: torch's two modules first, then every loaded module's global alias."""
        for module in _TORCH_MODULES:
            for name in NAMES:
                setattr(sys.modules[module], name, self.routers[name])
        self._rebind({id(f): self.routers[n] for n, f in self._found.items()}
                     | {id(f): self.routers[n] for n, f in self.originals.items()})
        self.installed = True

    def restore(self) -> None:
        """Put back what install found, wherever a router of this swap is bound now."""
        if self.installed:
            self._rebind({id(r): self._found[n] for n, r in self.routers.items()})
            self.installed = False

    def _rebind(self, table: dict[int, Callable[..., Any]]) -> None:
        for namespace in _namespaces():
            for key, value in list(namespace.items()):
                if id(value) in table:
                    namespace[key] = table[id(value)]

    def _router(self, name: str, original: Callable[..., Any],
                replacement: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def routed(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # pytest shows the test's line, not this router's
            if getattr(self._inside, "on", False):
                return original(*args, **kwargs)
            self._inside.on = True
            start, outcome, error = time.perf_counter(), "raised", ""
            try:
                result = replacement(*args, **kwargs)
                outcome = "passed" if result else "failed"
                return result
            except BaseException as exc:
                outcome = "failed" if isinstance(exc, self._failure) else \
                    "internal" if isinstance(exc, InternalError) else "raised"
                error = _first_line(exc)
                raise
            finally:
                self._inside.on = False
                self.calls.append(Call(name, outcome, time.perf_counter() - start,
                                       self._where(), error, input_elements(args, kwargs)))

        routed._gradtool_original = original  # type: ignore[attr-defined]
        return routed


def _namespaces() -> Iterator[dict[str, Any]]:
    """The globals of every loaded module but gradtool's own."""
    for key, module in list(sys.modules.items()):
        if key.startswith(_OWN):
            continue
        try:
            namespace = vars(module)
        except TypeError:  # a stand-in without __dict__ placed in sys.modules
            continue
        if isinstance(namespace, dict):
            yield namespace


def input_elements(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Elements of the inputs requiring grad (gradcheck's second argument: a tensor or a tuple)."""
    inputs = args[1] if len(args) > 1 else kwargs.get("inputs", ())
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    return sum(x.numel() for x in inputs if getattr(x, "requires_grad", False)
               and callable(getattr(x, "numel", None)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class Xpassed:
    """A pytest plugin object: collects the tests marked as expected failures that passed (under
    xdist from the reports the controller receives) into `tests`, for the summary."""

    def __init__(self, tests: list[tuple[str, str]]) -> None:
        self.tests = tests  # (test, the reason its mark gives, or "")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if unexpected_success(report):
            self.tests.append((report.nodeid, mark_reason(report)))


def mark_reason(report: Any) -> str:
    """The reason an expected-failure mark gives: pytest keeps it in `wasxfail`, a strict
    mark's in its failure text; unittest's expectedFailure gives none."""
    if getattr(report, "wasxfail", ""):
        return str(report.wasxfail)
    text = str(report.longrepr) if report.outcome == "failed" else ""
    return text.removeprefix("[XPASS(strict)]").strip() if text.startswith("[XPASS") else ""


def unexpected_success(report: Any) -> bool:
    """Whether a test's call phase passed though the test is marked an expected failure
    (pytest's xfail, strict or not; unittest's expectedFailure)."""
    if getattr(report, "when", None) != "call":
        return False
    if report.outcome == "passed":
        return hasattr(report, "wasxfail")
    text = str(report.longrepr) if report.outcome == "failed" else ""
    return text.startswith(("[XPASS(strict)]", "Unexpected success"))


def expected_failures_passed(calls: list[Call], xpassed: list[tuple[str, str]]) -> str | None:
    """The summary's line on tests marked as expected failures that passed, every gradcheck
    call they made passed by gradtool: torch's own gradcheck cannot judge those calls. Each
    test with its mark's reason and its calls."""
    outcomes: dict[str, set[str]] = {}
    made: dict[str, int] = {}
    for call in calls:
        outcomes.setdefault(call.where, set()).add(call.outcome)
        made[call.where] = made.get(call.where, 0) + 1
    reasons = dict(xpassed)
    tests = [t for t in reasons if outcomes.get(t) == {"passed"}]
    if not tests:
        return None
    lines = [f"{t} ({made[t]} call(s) passed" + (f"; marked: {reasons[t]})" if reasons[t]
                                                 else ")") for t in tests[:10]]
    shown = "\n  ".join(lines) + (f"\n  ... and {len(tests) - 10} more"
                                  if len(tests) > 10 else "")
    return (f"{len(tests)} test(s) marked as expected failures passed: gradtool passed every "
            "gradcheck call they made, where torch's own gradcheck fails them (a dtype it errs "
            "on, or finite differences that are rounding noise at its float64 step):\n  "
            f"{shown}\nmake the mark conditional on GRADTOOL_GRADCHECK != '1' (set while "
            "calls are routed), see docs/switching-from-gradcheck.md, 'Expected failures'")
