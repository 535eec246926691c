"""Turn vs_gradcheck.py's measurements into the goals of issue 5 and markdown tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SLOW, FULL, FAST, PROBE, AUTO, API = ("gradcheck slow", "gradtool full", "gradcheck fast",
                                      "gradtool probe", "gradtool auto",
                                      "gradtool.check (API, auto)")


def _ratio(row: dict[str, Any], theirs: str, ours: str) -> float | None:
    tools = row["tools"]
    if theirs not in tools or ours not in tools:
        return None
    return tools[theirs]["median_s"] / tools[ours]["median_s"]


def _goal(text: str, met: bool | None, detail: str) -> dict[str, Any]:
    return {"goal": text, "met": met, "detail": detail}


def goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of the issue: met (True/False) or not measured in this run (None)."""
    rows = {r["workload"]: r for r in data["speed"]}
    out = []
    for name, need in (("Linear (64, 64, 64)", 10), ("elementwise 10000", 10),
                       ("Linear (20, 20, 30)", 5)):
        r = _ratio(rows[name], SLOW, FULL) if name in rows else None
        out.append(_goal(f"full mode >= {need}x faster than gradcheck slow on {name}",
                         None if r is None else r >= need,
                         "slow mode not run here" if r is None else f"{r:.1f}x"))
    big = rows.get("Linear (128, 128, 128)")
    seconds = big["tools"][FULL]["median_s"] if big else None
    out.append(_goal("full mode on Linear (128, 128, 128) within 15 s",
                     None if seconds is None else seconds <= 15,
                     "not run (--quick)" if seconds is None else f"{seconds:.1f} s"))
    first = [r for r in data["speed"] if r["check"] == "gradient"]
    ran = [(r["workload"], _ratio(r, SLOW, FULL)) for r in first if SLOW in r["tools"]]
    worst = min(ran, key=lambda x: x[1]) if ran else None
    out.append(_goal("full mode never slower than gradcheck slow (every size slow mode ran)",
                     None if worst is None else worst[1] >= 1,
                     "" if worst is None else f"lowest speed-up {worst[1]:.1f}x ({worst[0]})"))
    for name, mem in data["memory"].items():
        extra = mem.get("extra_bytes")
        limit = 8.0 * mem["n_in_x_n_out"]
        out.append(_goal(f"full mode extra memory <= 8 B x n_in x n_out on {name}",
                         None if extra is None else extra <= limit,
                         mem.get("error", f"{_mb(extra)} vs {_mb(limit)}")))
    out += _probe_goals(data, first)
    out += _double_goals(data)
    start = data["startup"]
    out.append(_goal("no sympy import during a check", not start["sympy_imported_by_check"], ""))
    gap = start["check_minus_import_torch_s"]
    out.append(_goal("cold `gradtool check` of a tiny Function within 0.15 s of `import torch`",
                     gap <= 0.15, f"+{gap:.2f} s"))
    return out


def _probe_goals(data: dict[str, Any], first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in data["seed_rates"]:
        if row["bug"] == "correct":
            out.append(_goal(f"probe: no false failure on the correct twin, {row['workload']}",
                             row["gradtool probe flagged"] == 0,
                             f"{row['gradtool probe flagged']} / {row['seeds']} seeds flagged"))
        else:
            rate = row["gradtool probe flagged"] / row["seeds"]
            out.append(_goal(f"probe catches '{row['bug']}' at {row['workload']} in >= 99% of "
                             "seeds", rate >= 0.99, f"{rate:.0%} of {row['seeds']} seeds "
                             f"(gradcheck fast: {row['gradcheck fast flagged']})"))
    twins = [d for d in data["detection"] if d["bug"] == "correct"]
    false = [f"{d['workload']}: {k}" for d in twins for k, v in d["flagged"].items()
             if v and k.startswith("gradtool")]
    out.append(_goal("no false failure by gradtool on the correct twins (every mode)",
                     not false, ", ".join(false)))
    missed = [f"{d['workload']} {d['bug']}: {k}" for d in data["detection"]
              if d["bug"] != "correct" for k, v in d["flagged"].items()
              if not v and k.startswith("gradtool")]
    out.append(_goal("every seeded bug caught by every gradtool mode", not missed,
                     ", ".join(missed)))
    calls = [(r["tools"][PROBE]["forward"], r["tools"][PROBE]["backward"]) for r in first]
    out.append(_goal("probe: fixed calls whatever the size, <= 8 forward and <= 8 backward",
                     len(set(calls)) == 1 and max(max(c) for c in calls) <= 8,
                     f"forward/backward evaluations seen: {sorted(set(calls))}"))
    small = [(r["workload"], _ratio(r, FAST, PROBE)) for r in first if r["n_in"] <= 10_000]
    worst = min(small, key=lambda x: x[1])
    out.append(_goal("probe >= 2x faster than gradcheck fast for n_in <= 1e4", worst[1] >= 2,
                     f"lowest {worst[1]:.2f}x ({worst[0]})"))
    every = [(r["workload"], _ratio(r, FAST, PROBE)) for r in first]
    worst = min(every, key=lambda x: x[1])
    out.append(_goal("probe never more than 1.25x slower than gradcheck fast",
                     worst[1] >= 0.8, f"lowest {worst[1]:.2f}x ({worst[0]})"))
    return out


def _double_goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in data["speed"]:
        if row["check"] != "double_backward" or row["n_out"] < 1000:
            continue
        for mode in (FULL, PROBE):
            slow, fast = _ratio(row, SLOW, mode), _ratio(row, FAST, mode)
            out.append(_goal(f"{mode} >= 100x faster than gradgradcheck slow, {row['workload']}",
                             None if slow is None else slow >= 100,
                             "slow not run" if slow is None else f"{slow:.0f}x"))
            out.append(_goal(f"{mode} at least as fast as gradgradcheck fast, {row['workload']}",
                             fast >= 1, f"{fast:.2f}x"))
    caught = [d for d in data["detection"] if d["bug"] == "detached backward"]
    out.append(_goal("detached backward caught by every gradtool mode",
                     all(v for d in caught for k, v in d["flagged"].items()
                         if k.startswith("gradtool")), ""))
    return out


def _mb(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MB"


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def _cell(row: dict[str, Any], tool: str, fmt: Callable[[dict[str, Any]], str]) -> str:
    t = row["tools"].get(tool)
    if t is None:
        est = row["gradcheck_slow_estimate"]
        return f"not run: {row['gradcheck_slow_skipped']}; est. {est['seconds']:.3g} s"
    return fmt(t)


def _x(value: float | None) -> str:
    return "—" if value is None else f"**{value:.1f}×**" if value >= 10 else f"{value:.2f}×"


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores (shared, load average "
             f"{', '.join(f'{x:.1f}' for x in m['load_average'])} at the start), "
             f"torch {m['torch']} CPU, Python {m['python']}, float64, "
             f"torch.set_num_threads({m['threads']}); medians of interleaved repeats"
             f"{' (--quick)' if data['quick'] else ''}.", ""]
    for check, theirs in (("gradient", "gradcheck"), ("double_backward", "gradgradcheck")):
        lines += [f"### {'First order' if check == 'gradient' else 'Double backward'} "
                  f"(vs {theirs})", "",
                  f"| workload | n_in × n_out | {theirs} slow | gradtool full | speed-up | "
                  f"{theirs} fast | gradtool probe | speed-up | gradtool auto | API call |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in data["speed"] if r["check"] == check):
            auto = r["tools"][AUTO]
            lines.append(
                f"| {r['workload']} | {r['n_in']} × {r['n_out']} | "
                f"{_cell(r, SLOW, lambda t: _s(t['median_s']))} | "
                f"{_s(r['tools'][FULL]['median_s'])} | {_x(_ratio(r, SLOW, FULL))} | "
                f"{_s(r['tools'][FAST]['median_s'])} | {_s(r['tools'][PROBE]['median_s'])} | "
                f"{_x(_ratio(r, FAST, PROBE))} | {_s(auto['median_s'])} ({auto['mode']}) | "
                f"{_s(r['tools'][API]['median_s'])} |")
        lines += ["", f"Forward / backward evaluations ({theirs} counted at the Function, "
                  "gradtool's own count of evaluations, batched ones included):", "",
                  f"| workload | {theirs} slow | gradtool full | {theirs} fast | gradtool probe |",
                  "|---|---|---|---|---|"]
        for r in (r for r in data["speed"] if r["check"] == check):
            est = r["gradcheck_slow_estimate"]
            fb = (lambda t: f"{t['forward']} / {t['backward']}")
            slow = (fb(r["tools"][SLOW]) if SLOW in r["tools"] else
                    f"~{est['forward']} / ~{est['backward']} (est.)")
            lines.append(f"| {r['workload']} | {slow} | {fb(r['tools'][FULL])} | "
                         f"{fb(r['tools'][FAST])} | {fb(r['tools'][PROBE])} |")
        lines.append("")
    lines += _detection_md(data) + _other_md(data)
    return "\n".join(lines)


def _detection_md(data: dict[str, Any]) -> list[str]:
    lines = ["### Detection of seeded bugs (✓ flagged, · passed)", "",
             "| workload | bug | gradtool full | gradtool probe | gradtool auto | "
             "gradcheck slow | gradcheck fast |", "|---|---|---|---|---|---|---|"]
    for d in data["detection"]:
        f = d["flagged"]
        mark = (lambda k: "—" if k not in f else "✓" if f[k] else "·")
        lines.append(f"| {d['workload']} | {d['bug']} | {mark(FULL)} | {mark(PROBE)} | "
                     f"{mark(AUTO)} | {mark(SLOW)} | {mark(FAST)} |")
    lines += ["", "Probe screening over seeds (flagged / seeds):", "",
              "| workload | bug | gradtool probe | gradcheck fast |", "|---|---|---|---|"]
    for r in data["seed_rates"]:
        lines.append(f"| {r['workload']} | {r['bug']} | {r['gradtool probe flagged']} / "
                     f"{r['seeds']} | {r['gradcheck fast flagged']} / {r['seeds']} |")
    return lines + [""]


def _other_md(data: dict[str, Any]) -> list[str]:
    lines = ["### Memory (full mode, extra peak RSS in a fresh process) and start-up", "",
             "| workload | extra peak | 8 B × n_in × n_out |", "|---|---|---|"]
    for name, mem in data["memory"].items():
        lines.append(f"| {name} | {mem.get('error') or _mb(mem['extra_bytes'])} | "
                     f"{_mb(8.0 * mem['n_in_x_n_out'])} |")
    lines += ["", "| cold start (fresh process) | median |", "|---|---|"]
    for name, seconds in data["startup"]["median_s"].items():
        lines.append(f"| `{name}` | {_s(seconds)} |")
    lines += ["", "### Goals", ""]
    for g in data["goals"]:
        box = {True: "met", False: "**MISSED**", None: "not measured"}[g["met"]]
        lines.append(f"- {box}: {g['goal']}" + (f" — {g['detail']}" if g["detail"] else ""))
    return lines
