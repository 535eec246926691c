"""The result model: frozen dataclasses of plain values (no torch) that every renderer reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1


class Outcome(str, Enum):
    """pytest's words, plus inconclusive (finite differences unreliable) and the xfail pair."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    INCONCLUSIVE = "inconclusive"
    XFAILED = "xfailed"   # declared expected to fail, and it did
    XPASSED = "xpassed"   # declared expected to fail, but it passed: the declaration is stale

    def is_bad(self, strict: bool = False) -> bool:
        """Whether this outcome fails the run (inconclusive only under --strict)."""
        if self is Outcome.INCONCLUSIVE:
            return strict
        return self in (Outcome.FAILED, Outcome.ERROR, Outcome.XPASSED)


# Worst first: the order used to summarise several outcomes into one.
SEVERITY = (Outcome.ERROR, Outcome.FAILED, Outcome.XPASSED, Outcome.INCONCLUSIVE,
            Outcome.PASSED, Outcome.XFAILED, Outcome.SKIPPED)


def worst(outcomes: list[Outcome]) -> Outcome:
    """The most severe of several outcomes (skipped when there are none)."""
    return min(outcomes, key=SEVERITY.index) if outcomes else Outcome.SKIPPED


@dataclass(frozen=True)
class Element:
    """One Jacobian entry that disagrees: where it is and both values."""

    input: str
    input_index: tuple[int, ...]
    output: str
    output_index: tuple[int, ...]
    analytical: float
    numerical: float
    abs_diff: float
    rel_diff: float
    inconclusive: bool = False


@dataclass(frozen=True)
class ErrorGrid:
    """A failing block's errors, downsampled for a picture (the HTML heat map, -v's text map).

    Cell (r, c) holds the largest error over Jacobian rows (output elements) r*row_tile ...
    (r+1)*row_tile - 1 and columns (input elements) c*col_tile ... of the block; rel_diff is
    |a - n| / max(|n|, atol), so an exact zero in numerical does not blow it up; mismatched
    counts the elements beyond tolerance in each cell."""

    n_rows: int              # output elements of the block (Jacobian rows)
    n_cols: int              # input elements (Jacobian columns)
    row_tile: int
    col_tile: int
    abs_diff: tuple[tuple[float, ...], ...]
    rel_diff: tuple[tuple[float, ...], ...]
    mismatched: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Block:
    """The comparison of one (input, output) pair of the Jacobian."""

    input: str
    input_shape: tuple[int, ...]
    output: str
    output_shape: tuple[int, ...]
    checked: int            # elements compared (probe mode: probes)
    mismatched: int         # elements (or probes) beyond tolerance
    max_abs_diff: float
    max_rel_diff: float
    worst: tuple[Element, ...] = ()
    diagnosis: str | None = None
    exhaustive: bool = True  # False when elements were found by localisation, not a full sweep
    grid: ErrorGrid | None = None  # failing/inconclusive blocks evaluated whole (full mode) only


class Severity(str, Enum):
    """How a finding counts: a failure fails its check; a warning is told, and fails only under
    --strict (legal but worth knowing: an engine-summed gradient, say)."""

    FAILURE = "failure"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One broken (or questionable) rule, as data: logic reads `rule` and `data`, never `message`.

    rule is a stable id, `<check>.<rule>` (e.g. "contract.broadcast_gradient"), listed in the
    README and `gradtool list`, and the handle by which a spec or [tool.gradtool] silences it.
    """

    rule: str
    message: str
    severity: Severity = Severity.FAILURE
    source: str | None = None       # file:line of the code to look at, when it is not the check's
    # The plain values the message is made of (the block's input and output, a factor, counts,
    # element labels), so tools read them without parsing the words.
    data: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CheckResult:
    """One property verified on one case.

    Each fact lives once: a finding's words are in `findings`, never copied into `details`
    (notes and hints only). A check judged by its findings, without blocks, opens its summary
    with its first failure's words (headline, below); renderers list the other findings."""

    name: str
    outcome: Outcome
    summary: str = ""
    details: tuple[str, ...] = ()
    blocks: tuple[Block, ...] = ()
    mode: str | None = None
    mode_reason: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    source: str | None = None       # file:line of the code to look at
    traceback: str | None = None    # trimmed, for error outcomes
    exception: str | None = None    # the exception's type, for error outcomes (with traceback:
                                    # the error's identity, so a repeat is told once)
    expected_failure: str | None = None  # the declared reason, for xfailed / xpassed
    findings: tuple[Finding, ...] = ()   # every rule broken, failures and warnings, as data

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.WARNING)

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.FAILURE)


def headline(findings: tuple[Finding, ...] | list[Finding]) -> Finding | None:
    """The failure a findings-judged check's summary says (its first), or None."""
    return next((f for f in findings if f.severity is Severity.FAILURE), None)


@dataclass(frozen=True)
class PlannedCost:
    """One check's evaluations in its case's cost plan (run/plan.py), counted before any check
    ran: the forwards and backwards it will pay on correct code, those the case's ledger will
    serve it instead (read from `read_from`), and whether the count is `exact` or an upper
    bound ("at most"); no counts (None): not planned (a variant judges, an opt-in check, a mode
    only timing decides). A failure pays more than planned: its confirmation calls."""

    check: str
    mode: str = ""
    forward: int | None = None
    backward: int | None = None
    forward_read: int = 0
    backward_read: int = 0
    bound: str = ""
    read_from: str = ""

    @property
    def planned(self) -> bool:
        return self.forward is not None and self.backward is not None


@dataclass(frozen=True)
class InputInfo:
    """How one forward argument was made: name, description, whether it is differentiable and
    whether it is a module's parameter (its layout is the module's, never the caller's)."""

    name: str
    description: str
    differentiable: bool
    parameter: bool = False


@dataclass(frozen=True)
class CaseResult:
    """One set of sampled inputs for a target, and the checks run on it."""

    label: str
    seed: int
    inputs: tuple[InputInfo, ...]
    checks: tuple[CheckResult, ...]
    inferred: bool = False
    notes: tuple[str, ...] = ()
    reproduce: str = ""
    pin: str = ""  # the --input flags that pin these inputs (shown when they were inferred)
    # The case's seconds outside its checks (each check's duration_s holds everything done on
    # its behalf, its hooks' culprit search included): sampling the inputs, the probe phase,
    # a first sample found inconclusive and resampled.
    setup_s: float = 0.0
    plan: tuple[PlannedCost, ...] = ()  # the cost plan: each check's evaluations, before any ran

    @property
    def outcome(self) -> Outcome:
        return worst([c.outcome for c in self.checks])


@dataclass(frozen=True)
class TargetResult:
    """Everything checked for one target."""

    target: str
    kind: str
    qualname: str
    source: str | None
    cases: tuple[CaseResult, ...]
    spec: str | None = None

    @property
    def outcome(self) -> Outcome:
        return worst([c.outcome for c in self.cases])


@dataclass(frozen=True)
class Rejected:
    """A target or spec file that could not be loaded; the run still checks the others."""

    source: str
    message: str


@dataclass(frozen=True)
class Reproducer:
    """A standalone pytest file written by --repro for a failing target, and how far the
    failing case was shrunk ("6x40 -> 1x1 in 14 checks")."""

    target: str
    path: str                 # the test file written
    check: str                # the failing check it reproduces
    finding: str              # the kind of failure kept while shrinking
    shrunk_from: str          # the inputs before shrinking, e.g. "6x40, 2.5"
    shrunk_to: str
    checks_run: int           # checks run while shrinking (the budget's unit)
    budget: int
    note: str = ""            # e.g. "budget exhausted", "values simplified"


# How a Report reads as plain text (what `gradtool check` prints): registered by the render
# room when it is loaded (gradtool.check loads it), since results sits below it.
PLAIN_TEXT: list[Callable[[Report, bool], str]] = []


@dataclass(frozen=True)
class Report:
    """A whole run: the result of gradtool.check and the input of every renderer."""

    targets: tuple[TargetResult, ...]
    config: dict[str, Any]
    versions: dict[str, str]
    rejected: tuple[Rejected, ...] = ()
    duration_s: float = 0.0
    schema_version: int = SCHEMA_VERSION
    not_run: tuple[str, ...] = ()     # targets left unchecked when the run was interrupted
    interrupted: str | None = None    # the signal that stopped the run (SIGINT, SIGTERM)
    reproducers: tuple[Reproducer, ...] = ()  # --repro: a test file per failing target

    def text(self, verbose: bool = False) -> str:
        """The plain-text report `gradtool check` prints (verbose: as `-v` prints it)."""
        return PLAIN_TEXT[0](self, verbose) if PLAIN_TEXT else repr(self)

    def __str__(self) -> str:
        return self.text()

    def __bool__(self) -> bool:
        # `assert gradtool.check(...)` translates `assert gradcheck(...)`: a Report is true
        # exactly when ok() is (a dataclass is otherwise always true, passing a wrong gradient).
        return self.ok()

    def checks(self) -> list[tuple[TargetResult, CaseResult, CheckResult]]:
        """Every (target, case, check) triple, in run order."""
        return [(t, c, k) for t in self.targets for c in t.cases for k in c.checks]

    def counts(self) -> Counter[str]:
        """How many checks ended with each outcome."""
        return Counter(k.outcome.value for _, _, k in self.checks())

    def ok(self, strict: bool = False) -> bool:
        """True when nothing fails the run (a rejected spec or target fails it too)."""
        if self.rejected or self.not_run or self.interrupted:
            return False
        # --strict fails on warnings too, as on inconclusive outcomes.
        return not any(k.outcome.is_bad(strict) or (strict and k.warnings)
                       for _, _, k in self.checks())

    def time_parts(self) -> dict[str, float]:
        """Where the run's seconds went: in checks, in setting up cases, and the run's own
        (collection, worker processes, --repro's shrinking); the three add up to duration_s
        (workers running in parallel can make the first two exceed it: the run's own is 0)."""
        checks = sum(k.duration_s for _, _, k in self.checks())
        setup = sum(c.setup_s for t in self.targets for c in t.cases)
        return {"checks": checks, "setup": setup,
                "run": max(0.0, self.duration_s - checks - setup)}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (enums as their string values)."""
        return _plain(asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value
