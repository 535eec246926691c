"""Symbolic sizes (-i NxD) and sweeps (--sweep D=15,16,17 or D=awkward): one case per size."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputError
from .inputs import Keyword, TensorSpec

# A size symbol is upper-case (N, D, SEQ_LEN), so 'x' stays the shape separator: NxD, 4xD.
SYMBOL = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Sizes block-wise kernels get wrong: 1, tiny, one below/at/above a block of 16 and of 32.
AWKWARD = (1, 2, 3, 15, 16, 17, 31, 33)
# When a budget trims the awkward set, these go first: the tails past 16 and 32, a full block,
# the degenerate 1, then the rest.
AWKWARD_ORDER = (17, 16, 33, 1, 15, 31, 3, 2)
MAX_CASES = 32   # awkward sizes are trimmed so that a sweep's product stays within this
SWEEP_HELP = ("write --sweep NAME=V1,V2,... (positive integers) or NAME=awkward, with NAME an "
              "upper-case size used in a shape: -i 4xD --sweep D=15,16,17")


@dataclass(frozen=True)
class Sweep:
    """The values one size symbol takes; awkward: from the default set, within the budget."""

    name: str
    values: tuple[int, ...]
    awkward: bool = False


def parse_sweep(text: str) -> Sweep:
    """'D=15,16,17' or 'D=awkward' -> Sweep; InputError naming the bad part otherwise."""
    name, sep, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not raw:
        raise InputError(f"--sweep {text!r}: expected NAME=VALUES", SWEEP_HELP)
    if not SYMBOL.match(name):
        raise InputError(f"--sweep {text!r}: {name!r} is not a size name (upper-case letters, "
                         "digits and _, starting with a letter)", SWEEP_HELP)
    return Sweep(name, *sweep_values(raw, f"--sweep {text!r}"))


def sweep_values(raw: Any, where: str) -> tuple[tuple[int, ...], bool]:
    """(values, awkward) from 'awkward', '15,16,17' or a list of integers."""
    if raw == "awkward":
        return AWKWARD, True
    items = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, (list, tuple)) \
        else [raw]
    values = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit() or int(text) < 1:
            raise InputError(f"{where}: {text!r} is not a positive integer size", SWEEP_HELP)
        values.append(int(text))
    return tuple(dict.fromkeys(values)), False


def symbols_in(specs: Sequence[Any]) -> list[str]:
    """The size symbols used in the shapes of these input specs, in order of first use."""
    found: dict[str, None] = {}
    for spec in _tensor_specs(specs):
        found.update((d, None) for d in spec.shape if isinstance(d, str))
    return list(found)


def _tensor_specs(spec: Any) -> Iterator[TensorSpec]:
    if isinstance(spec, TensorSpec):
        yield spec
    elif isinstance(spec, dict):
        for item in spec.values():
            yield from _tensor_specs(item)
    elif isinstance(spec, (list, tuple)):
        for item in spec:
            yield from _tensor_specs(item)
    elif hasattr(spec, "spec") and not isinstance(spec, str):  # Keyword, Nested
        yield from _tensor_specs(spec.spec)


def substitute(spec: Any, sizes: dict[str, int]) -> Any:
    """The specs with every size symbol replaced by its value (structure kept)."""
    if isinstance(spec, TensorSpec):
        return replace(spec, shape=tuple(sizes.get(d, d) if isinstance(d, str) else d
                                         for d in spec.shape))
    if isinstance(spec, dict):
        return {k: substitute(v, sizes) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(substitute(v, sizes) for v in spec)
    if isinstance(spec, Keyword) or (hasattr(spec, "spec") and hasattr(spec, "name")
                                     and not isinstance(spec, str)):
        return replace(spec, spec=substitute(spec.spec, sizes))
    return spec


def combinations(symbols: Sequence[str], sweeps: Sequence[Sweep], where: str = "--sweep",
                 shapes: dict[str, str] | None = None) -> list[dict[str, int]]:
    """Every combination of the swept sizes (the product), after checking that each symbol has
    values and each sweep names a symbol; awkward sets trimmed to MAX_CASES cases."""
    by_name: dict[str, Sweep] = {}
    for sweep in sweeps:
        if sweep.name in by_name:
            raise InputError(f"{where} {sweep.name} is given twice".strip(),
                             f"give all its values at once: {sweep.name}=15,16,17")
        by_name[sweep.name] = sweep
    missing = [s for s in symbols if s not in by_name]
    if missing:
        shape = (shapes or {}).get(missing[0], "a shape")
        raise InputError(f"size {missing[0]} in {shape} has no value",
                         f"add --sweep {missing[0]}=16 (several: {missing[0]}=15,16,17, or "
                         f"{missing[0]}=awkward); in a spec, sweep: {{{missing[0]}: [15, 16, "
                         "17]}")
    unused = [s.name for s in sweeps if s.name not in symbols]
    if unused:
        used = f"the shapes use {', '.join(symbols)}" if symbols else "no shape uses a size name"
        raise InputError(f"{where} {unused[0]}=...: no input uses the size {unused[0]} "
                         f"({used})".strip(),
                         f"write it in a shape, e.g. -i 4x{unused[0]}, or drop the sweep")
    ordered = [by_name[s] for s in symbols]
    values = _within_budget(ordered)
    return [dict(zip(symbols, combo)) for combo in itertools.product(*values)]


def _within_budget(sweeps: Sequence[Sweep]) -> list[tuple[int, ...]]:
    """Each sweep's values; awkward ones cut (in AWKWARD_ORDER) until the product fits."""
    fixed = 1
    for sweep in sweeps:
        fixed *= 1 if sweep.awkward else len(sweep.values)
    n_awkward = sum(s.awkward for s in sweeps)
    keep = len(AWKWARD)
    while n_awkward and keep > 1 and fixed * keep ** n_awkward > MAX_CASES:
        keep -= 1
    return [tuple(sorted(AWKWARD_ORDER[:keep])) if s.awkward else s.values for s in sweeps]


def label(sizes: dict[str, int]) -> str:
    """'D=17' or 'N=2, D=17': a case's name in the report."""
    return ", ".join(f"{name}={value}" for name, value in sizes.items())


def sweep_cases(specs: Sequence[Any], sweeps: Sequence[Sweep], where: str = "--sweep"
                ) -> list[tuple[str, list[Any]]]:
    """(label, concrete specs) for every combination; [] when nothing is symbolic or swept."""
    symbols = symbols_in(specs)
    if not symbols and not sweeps:
        return []
    shapes = {}
    for spec in _tensor_specs(specs):
        for d in spec.shape:
            shapes.setdefault(d, "shape " + "x".join(map(str, spec.shape)))
    return [(label(sizes), [substitute(s, sizes) for s in specs])
            for sizes in combinations(symbols, sweeps, where, shapes)]

