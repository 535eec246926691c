"""The human report: one line per passing check, detail only for what did not pass."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ..results import (PLAIN_TEXT, Block, CaseResult, CheckResult, Outcome, Report, Reproducer,
                       TargetResult)
from .words import (LABELS, Line, beyond_text, block_lines, check_body, check_text,
                    element_text, inputs_lines, literal_hint, plan_text, time_text,
                    warnings_text)

__all__ = ["LABELS", "block_lines", "check_body", "check_text", "element_text", "heatmap_lines",
           "report_lines", "summary_line", "warnings_text"]



def report_lines(report: Report, verbose: bool = False, quiet: bool = False) -> list[Line]:
    """All lines of the report, each with a style; plain text is just the first items."""
    lines: list[Line] = []
    for target in report.targets:
        for case in target.cases:
            lines += _case_lines(target, case, verbose, quiet)
        lines += sweep_lines(target)
    for rejected in report.rejected:
        lines.append((f"REJECTED {rejected.source}", "bold red"))
        lines += [(f"  {line}", "") for line in rejected.message.splitlines()]
    lines += [(f"NOT RUN  {name}  ({report.interrupted or 'interrupted'})", "bold yellow")
              for name in report.not_run]
    lines += [reproducer_line(r) for r in report.reproducers]
    lines.append(("", ""))
    if verbose:  # beside each check's own time (-v): where the rest went
        lines.append((time_text(report), "dim"))
    lines.append(summary_line(report))
    return lines


def reproducer_line(r: Reproducer) -> Line:
    """--repro's result for one target: the file, and how far its case was shrunk."""
    if not r.path:
        return f"REPRO    {r.target}: {r.note}", "yellow"
    note = f" ({r.note})" if r.note else ""
    return (f"REPRO    {r.path}: {r.check} ({r.finding}), shrunk {r.shrunk_from} → "
            f"{r.shrunk_to} in {r.checks_run} checks{note}", "cyan")


def sweep_lines(target: TargetResult) -> list[Line]:
    """'SWEEP name: failed at D=17, D=33; passed at D=16' when swept sizes disagree (a case
    label of --sweep is 'D=17' or 'N=2, D=17')."""
    swept = [c for c in target.cases if "=" in c.label]
    bad = [c.label for c in swept if c.outcome.is_bad()]
    if len(swept) < 2 or not bad:
        return []
    good = [c.label for c in swept if not c.outcome.is_bad()]
    text = f"SWEEP {target.target}: failed at {'; '.join(bad)}"
    return [(text + (f" — passed at {'; '.join(good)}" if good else ""), "bold red")]


def render_plain(report: Report, verbose: bool = False, quiet: bool = False) -> str:
    return "\n".join(text for text, _ in report_lines(report, verbose, quiet))


PLAIN_TEXT[:] = [render_plain]  # str(report), report.text(verbose)


def summary_line(report: Report) -> Line:
    counts = report.counts()
    order = ["failed", "error", "xpassed", "inconclusive", "passed", "xfailed", "skipped"]
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    if report.rejected:
        parts.insert(0, f"{len(report.rejected)} rejected")
    if report.not_run:
        parts.append(f"{len(report.not_run)} target(s) not run")
    if report.interrupted:
        parts.append(f"interrupted by {report.interrupted}")
    warned = sum(len(k.warnings) for _, _, k in report.checks())
    if warned:
        strict = " (fail under --strict)" if report.config.get("strict") else ""
        parts.append(f"{warned} warning{'' if warned == 1 else 's'}{strict}")
    n_checks = sum(counts.values())
    text = (f"{len(report.targets)} target(s), {n_checks} check(s): "
            f"{', '.join(parts) or 'nothing run'} in {report.duration_s:.2f}s")
    strict = bool(report.config.get("strict"))
    return text, "bold green" if report.ok(strict) else "bold red"


def _case_lines(target: TargetResult, case: CaseResult, verbose: bool, quiet: bool
                ) -> Iterator[Line]:
    label = target.target + ("" if case.label == "case 0" else f" [{case.label}]")
    shown_inputs = False
    for check in case.checks:
        passing = check.outcome in (Outcome.PASSED, Outcome.SKIPPED, Outcome.XFAILED)
        if quiet and passing:
            continue
        word, style = LABELS[check.outcome]
        timing = f"  ({_timing(check)})" if verbose else ""
        short = _short(check) if passing else ""
        if check.warnings:
            short = f"{short or '—'} {warnings_text(check, short=bool(short))}"
        tail = f"  {short}" if short else ""
        yield f"{word} {label}   {check.name}{tail}{timing}", style
        if passing:
            if verbose and check.mode_reason:  # how it was checked, and what was dropped
                yield f"  mode: {check.mode} ({check.mode_reason})", "dim"
            continue
        if not shown_inputs:
            yield from inputs_lines(case)
            shown_inputs = True
        yield from (("  " + line, "") for line in check_body(check) + literal_hint(case, check))
        if verbose:  # a small picture of each failing block evaluated whole
            for block in check.blocks:
                if block.mismatched and block.grid is not None:
                    yield from (("  " + line, style) for line, style in heatmap_lines(block))
        yield f"  reproduce: {case.reproduce}", "cyan"
    if verbose and case.plan:  # the evaluations counted before the first check ran
        yield f"  {plan_text(case.plan)}", "dim"
        if beyond_text(case):  # a failure's confirmations: outside the plan, said
            yield f"  {beyond_text(case)}", "dim"
    if case.inferred and not shown_inputs and not quiet:
        yield from inputs_lines(case)  # inferred inputs are shown so they can be pinned
    elif not shown_inputs and not quiet:  # a note (a stochastic forward, say) holds on a pass too
        yield from ((f"  note: {note}", "dim") for note in case.notes)


def _timing(check: CheckResult) -> str:
    paid = ", ".join(f"{n} {k}" for k, n in sorted(check.calls.items())
                     if not k.endswith(" read"))
    read = ", ".join(f"{n} {k[:-len(' read')]}" for k, n in sorted(check.calls.items())
                     if k.endswith(" read"))
    text = f"{check.duration_s * 1000:.0f} ms" + (f", {paid} calls" if paid else "")
    # evaluations an earlier check paid and this one read (numerics/ledger.py)
    return text + (f"; read from the case's ledger: {read}" if read else "")


def _short(check: CheckResult) -> str:
    if check.outcome is Outcome.SKIPPED:
        return f"— {check.summary}"
    if check.outcome is Outcome.XFAILED:
        return f"— expected: {check.expected_failure}"
    if check.mode:
        return f"— {check.mode} mode, {check.summary.split(': ', 1)[-1]}"
    return ""


# The text heat map (-v): log-scale shades of |a - n| over 6 decades below the block's maximum.
SHADES = "·░▒▓█"
HEATMAP = "heatmap"  # the style of a map row: heat_text colours each shade
HEAT_STYLES = {"░": "yellow", "▒": "dark_orange", "▓": "red", "█": "bold red", "×": "bold cyan"}
DECADES = 6


def heatmap_lines(block: Block, max_cols: int = 48, max_rows: int = 16) -> list[Line]:
    """|analytical − numerical| of a failing block as rows of shade characters, pooled again
    (max) to fit a terminal; the worst elements are marked ×."""
    grid = block.grid
    if grid is None or not grid.abs_diff:
        return []
    values = grid.abs_diff
    rt, ct = -(-len(values) // max_rows), -(-len(values[0]) // max_cols)
    pooled = [[max(v for row in values[r:r + rt] for v in row[c:c + ct])
               for c in range(0, len(values[0]), ct)] for r in range(0, len(values), rt)]
    finite = [v for row in pooled for v in row if v == v and v != float("inf")]
    vmax = max(finite, default=0.0)
    cells = [[_shade(v, vmax) for v in row] for row in pooled]
    for e in block.worst:
        r = flat_index(e.output_index, block.output_shape) // grid.row_tile // rt
        c = flat_index(e.input_index, block.input_shape) // grid.col_tile // ct
        if r < len(cells) and c < len(cells[r]):
            cells[r][c] = "×"
    per = (f"a character is the max over {grid.row_tile * rt} output x {grid.col_tile * ct} "
           "input elements" if grid.row_tile * rt * grid.col_tile * ct > 1
           else "a character per element")
    head = (f"|a − n| of '{block.input}' -> {block.output}: input element →, output element ↓; "
            f"{per}; {SHADES[1:]} up to {vmax:.3g} (log scale), × worst")
    return [(head, "dim"), *((f"│{''.join(row)}│", HEATMAP) for row in cells)]


def _shade(value: float, vmax: float) -> str:
    if value != value or value == float("inf"):
        return SHADES[-1]
    if value <= 0 or vmax <= 0 or value <= vmax / 10 ** DECADES:
        return SHADES[0]
    position = (math.log10(value / vmax) + DECADES) / DECADES
    return SHADES[max(1, min(len(SHADES) - 1, 1 + int(position * (len(SHADES) - 1))))]


def flat_index(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for i, size in zip(index, shape):
        flat = flat * size + i
    return flat


def heat_text(text: str) -> Any:
    """A map row as rich Text, each shade in its colour (rich is imported only here)."""
    from rich.text import Text

    line, start = Text(), 0
    for k in range(1, len(text) + 1):  # one span per run of one shade
        if k == len(text) or text[k] != text[start]:
            line.append(text[start:k], style=HEAT_STYLES.get(text[start], "dim"))
            start = k
    return line
