"""A self-contained HTML page of a Report: summary, every check, heat maps of failing blocks."""

from __future__ import annotations

import math
from html import escape

from ..results import Block, CaseResult, CheckResult, ErrorGrid, Outcome, Report, TargetResult
from .terminal import flat_index, summary_line
from .words import block_lines, other_label, relative, time_text

# ColorBrewer's OrRd, light to dark: level 0 is "no error" (below the scale's floor).
PALETTE = ("#f4f4f4", "#fee8c8", "#fdd49e", "#fdbb84", "#fc8d59", "#ef6548", "#d7301f",
           "#b30000", "#7f0000")
INF_COLOUR = "#000000"
DECADES = 6        # the colour scale spans this many powers of ten below the block's maximum
MAP_PIXELS = 320   # the longer side of a heat map, about
OUTCOME_COLOUR = {
    Outcome.PASSED: "#1a7f37", Outcome.FAILED: "#cf222e", Outcome.ERROR: "#cf222e",
    Outcome.SKIPPED: "#9a6700", Outcome.INCONCLUSIVE: "#bc4c00", Outcome.XFAILED: "#9a6700",
    Outcome.XPASSED: "#cf222e",
}

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1f2328;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}h3{font-size:1em}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:2px 8px;text-align:left;
vertical-align:top;font-size:.9em}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
.badge{color:#fff;border-radius:3px;padding:0 6px;font-weight:600;font-size:.85em}
.block{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start;margin:.8em 0}
.heatmap{margin:0;display:flex;gap:1em;flex-wrap:wrap}
.heatmap figcaption{font-size:.8em;max-width:340px}
.why{max-width:420px;font-size:.9em}.diag{font-weight:600}
.nomap{font-style:italic;color:#57606a}
""" + "".join(f".l{k}{{fill:{c}}}" for k, c in enumerate(PALETTE)) + f".li{{fill:{INF_COLOUR}}}"


def render_html(report: Report, title: str = "gradtool report") -> str:
    """The whole page; no script, no stylesheet or image from elsewhere (it works offline)."""
    body = [f"<h1>{escape(title)}</h1>", _summary(report), _index(report)]
    for target in report.targets:
        for case in target.cases:
            for check in case.checks:
                if check.outcome not in (Outcome.PASSED, Outcome.SKIPPED, Outcome.XFAILED):
                    body.append(_check_section(target, case, check))
    body += [_reproducers(report), _config(report)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(part for part in body if part) + "\n</body></html>\n")


def anchor(target: TargetResult, case: CaseResult, check: CheckResult) -> str:
    """A stable id for a check's section (targets and cases may hold any characters)."""
    raw = f"{target.target}-{case.label}-{check.name}"
    return "c-" + "".join(ch if ch.isalnum() else "-" for ch in raw)


def _badge(outcome: Outcome) -> str:
    return (f'<span class="badge" style="background:{OUTCOME_COLOUR[outcome]}">'
            f"{outcome.value}</span>")


def _summary(report: Report) -> str:
    text, _ = summary_line(report)
    lines = [f"<p><strong>{escape(text)}</strong></p>", f"<p>{escape(time_text(report))}</p>"]
    lines += [f"<p>rejected <code>{escape(r.source)}</code>: {escape(r.message)}</p>"
              for r in report.rejected]
    if report.not_run:
        lines.append(f"<p>not run ({escape(str(report.interrupted or 'interrupted'))}): "
                     f"{escape(', '.join(report.not_run))}</p>")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.versions.items()))
    lines.append(f"<p>{escape(versions)}</p>")
    return "\n".join(lines)


def _index(report: Report) -> str:
    rows = ["<table><tr><th>target</th><th>case</th><th>check</th><th>outcome</th>"
            "<th>time</th><th>summary</th></tr>"]
    for target, case, check in report.checks():
        name = escape(check.name)
        if check.outcome not in (Outcome.PASSED, Outcome.SKIPPED, Outcome.XFAILED):
            name = f'<a href="#{anchor(target, case, check)}">{name}</a>'
        rows.append(f"<tr><td><code>{escape(target.target)}</code></td>"
                    f"<td>{escape(case.label)}</td><td>{name}</td>"
                    f"<td>{_badge(check.outcome)}</td><td>{check.duration_s:.2f}s</td>"
                    f"<td>{escape(check.summary)}</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _check_section(target: TargetResult, case: CaseResult, check: CheckResult) -> str:
    parts = [f'<section id="{anchor(target, case, check)}">',
             f"<h2>{_badge(check.outcome)} <code>{escape(target.target)}</code> "
             f"{escape(check.name)} <small>({escape(case.label)}, seed {case.seed})</small></h2>"]
    if case.inputs:
        inputs = ", ".join(f"{i.name} {i.description}" for i in case.inputs)
        parts.append(f"<p>inputs: <code>{escape(inputs)}</code></p>")
    parts.append(f"<p>{escape(check.summary)}</p>")
    for block in check.blocks:
        if block.mismatched:
            parts.append(_block(block, check))
    extra = [*check.details]
    if check.mode:
        extra.append(f"mode: {check.mode} ({check.mode_reason})")
    if check.source:
        extra.append(f"look at: {relative(check.source)}")
    extra += [f"{f.severity.value} {f.rule}: {f.message}" for f in check.findings]
    if extra:
        parts.append("<ul>" + "".join(f"<li>{escape(e)}</li>" for e in extra) + "</ul>")
    if check.traceback:
        parts.append(f"<pre>{escape(check.traceback)}</pre>")
    if case.reproduce:
        parts.append(f"<p>reproduce:</p><pre>{escape(case.reproduce)}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def _block(block: Block, check: CheckResult) -> str:
    text = "\n".join(block_lines(block, check.tolerance, other_label(check), mode=check.mode))
    if block.grid is None:
        why = ("probe mode compares random projections, so no full block was computed: no heat "
               "map (rerun with --mode full on smaller inputs to see one)"
               if check.mode == "probe" or not block.exhaustive and check.mode != "full" else
               "no whole block was evaluated for this comparison (too large to evaluate whole "
               "on failure, stopped at its first confirmed failure for cost, or a check "
               "comparing other quantities): no heat map")
        picture = f'<p class="nomap">{escape(why)}</p>'
    else:
        picture = _figure(block, block.grid)
    diagnosis = (f'<p class="diag">diagnosis: {escape(block.diagnosis)}</p>'
                 if block.diagnosis else "")
    return (f'<div class="block">{picture}<div class="why">{diagnosis}'
            f"<pre>{escape(text)}</pre></div></div>")


def _figure(block: Block, grid: ErrorGrid) -> str:
    """Both maps of one block in one figure (the unit a reader, and a test, counts)."""
    tiles = (f"each cell the max over {grid.row_tile} output x {grid.col_tile} input elements"
             if grid.row_tile * grid.col_tile > 1 else "one cell per element")
    caption = (f"<code>{escape(block.output)}</code> {grid.n_rows} elements (rows) by input "
               f"<code>{escape(block.input)}</code> {grid.n_cols} elements (columns), flattened "
               f"row-major; {tiles}; circles: the worst elements")
    maps = [_svg(grid, grid.abs_diff, "|analytical − numerical|", block),
            _svg(grid, grid.rel_diff, "relative error |a − n| / max(|n|, atol)", block)]
    return (f'<figure class="heatmap" data-input="{escape(block.input)}" '
            f'data-output="{escape(block.output)}">{"".join(maps)}'
            f"<figcaption>{caption}</figcaption></figure>")


def _svg(grid: ErrorGrid, values: tuple[tuple[float, ...], ...], what: str, block: Block) -> str:
    rows, cols = len(values), len(values[0]) if values else 0
    cell = max(2, min(24, MAP_PIXELS // max(1, rows, cols)))
    top, left = 18, 4
    width, height = left + cols * cell + 4, top + rows * cell + 34
    vmax = max((v for row in values for v in row if math.isfinite(v)), default=0.0)
    shapes = [f'<rect x="{left}" y="{top}" width="{cols * cell}" height="{rows * cell}" '
              'class="l0"/>']
    for r, row in enumerate(values):
        shapes += _row_runs(row, r, cell, top, left, vmax)
    shapes += _markers(block, grid, cell, top, left)
    legend = (f"grey: 0 or below {vmax / 10 ** DECADES:.2g}; darkest: {vmax:.3g}"
              + ("; black: inf/NaN" if any(not math.isfinite(v) for row in values for v in row)
                 else "") if vmax > 0 else "all zero")
    return (f'<svg width="{width}" height="{height}" '
            f'role="img"><title>{escape(what)}</title>'
            f'<text x="{left}" y="12" font-size="11">{escape(what)}</text>'
            + "".join(shapes)
            + f'<text x="{left}" y="{top + rows * cell + 14}" font-size="10">input element →  '
              f"(output element ↓)</text>"
            f'<text x="{left}" y="{top + rows * cell + 28}" font-size="10">'
            f"{escape(legend)}</text></svg>")


def level(value: float, vmax: float) -> int:
    """The palette index of a value on a log scale of DECADES below vmax (-1: inf or NaN)."""
    if not math.isfinite(value):
        return -1
    if value <= 0 or vmax <= 0:
        return 0
    position = (math.log10(value / vmax) + DECADES) / DECADES  # 0 at the floor, 1 at vmax
    if position <= 0:
        return 0
    top = len(PALETTE) - 1
    return max(1, min(top, 1 + int(position * top)))


def _row_runs(row: tuple[float, ...], r: int, cell: int, top: int, left: int,
              vmax: float) -> list[str]:
    """One rect per run of equal colour in a row (the page stays small); level 0 is the
    background already."""
    out, c = [], 0
    while c < len(row):
        k = level(row[c], vmax)
        end = c + 1
        while end < len(row) and level(row[end], vmax) == k:
            end += 1
        if k:
            cls = "li" if k < 0 else f"l{k}"
            out.append(f'<rect x="{left + c * cell}" y="{top + r * cell}" '
                       f'width="{(end - c) * cell}" height="{cell}" class="{cls}"/>')
        c = end
    return out


def _markers(block: Block, grid: ErrorGrid, cell: int, top: int, left: int) -> list[str]:
    out = []
    for e in block.worst:
        row = flat_index(e.output_index, block.output_shape) // grid.row_tile
        col = flat_index(e.input_index, block.input_shape) // grid.col_tile
        tip = (f"{e.input}{list(e.input_index)} -> {e.output}{list(e.output_index)}: "
               f"analytical {e.analytical:.6g}, numerical {e.numerical:.6g}")
        out.append(f'<circle cx="{left + col * cell + cell / 2}" cy="{top + row * cell + cell / 2}"'
                   f' r="{max(3, cell * 0.45):.1f}" fill="none" stroke="#0969da" '
                   f'stroke-width="2"><title>{escape(tip)}</title></circle>')
    return out


def _reproducers(report: Report) -> str:
    if not report.reproducers:
        return ""
    rows = ["<h2>Minimal reproducers (--repro)</h2><ul>"]
    for r in report.reproducers:
        note = f" ({r.note})" if r.note else ""
        rows.append(f"<li><code>{escape(r.path)}</code>: <code>{escape(r.target)}</code> "
                    f"{escape(r.check)}, {escape(r.finding)}: shrunk {escape(r.shrunk_from)} → "
                    f"{escape(r.shrunk_to)} in {r.checks_run} checks{escape(note)}</li>")
    return "\n".join(rows) + "</ul>"


def _config(report: Report) -> str:
    rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>"
                   for k, v in sorted(report.config.items()))
    return f"<details><summary>settings</summary><table>{rows}</table></details>"
