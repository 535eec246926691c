"""The one vocabulary of every report: the words terminal, JUnit, annotations, HTML and the
pytest plugin say about a check, its blocks, elements and findings (rendered from data)."""

from __future__ import annotations

from collections.abc import Iterator

from ..results import (Block, CaseResult, CheckResult, Element, Outcome, PlannedCost, Report,
                       TargetResult)

Line = tuple[str, str]  # (text, rich style name)

LABELS = {
    Outcome.PASSED: ("PASS ", "green"), Outcome.FAILED: ("FAIL ", "bold red"),
    Outcome.ERROR: ("ERROR", "bold red"), Outcome.SKIPPED: ("SKIP ", "yellow"),
    Outcome.INCONCLUSIVE: ("INCONCLUSIVE", "bold yellow"), Outcome.XFAILED: ("XFAIL", "yellow"),
    Outcome.XPASSED: ("XPASS", "bold red"),
}


def warnings_text(check: CheckResult, short: bool = False) -> str:
    """'1 warning: <message> [rule id]' (several: '2 warnings: ...; ...'); on the check's own
    line (`short`), a warning that is the check's summary (data "summary") is its rule alone."""
    found = check.warnings
    listed = "; ".join(f"[{w.rule}]" if short and w.data.get("summary") else
                       f"{w.message} [{w.rule}]" for w in found)
    return f"{len(found)} warning{'' if len(found) == 1 else 's'}: {listed}"


def inputs_lines(case: CaseResult) -> Iterator[Line]:
    """The case's inputs, how to pin inferred ones, and its notes."""
    if not case.inputs:  # never sampled: its worker died or timed out before they were known
        return
    how = "inferred" if case.inferred else "given"
    inputs = ", ".join(f"{i.name} {i.description}" for i in case.inputs)
    yield f"  inputs ({how}, seed {case.seed}): {inputs}", "dim"
    if case.inferred and case.pin:
        yield f"  pin them with: {case.pin}", "dim"
    for note in case.notes:
        yield f"  note: {note}", "dim"


def check_body(check: CheckResult) -> list[str]:
    """The detail of a check that did not pass, without the header line."""
    lines = [check.summary]
    if check.expected_failure and check.outcome is Outcome.XPASSED:
        lines.append(f"declared expected failure: {check.expected_failure}")
    told: dict[str, int] = {}  # a diagnosis's kind (its numbers left out) -> its line
    for block in check.blocks:
        if not block.mismatched:
            continue
        more = block_lines(block, check.tolerance, other_label(check), mode=check.mode)
        kind = diagnosis_kind(block.diagnosis)
        if kind in told:  # the same diagnosis for another block: once, naming the blocks
            more = [line for line in more if not line.startswith("diagnosis: ")]
            first = told[kind]
            lines[first] += (", and for " if "(the same for" in lines[first]
                             else " (the same for ") + f"{block.input} -> {block.output}"
        elif kind:
            told[kind] = len(lines) + len(more) - 1
        lines += more
    lines = [line + ")" if line.startswith("diagnosis: ") and "(the same for" in line
             else line for line in lines]
    lines += list(check.details)
    lines += finding_lines(check)
    if broken_rules(check):
        lines.append(rules_text(check))
    if check.warnings:
        lines.append(warnings_text(check))
    if check.mode:
        lines.append(f"mode: {check.mode} ({check.mode_reason})")
    if check.source:
        lines.append(f"look at: {relative(check.source)}")
    if check.traceback and "\n" in check.traceback:  # a lone exception line repeats the summary
        lines += ["traceback (user code):",
                  *("  " + _under_cwd(t) for t in check.traceback.splitlines())]
    return lines


def finding_lines(check: CheckResult) -> list[str]:
    """The failures a check without blocks found beyond its first (which its summary says);
    a check with blocks says its findings in them. An error's summary is the exception: every
    finding is told (a model's inner Function that raises on a None grad_output says why)."""
    if check.blocks:
        return []
    return [f.message for f in check.failures[0 if check.outcome is Outcome.ERROR else 1:]]


def other_label(check: CheckResult) -> str:
    """What analytical is compared with: "intended" against a declared surrogate (its mismatch
    findings say which), else "numerical"."""
    return "intended" if any(f.data.get("surrogate") for f in check.findings) else "numerical"


def broken_rules(check: CheckResult) -> list[str]:
    """The rule ids of a check's failure findings, each once, in order."""
    return list(dict.fromkeys(f.rule for f in check.failures))


def rules_text(check: CheckResult) -> str:
    """'rules broken: gradient.mismatch, gradient.factor' (the ids ignore: and CI filter by)."""
    return "rules broken: " + ", ".join(broken_rules(check))


def diagnosis_kind(diagnosis: str | None) -> str:
    """A diagnosis without its numbers: two blocks with the same kind say the same thing."""
    import re

    return re.sub(r"[-+]?\d[\d.,e+-]*", "#", diagnosis or "")


def block_lines(block: Block, tolerance: dict[str, float], label: str = "numerical",
                max_worst: int | None = None, mode: str | None = None) -> list[str]:
    count = (f"mismatched elements {block.mismatched} / {block.checked}" if block.exhaustive
             # full mode stopped at a confirmed failure: its counts are of what it compared
             else f"mismatched elements {block.mismatched} / {block.checked} compared (the "
             "block not swept whole)" if mode == "full"
             else f"located {_plural(block.mismatched, 'mismatched element')} by bisection"
             if block.worst else "the probe fails; no single element located")
    lines = [f"input '{block.input}' {_shape(block.input_shape)} -> {block.output} "
             f"{_shape(block.output_shape)}   {count}"]
    tol = ("(tolerance measured)" if "measured_k" in tolerance else
           f"(atol {tolerance.get('atol', 0):g}, rtol {tolerance.get('rtol', 0):g})")
    if block.worst:
        first = block.worst[0]
        # In probe mode max_abs_diff is a probe-level number: show the element's own values.
        head = (f"max abs diff {block.max_abs_diff:.3g} at" if block.exhaustive
                else "element")
        if block.exhaustive and not _same(first.abs_diff, block.max_abs_diff):
            # The element shown is the one furthest beyond its own tolerance (with its
            # confirmed values); the block's largest raw difference is another element's.
            head = (f"max abs diff {block.max_abs_diff:.3g} over the block; furthest beyond "
                    "tolerance at")
        lines.append(f"{head} {element_text(first, label)}   {tol}")
        shown = block.worst[1:max_worst]
        lines += [f"  also {element_text(e, label)}" for e in shown]
        if len(block.worst) > 1 + len(shown):
            lines.append(f"  ... {len(block.worst) - 1 - len(shown)} more")
    if block.diagnosis:
        lines.append(f"diagnosis: {block.diagnosis}")
    return lines


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) or (a != a and b != b)


def element_text(e: Element, label: str = "numerical") -> str:
    where = f"{_index(e.input_index)}->{_index(e.output_index)}"
    mark = "  (finite differences disagree here)" if e.inconclusive else ""
    return f"{where}: analytical {e.analytical:.6g}, {label} {e.numerical:.6g}{mark}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def time_text(report: Report) -> str:
    """'time: 4.12s in checks, 0.31s setting up cases, 0.05s the run's own': every second of
    the run told (a check's own includes its culprit search and diagnosis)."""
    parts = report.time_parts()
    return (f"time: {parts['checks']:.2f}s in checks (each with its culprit search, hooks and "
            f"diagnosis), {parts['setup']:.2f}s setting up cases (inputs, probe phase), "
            f"{parts['run']:.2f}s the run's own (collection, workers, --repro) = "
            f"{report.duration_s:.2f}s")


def plan_text(plan: tuple[PlannedCost, ...]) -> str:
    """'plan: contract 4 backward (2 read from the gradient rows), gradient full at most 24
    forward 12 backward (1 forward read from the contract's graph), ...; paid/read': the case's
    cost plan, made before its first check (what each check then paid is its calls)."""
    told = [_planned(p) for p in plan if p.planned]
    left = [p.check for p in plan if not p.planned]
    text = "plan: " + (", ".join(told) or "nothing counted")
    return text + (f"; not planned: {', '.join(left)}" if left else "")


def beyond_text(case: CaseResult) -> str:
    """'beyond the plan: layout 4 backward (it failed: confirmations, diagnosis)': what each
    check paid and read past its planned count (an upper bound's slack is not beyond), or ''."""
    by = {c.name: c for c in case.checks}
    told = []
    for p in (p for p in case.plan if p.planned and p.check in by):
        check = by[p.check]
        more = [(check.calls.get(kind, 0) + check.calls.get(f"{kind} read", 0)
                 - (planned or 0) - read, kind) for kind, planned, read in
                (("forward", p.forward, p.forward_read), ("backward", p.backward,
                                                           p.backward_read))]
        more = [f"{n} {kind}" for n, kind in more if n > 0]
        if more:
            why = "it failed: confirmations, diagnosis" if check.outcome is Outcome.FAILED \
                else "found as it ran"
            told.append(f"{p.check} {' '.join(more)} ({why})")
    return f"beyond the plan: {', '.join(told)}" if told else ""


def _planned(p: PlannedCost) -> str:
    paid = " ".join(f"{n} {kind}" for n, kind in ((p.forward, "forward"),
                                                   (p.backward, "backward")) if n)
    mode = f" {p.mode}" if p.mode else ""
    bound = " at most" if p.bound == "at most" else ""
    read = " and ".join(f"{n} {kind}" for n, kind in ((p.forward_read, "forward"),
                                                        (p.backward_read, "backward")) if n)
    read = f" ({read} read from {p.read_from})" if read else ""
    return f"{p.check}{mode}{bound} {paid or 'nothing'}{read}"


def check_text(target: TargetResult, case: CaseResult, check: CheckResult) -> str:
    """Plain text of one check, as failures carry it in JUnit and assert_gradients."""
    word = LABELS[check.outcome][0].strip()
    lines = [f"{word} {target.target}   {check.name}"]
    lines += [text for text, _ in inputs_lines(case)]
    lines += ["  " + line for line in check_body(check)]
    lines.append(f"  reproduce: {case.reproduce}")
    return "\n".join(lines)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _index(index: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, index)) + ")"


def _under_cwd(line: str) -> str:
    """A traceback line with the working directory's prefix dropped from its paths."""
    import os

    return line.replace(os.getcwd().rstrip(os.sep) + os.sep, "")


def relative(source: str) -> str:
    """'path:line' relative to the working directory where the file lies under it (a source
    taken from a traceback is absolute)."""
    import os

    path, sep, line = source.rpartition(":")
    if not sep or not line.isdigit() or not os.path.isabs(path):
        return source
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return source
    return source if rel.startswith("..") else f"{rel}:{line}"


def literal_hint(case: CaseResult, check: CheckResult) -> list[str]:
    """For an error where a literal that reads like a shape (-i 64, -i 3,4) reached code that
    wanted a tensor ("'int' object has no attribute 'to'"): the shape syntax it meant."""
    import re

    if check.outcome is not Outcome.ERROR:
        return []
    for info in case.inputs:
        match = re.fullmatch(r"\(?(\d+(?:, \d+)*),?\)?", info.description)
        kind = "tuple" if info.description.startswith("(") else "int"
        # a tuple of sizes reaching a forward that raised a type error: the shape syntax was
        # meant whatever the message says (a TypeError deep in user code names no 'tuple')
        typed = kind == "tuple" and check.exception in ("builtins.TypeError",
                                                        "builtins.AttributeError")
        if info.differentiable or not match or not (typed or re.search(
                rf"'{kind}' object|type '{kind}'|found {kind}\b", check.summary)):
            continue
        sizes = match.group(1).split(", ")
        shape = f"-i {'x'.join(sizes)}" if len(sizes) > 1 else f"-i '({sizes[0]},)'"
        return [f"hint: {info.name!r} is the {kind} {info.description}, given as a literal; "
                f"a tensor of that shape is {shape}"]
    return []
