"""Typed readers for a spec's values: inputs (tensors, literals), cases, settings, references."""

from __future__ import annotations

import ast
import functools
import keyword
import math
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config.settings import CHECK_NAMES, DTYPES, MODES
from ..errors import InputError, SpecError, did_you_mean
from ..targets.inputs import (
    COMPLEX_DTYPES,
    DOMAINS,
    INTEGER_DTYPES,
    Domain,
    LiteralSpec,
    TensorSpec,
    parse_input,
    validate_tensor_spec,
)
from ..targets.values import Keyword, Nested
from .sweeps import swept  # noqa: F401 - schema reads it from here
from .yaml_lines import LineDict, LineList, line_of, plain, show

InputSpec = TensorSpec | LiteralSpec
ErrorSink = Callable[..., None]   # error(message, key, line, hint=None)

INPUT_KEYS = ("name", "shape", "dtype", "domain", "requires_grad", "value", "tangent")
TANGENT_NAMES = ("sym", "free")  # a declared projection; free: none, even for sym/spd
TENSOR_DTYPES = (*DTYPES, *COMPLEX_DTYPES, *INTEGER_DTYPES)
NAMED_DOMAINS = tuple(d for d in DOMAINS if d != "range")
MAX_NUMEL = 1_000_000   # a gradient check of a bigger tensor is not what a spec is for
_SIZE = re.compile(r"^[A-Z][A-Z0-9_]*$")   # a size symbol, as in --input's NxD
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu)(:\d+)?$")
_SHAPE_HELP = "expected a list of non-negative integers such as [3, 4] ([] for a 0-d tensor)"


class InputReader:
    """Reads `inputs:` lists and case overrides, reporting each problem through `error`."""

    def __init__(self, error: ErrorSink) -> None:
        self.error = error

    def read_list(self, value: Any, key: str, line: int | None) -> list[InputSpec] | None:
        if not isinstance(value, LineList):
            self.error("expected a list of inputs, one per forward argument in order, got "
                       f"{show(value)}", key, line)
            return None
        specs = [self.read_item(item, f"{key}[{i}]", value.item_lines[i])
                 for i, item in enumerate(value)]
        if any(s is None for s in specs):
            return None
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            if spec.name is not None and spec.name in seen:
                self.error(f"duplicate input name {spec.name!r}", f"{key}[{i}]",
                           value.item_lines[i])
                return None
            seen.add(spec.name or "")
        return specs  # type: ignore[return-value]

    def read_item(self, item: Any, key: str, line: int) -> InputSpec | None:
        if isinstance(item, LineDict) and "name" in item:
            name = self.name(item["name"], f"{key}.name", line_of(item, "name", line))
            return self.fields(item, key, line, name, None) if name else None
        if isinstance(item, LineDict) and len(item) == 1 and next(iter(item)) not in INPUT_KEYS:
            ((name, desc),) = item.items()
            if not self.name(name, key, line):
                return None
            return self.describe(desc, f"{key}.{name}", line_of(item, name, line), name, None)
        if isinstance(item, LineDict):
            self.error(f"an input is {{name: x, shape: [3, 4], ...}}, {{name: c, value: 5}} or a "
                       f"one-key shorthand {{x: '3x4:positive'}}; got {show(item)}", key, line,
                       "add name:" if set(item) <= set(INPUT_KEYS) else None)
            return None
        return self.describe(item, key, line, None, None)

    def read_case(self, value: Any, base: list[InputSpec] | None, key: str,
                  line: int | None) -> list[InputSpec] | None:
        if value is None and base is not None:
            return list(base)
        if isinstance(value, LineList):
            return self.read_list(value, key, line)
        if not isinstance(value, LineDict) or base is None:
            self.error("expected a list of inputs, or a mapping {input name: new description} "
                       f"overriding the spec's inputs, got {show(value)}", key, line)
            return None
        result, names = list(base), [s.name for s in base]
        for name, desc in value.items():
            if name not in names:
                known = [n or "" for n in names]
                self.error(f"no input named {show(name)}; the spec's inputs are {names}",
                           f"{key}.{name}", line_of(value, name), did_you_mean(str(name), known))
                return None
            index = names.index(name)
            spec = self.describe(desc, f"{key}.{name}", line_of(value, name), name, base[index])
            if spec is None:
                return None
            result[index] = spec
        return result

    def name(self, value: Any, key: str, line: int | None) -> str | None:
        if not isinstance(value, str) or not value.isidentifier():
            self.error(f"expected an input name (a Python identifier), got {show(value)}",
                       key, line)
            return None
        return value

    def describe(self, desc: Any, key: str, line: int | None, name: str | None,
                 base: InputSpec | None) -> InputSpec | None:
        """A shorthand: field mapping, shape list, --input mini-language string, or a literal."""
        if isinstance(desc, LineDict):
            return self.fields(desc, key, line, name, base)
        if isinstance(desc, LineList):
            shape = self.shape(desc, key, line)
            if shape is None:
                return None
            # In a case override a bare shape keeps the input's dtype and domain.
            spec = replace(base, shape=shape) if isinstance(base, TensorSpec) else TensorSpec(shape)
            return self.finish(replace(spec, name=name), key, line)
        if isinstance(desc, str):
            try:
                parsed = parse_input(desc)
            except InputError as exc:
                self.error(exc.message.replace("--input ", "", 1), key, line, exc.hint)
                return None
            if isinstance(parsed, Keyword):
                self.error(f"{desc!r}: NAME=SPEC is the command line's keyword form; in a spec "
                           "list keyword arguments under kwargs:", key, line)
                return None
            if isinstance(parsed, (tuple, list, dict)):
                return Nested(name, parsed) if name else parsed  # type: ignore[return-value]
            spec = replace(parsed, name=name)
            return self.finish(spec, key, line) if isinstance(spec, TensorSpec) else spec
        if desc is None or isinstance(desc, (bool, int, float)):
            return LiteralSpec(desc, name)
        self.error(f"expected an input description, got {show(desc)}", key, line)
        return None

    def fields(self, item: LineDict, key: str, line: int | None, name: str | None,
               base: InputSpec | None) -> InputSpec | None:
        for field in item:
            if field not in INPUT_KEYS:
                self.error(f"unknown key {show(field)}; an input takes {', '.join(INPUT_KEYS)}",
                           f"{key}.{field}", line_of(item, field, line),
                           did_you_mean(str(field), INPUT_KEYS))
                return None
        if "value" in item:
            extra = [f for f in item if f not in ("name", "value")]
            if extra:
                self.error(f"a literal input takes only name: and value:, not {extra[0]}:",
                           f"{key}.{extra[0]}", line_of(item, extra[0], line))
                return None
            return LiteralSpec(plain(item["value"]), name)
        start = base if isinstance(base, TensorSpec) else None
        if "shape" not in item and start is None:
            self.error("missing shape: (a tensor) or value: (a literal)", key, line)
            return None
        spec = start or TensorSpec(())
        changes = {f: self.field(f, item[f], f"{key}.{f}", line_of(item, f, line))
                   for f in ("shape", "dtype", "domain", "requires_grad", "tangent") if f in item}
        if any(v is None for v in changes.values()):
            return None
        return self.finish(replace(spec, name=name, **changes), key, line)

    def field(self, field: str, value: Any, key: str, line: int | None) -> Any:
        if field == "shape":
            return self.shape(value, key, line)
        if field == "domain":
            return self.domain(value, key, line)
        if field == "tangent":
            if value in TANGENT_NAMES:
                return value
            self.error(f"expected a tangent space ({', '.join(TANGENT_NAMES)}), got {show(value)}",
                       key, line, did_you_mean(str(value), TANGENT_NAMES))
            return None
        if field == "dtype":
            if value in TENSOR_DTYPES:
                return value
            self.error(f"expected a dtype ({', '.join(TENSOR_DTYPES)}), got {show(value)}", key,
                       line, did_you_mean(str(value), TENSOR_DTYPES))
            return None
        if isinstance(value, bool):
            return value
        self.error(f"expected true or false, got {show(value)}", key, line)
        return None

    def shape(self, value: Any, key: str, line: int | None) -> tuple[int, ...] | None:
        # Only a list: the mini-language ('3x4') is the shorthand form's job, not shape:'s.
        if isinstance(value, LineList) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0
                or isinstance(d, str) and _SIZE.match(d) for d in value):  # D: sweep: fills it
            return tuple(value)
        self.error(f"{_SHAPE_HELP}, got {show(value)}", key, line)
        return None

    def domain(self, value: Any, key: str, line: int | None) -> Domain | None:
        if isinstance(value, str) and value in NAMED_DOMAINS:
            return Domain(value)
        kind, bounds = "range", value
        if isinstance(value, LineDict) and len(value) == 1 and next(iter(value)) in ("range",
                                                                                     "integer"):
            kind, bounds = next(iter(value.items()))
        if isinstance(bounds, LineList) and len(bounds) == 2:
            lo, hi = (number(b) for b in bounds)
            if lo is not None and hi is not None and lo < hi:
                return Domain(kind, lo, hi)
        hint = did_you_mean(value, NAMED_DOMAINS) if isinstance(value, str) else None
        self.error(f"expected a domain ({', '.join(NAMED_DOMAINS)}), [lo, hi] with lo < hi, or "
                   f"{{integer: [lo, hi]}}, got {show(value)}", key, line, hint)
        return None

    def finish(self, spec: TensorSpec, key: str, line: int | None) -> TensorSpec | None:
        try:  # a size symbol is checked with its sweep's values, once they are known
            validate_tensor_spec(replace(spec, shape=_sized(spec.shape)))
        except InputError as exc:
            self.error(exc.message, key, line, exc.hint)
            return None
        if math.prod(_sized(spec.shape)) > MAX_NUMEL:
            self.error(f"shape {list(spec.shape)} has {math.prod(spec.shape)} elements; a spec "
                       f"input may have at most {MAX_NUMEL}", key, line)
            return None
        return spec


def _sized(shape: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(1 if isinstance(d, str) else d for d in shape)


def number(value: Any) -> float | None:
    """A finite float from a YAML number or numeric string (YAML 1.1 reads 1e-5 as a string)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    return result if math.isfinite(result) else None


def read_setting(name: str, value: Any, key: str, line: int | None, error: ErrorSink) -> Any:
    """Validate one spec-level check setting; report and return None when it is bad."""
    choices = {"dtype": DTYPES, "mode": MODES, "autocast": ("float16", "bfloat16")}.get(name)
    if choices is not None:
        if value in choices:
            return value
        error(f"expected one of {', '.join(choices)}, got {show(value)}", key, line,
              did_you_mean(str(value), choices))
        return None
    if name == "device":
        if isinstance(value, str) and _DEVICE.match(value):
            return value
        error(f"expected a device such as cpu, cuda or cuda:1, got {show(value)}", key, line)
        return None
    if name == "checks":
        return _checks(value, key, line, error)
    if name == "ignore":
        return _rule_ids(value, key, line, error)
    if name == "masked":
        if isinstance(value, bool):
            return value
        error(f"expected true or false, got {show(value)}", key, line)
        return None
    parsed = number(value)
    if parsed is None or parsed < 0 or (name == "eps" and parsed == 0):
        what = "a positive" if name == "eps" else "a non-negative"
        error(f"expected {what} number such as 1.0e-6, got {show(value)}", key, line)
        return None
    return parsed


def _rule_ids(value: Any, key: str, line: int | None, error: ErrorSink
              ) -> tuple[str, ...] | None:
    """ignore: [contract.broadcast_gradient]: rule ids to silence, each a registered one."""
    from ..config.registry import RULE_IDS, RULES

    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        error(f"expected a list of rule ids, got {show(value)}", key, line)
        return None
    for i, item in enumerate(items):
        if item not in RULE_IDS:
            error(f"unknown rule id {show(item)}; `gradtool list` shows the rule ids",
                  f"{key}[{i}]", line_of(items, i, line), did_you_mean(str(item), RULE_IDS))
            return None
        if RULES[item].unsilenceable:
            error(f"rule {item} cannot be ignored: {RULES[item].unsilenceable}", f"{key}[{i}]",
                  line_of(items, i, line))
            return None
    return tuple(items)


def _checks(value: Any, key: str, line: int | None, error: ErrorSink) -> tuple[str, ...] | None:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        error(f"expected a list of checks among {', '.join(CHECK_NAMES)}, got {show(value)}",
              key, line)
        return None
    for i, item in enumerate(items):
        if item not in CHECK_NAMES:
            error(f"unknown check {show(item)}; checks are {', '.join(CHECK_NAMES)}",
                  f"{key}[{i}]", line_of(items, i, line), did_you_mean(str(item), CHECK_NAMES))
            return None
        if item in items[:i]:
            error(f"check {item!r} is listed twice", f"{key}[{i}]", line_of(items, i, line))
            return None
    return tuple(items)


# --- references: where a target or an oracle may come from ------------------------------------

# Importable by name only if NOT in the standard library (os, sys, subprocess, builtins, ...: none
# of it is a gradient to check) and not one of these third-party entry points to files or code.
DENIED_MODULES = frozenset({
    "torch.hub", "torch.package", "torch.serialization", "torch.jit", "torch.onnx", "torch.export",
    "torch.utils.cpp_extension", "torch.multiprocessing", "torch.distributed", "numpy.ctypeslib",
    "numpy.f2py", "numpy.distutils", "numpy.lib.npyio", "yaml", "pickle5", "dill", "cloudpickle",
    "joblib", "setuptools", "pkg_resources", "pip", "pytest", "IPython", "gradtool",
    "torch._inductor", "torch._dynamo", "torch._export", "torch._C._jit", "_pytest",
})
DENIED_NAMES = frozenset({
    "eval", "exec", "execfile", "compile", "open", "input", "breakpoint", "getattr", "setattr",
    "delattr", "globals", "locals", "vars", "system", "popen", "spawn", "fork", "kill", "remove",
    "unlink", "rmdir", "rmtree", "load", "loads", "save", "dump", "dumps", "unsafe_load",
    "import_module", "run", "call", "check_call", "check_output", "main",
})


def resolve_reference(text: Any, base_dir: Path) -> str:
    """Check a 'file.py:Name' / 'module:Name' reference WITHOUT importing anything.

    Returns '/abs/path/file.py:Name' (the file must lie inside base_dir, the spec's folder) or
    'module:Name'; raises SpecError (message only) for anything refused."""
    if not isinstance(text, str) or ":" not in text:
        raise SpecError(f"expected 'file.py:Name' or 'module:Name', got {show(text)}",
                        hint="the file path is relative to the spec file's folder")
    left, _, name = text.strip().rpartition(":")
    _check_name(name, text)
    if left.endswith(".py"):
        return f"{_inside(left, base_dir, name)}:{name}"
    _check_module(left, text)
    return f"{left}:{name}"


def _check_name(name: str, text: str) -> None:
    parts = name.split(".")
    if not name or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise SpecError(f"{text!r}: {name!r} is not a Python name")
    for part in parts:
        if part.startswith("__") or part in DENIED_NAMES:
            raise SpecError(f"{text!r}: the name {part!r} is refused (dunder names and names such "
                            "as eval, exec, open, system, load are never a gradient to check)")


def _check_module(module: str, text: str) -> None:
    parts = module.split(".")
    if not module or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise SpecError(f"{text!r}: {module!r} is neither a file.py path nor a module name")
    # A private module (_impl) is where libraries keep their Functions: allowed, and what it
    # defines still passes trust.py (a Function, Module or torch operator, else an opt-in).
    # Dunder modules (__main__, __init__) are never a library's Function.
    if any(p.startswith("__") for p in parts):
        raise SpecError(f"{text!r}: dunder modules (names starting with __) are refused")
    if parts[0] in sys.stdlib_module_names or parts[0] == "builtins":
        raise SpecError(f"{text!r}: module {parts[0]!r} is refused: a target comes from the "
                        "spec's folder or an installed package, never the standard library "
                        "(os, sys, subprocess, builtins, ...)")
    prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    denied = sorted(prefixes & DENIED_MODULES)
    if denied:
        raise SpecError(f"{text!r}: module {denied[0]!r} is refused: it loads or runs code or "
                        "files, and a spec must not reach it")


def resolve_location(text: Any, base_dir: Path) -> str:
    """An import: location, 'file.py' (in the spec's folder) or 'package.module', unimported."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"expected 'file.py' or 'package.module', got {show(text)}")
    if text.strip().endswith(".py"):
        return str(_inside(text.strip(), base_dir, None))
    _check_module(text.strip(), text)
    return text.strip()


def _inside(left: str, base_dir: Path, name: str | None) -> Path:
    relative = Path(left)
    if relative.is_absolute():
        raise SpecError(f"{left!r} is an absolute path; write it relative to the spec's folder")
    full = (base_dir / relative).resolve()
    if not full.is_relative_to(base_dir):
        raise SpecError(f"{left!r} lies outside the spec's folder {str(base_dir)!r}; a spec may "
                        "only name Python files in its own folder (or below)")
    if not full.is_file():
        raise SpecError(f"file {left!r} not found in {str(base_dir)!r}")
    defined = _defined_names(str(full), full.stat().st_mtime_ns)
    first = name.split(".")[0] if name is not None else None
    if first is not None and defined is not None and first not in defined:
        raise SpecError(f"{left!r} defines no {first!r}",
                        hint=did_you_mean(first, defined) or
                        f"it defines {', '.join(sorted(defined)[:8]) or 'nothing'}")
    return full


@functools.lru_cache(maxsize=64)
def _defined_names(path: str, mtime: int) -> frozenset[str] | None:
    """Top-level names a file defines, read with ast (not imported); None if unknowable."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(2_000_001))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the target loader reports a broken file with its own traceback
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            return None  # conditional definitions: too clever to follow, let the import decide
    return frozenset(names)

