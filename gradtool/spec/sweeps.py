"""A spec's sweep: key: the values of its size symbols, one case per combination."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import InputError
from ..targets.sizes import SYMBOL as _SIZE
from .yaml_lines import LineDict, line_of, plain, show

ErrorSink = Callable[..., None]   # error(message, key, line, hint=None), as values.py's


def read_sweep(data: LineDict, key: str, error: ErrorSink) -> tuple[Any, ...]:
    """sweep: {D: [15, 16, 17]} or {D: awkward} -> targets/sizes.py Sweeps (() when absent)."""
    from ..targets.sizes import SWEEP_HELP, Sweep, sweep_values

    if "sweep" not in data:
        return ()
    value, where = data["sweep"], f"{key}.sweep" if key else "sweep"
    if not isinstance(value, LineDict) or not value:
        error(f"expected a mapping of size names to values, e.g. {{D: [15, 16, 17]}} or "
              f"{{D: awkward}}, got {show(value)}", where, line_of(data, "sweep"))
        return ()
    out = []
    for name, raw in value.items():
        line = line_of(value, name, line_of(data, "sweep"))
        if not isinstance(name, str) or not _SIZE.match(name):
            error(f"{show(name)} is not a size name (upper-case, as in shape: [4, D])",
                  f"{where}.{name}", line, SWEEP_HELP)
            continue
        try:
            values, awkward = sweep_values(plain(raw), f"sweep {name}")
        except InputError as exc:
            error(exc.message, f"{where}.{name}", line, exc.hint)
            continue
        out.append(Sweep(name, values, awkward))
    return tuple(out)


def swept(cases: tuple[Any, ...], data: LineDict, key: str, error: ErrorSink) -> tuple[Any, ...]:
    """Each case once per combination of the sizes in sweep: (labels 'D=17'), checked here so
    that a size without values, or values for no size, is an error at its file:line."""
    from ..targets.sizes import sweep_cases

    sweeps = read_sweep(data, key, error)
    out = []
    for case in cases:
        try:
            found = sweep_cases(case.inputs, sweeps, "")
        except InputError as exc:
            line = line_of(data, "sweep", line_of(data, "inputs", line_of(data, "cases")))
            error(exc.message, f"{key}.sweep" if key else "sweep", line, exc.hint)
            return cases
        prefix = "" if case.label == "case 0" else f"{case.label} "
        out += [replace(case, label=prefix + label, inputs=tuple(specs))
                for label, specs in found] or [case]
    return tuple(out)
