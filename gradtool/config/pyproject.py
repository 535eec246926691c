"""[tool.gradtool] in pyproject.toml: find, validate, merge with flags, and name each source."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (a 3.10-only dependency)
    import tomli as tomllib

from ..errors import ConfigError, did_you_mean
from .registry import FORMATS as REPORT_FILES
from .registry import RULE_IDS
from .settings import CHECK_NAMES, DEFAULT_CHECKS, DEFAULT_TOLERANCES, DTYPES, MODES

FORMATS = ("terminal", "json")
# The report files a project may configure (junit_xml, html): config/registry.py's FORMATS.
FILE_KEYS = tuple(f.pyproject_key for f in REPORT_FILES.values() if f.pyproject_key)
ANNOTATIONS = ("auto", "github", "none")
DEFAULT_SOURCE = "default"
CLI_SOURCE = "command line"

# The settings a project may configure, with their defaults (CheckConfig's, where it has one).
DEFAULTS: dict[str, Any] = {
    "paths": [],
    "seed": 0,
    "dtype": "float64",
    "device": "cpu",
    "eps": None,        # None: the dtype's default (config.DEFAULT_TOLERANCES)
    "atol": None,
    "rtol": None,
    "nondet_tol": 0.0,
    "mode": "auto",
    "checks": list(DEFAULT_CHECKS),
    "strict": False,
    "masked": False,    # sparse inputs: specified elements only (gradcheck's masked)
    "exhaustive": False,  # every piece of evidence after a failure (no cost-plan stop)
    "probes": 4,
    "max_memory": 2e9,
    "timeout": 600.0,
    "format": "terminal",
    **dict.fromkeys(FILE_KEYS),  # report files: junit_xml, html (registry.FORMATS)
    "annotations": "auto",
    "ignore": [],       # rule ids silenced (contract.broadcast_gradient, ...)
}
KEYS = tuple(DEFAULTS)

# Settings CheckConfig takes; the rest (paths, output options) are for the CLI.
CHECK_CONFIG_KEYS = ("seed", "dtype", "device", "eps", "atol", "rtol", "nondet_tol", "mode",
                     "checks", "strict", "masked", "exhaustive", "probes", "max_memory", "timeout",
                     "ignore")


@dataclass(frozen=True)
class ProjectConfig:
    """The project's settings (every key, defaults filled in) and where each value came from."""

    path: Path | None
    settings: dict[str, Any] = field(default_factory=lambda: dict(DEFAULTS))
    sources: dict[str, str] = field(
        default_factory=lambda: dict.fromkeys(DEFAULTS, DEFAULT_SOURCE))

    @property
    def root(self) -> Path | None:
        """The folder relative paths in the config are resolved against."""
        return self.path.parent if self.path else None


def find_pyproject(start: Path) -> Path | None:
    """Nearest pyproject.toml with a [tool.gradtool] table, from start up to the repo root."""
    folder = start.absolute()
    if folder.is_file():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        # Like ruff and mypy: a pyproject.toml without our table is not ours; keep going.
        if path.is_file() and _has_table(path):
            return path
        # Stop at the repository root so a stray ~/pyproject.toml never configures a checkout.
        if (candidate / ".git").exists() or (candidate / ".hg").exists():
            return None
    return None


def discover(cwd: Path | None = None) -> ProjectConfig:
    """find_pyproject + load_config from the current directory (what `gradtool check` does)."""
    start = Path.cwd() if cwd is None else cwd
    return load_config(find_pyproject(start), cwd=start)


def load_config(path: Path | None, cwd: Path | None = None) -> ProjectConfig:
    """Read and validate [tool.gradtool]; defaults for what it leaves out (all if no path)."""
    if path is None:
        return ProjectConfig(path=None)
    path = path.absolute()
    table = _read_table(path)
    origin = f"pyproject.toml [tool.gradtool] at {path}"
    settings, sources = dict(DEFAULTS), dict.fromkeys(DEFAULTS, DEFAULT_SOURCE)
    for raw_key, value in table.items():
        key = _known_key(raw_key, path)
        settings[key] = _validate(key, value, path)
        sources[key] = origin
    settings["paths"] = [resolve_entry(p, path.parent, cwd) for p in settings["paths"]]
    for key in FILE_KEYS:  # report files: relative to pyproject.toml
        if settings[key] is not None:
            settings[key] = _display(path.parent / settings[key], cwd)
    return ProjectConfig(path=path, settings=settings, sources=sources)


def _read_table(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}",
                          "fix the syntax error (strings need quotes, tables [brackets])") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    tool = data.get("tool", {})
    table = tool.get("gradtool", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.gradtool] must be a table, got {table!r}",
                          "write the settings under a [tool.gradtool] header")
    return table


def _has_table(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            tool = tomllib.load(handle).get("tool", {})
    except tomllib.TOMLDecodeError:
        # A broken file that mentions us is ours: load_config then reports the syntax error.
        return "gradtool" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return isinstance(tool, dict) and "gradtool" in tool


def _known_key(raw_key: str, path: Path) -> str:
    # ruff-style kebab-case is accepted too: junit-xml and junit_xml mean the same setting.
    key = raw_key.replace("-", "_")
    if key not in DEFAULTS:
        hint = did_you_mean(key, KEYS) or f"valid keys: {', '.join(KEYS)}"
        raise ConfigError(f"{path}: unknown key {raw_key!r} in [tool.gradtool]", hint)
    return key


def _validate(key: str, value: Any, path: Path) -> Any:
    """Check one value's type and range; name the key, the value and what was expected."""
    expected, check = _RULES[key]
    try:
        ok = check(value)
    except (TypeError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"{path}: [tool.gradtool] {key} = {_toml(value)}: expected {expected}",
                          _hint(key, value))
    if key in ("eps", "atol", "rtol", "nondet_tol", "max_memory", "timeout"):
        return float(value)
    return list(value) if isinstance(value, list) else value


def _hint(key: str, value: Any) -> str | None:
    """The likely fix: a list for a lone string, or the nearest valid choice for a typo."""
    if isinstance(DEFAULTS[key], list) and isinstance(value, str):
        return f"write a list: {key} = [{_toml(value)}]"
    words = value if isinstance(value, list) else [value]
    for word in words:
        if isinstance(word, str) and word not in _choices(key):
            return did_you_mean(word, _choices(key))
    return None


def _is_number(value: Any) -> bool:
    # bool is an int in Python, but `atol = true` is a mistake, not 1.0.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(value: Any, allowed: tuple[str, ...] | None = None) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, str) and (allowed is None or v in allowed) for v in value)


def _choices(key: str) -> tuple[str, ...]:
    return {"dtype": DTYPES, "mode": MODES, "format": FORMATS, "annotations": ANNOTATIONS,
            "checks": CHECK_NAMES, "ignore": RULE_IDS}.get(key, ())


_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "paths": ("a list of strings (targets or spec paths)", _str_list),
    "seed": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "dtype": (f"one of {', '.join(DTYPES)}", lambda v: v in DTYPES),
    "device": ("a string such as 'cpu' or 'cuda:0'", lambda v: isinstance(v, str) and v != ""),
    "eps": ("a positive number", lambda v: _is_number(v) and v > 0),
    "atol": ("a non-negative number", lambda v: _is_number(v) and v >= 0),
    "rtol": ("a non-negative number", lambda v: _is_number(v) and v >= 0),
    "nondet_tol": ("a non-negative number", lambda v: _is_number(v) and v >= 0),
    "mode": (f"one of {', '.join(MODES)}", lambda v: v in MODES),
    "checks": (f"a list of check names among {', '.join(CHECK_NAMES)}",
               lambda v: _str_list(v, CHECK_NAMES) and len(v) > 0),
    "strict": ("true or false", lambda v: isinstance(v, bool)),
    "masked": ("true or false", lambda v: isinstance(v, bool)),
    "exhaustive": ("true or false", lambda v: isinstance(v, bool)),
    "probes": ("a positive integer", lambda v: _is_int(v) and v >= 1),
    "max_memory": ("a positive number of bytes", lambda v: _is_number(v) and v > 0),
    "timeout": ("a non-negative number of seconds (0: no limit)",
                lambda v: _is_number(v) and v >= 0),
    "format": (f"one of {', '.join(FORMATS)}", lambda v: v in FORMATS),
    **{key: ("a file path string", lambda v: isinstance(v, str) and v != "")
       for key in FILE_KEYS},
    "annotations": (f"one of {', '.join(ANNOTATIONS)}", lambda v: v in ANNOTATIONS),
    "ignore": ("a list of rule ids (gradtool list shows them)", lambda v: _str_list(v, RULE_IDS)),
}


def resolve_entry(entry: str, root: Path, cwd: Path | None = None) -> str:
    """A paths entry: file/folder parts resolved against root; 'pkg.mod:Name' targets kept as is."""
    head, sep, name = entry.rpartition(":")
    path_part, suffix = (head, sep + name) if sep and head.endswith(".py") else (entry, "")
    if not _looks_like_path(path_part, root):
        return entry
    return _display(root / path_part, cwd) + suffix


def _looks_like_path(text: str, root: Path) -> bool:
    return ("/" in text or os.sep in text or text.endswith((".py", ".yaml", ".yml"))
            or (root / text).exists())


def _display(path: Path, cwd: Path | None) -> str:
    """Relative to cwd when inside it (what the user would type), else absolute."""
    absolute = Path(os.path.normpath(path.absolute()))
    base = (Path.cwd() if cwd is None else cwd).absolute()
    try:
        return absolute.relative_to(base).as_posix() or "."
    except ValueError:
        return absolute.as_posix()


def merge(project: ProjectConfig, cli: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Effective settings and their sources: a flag that was given beats the project beats default.

    A CLI value counts as given when it is not None and not an empty tuple/list (click's value for a
    repeatable option or nargs=-1 argument that was not used).
    """
    settings, sources = dict(project.settings), dict(project.sources)
    for key, value in cli.items():
        if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
            continue
        settings[key] = list(value) if isinstance(value, tuple) else value
        sources[key] = CLI_SOURCE
    return settings, sources


def check_config_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of settings that CheckConfig(**kwargs) takes, in its types."""
    kwargs = {k: settings[k] for k in CHECK_CONFIG_KEYS if k in settings}
    for key in ("checks", "ignore"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    return kwargs


def render_effective(settings: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """A plain aligned table: key, value, source (for `gradtool config` / --show-config)."""
    keys = [k for k in KEYS if k in settings] + sorted(k for k in settings if k not in DEFAULTS)
    rows = [("key", "value", "source")]
    rows += [(k, _shown(k, settings[k], settings), sources.get(k, DEFAULT_SOURCE)) for k in keys]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{k:<{widths[0]}}  {v:<{widths[1]}}  {s}".rstrip() for k, v, s in rows]
    return "\n".join(lines) + "\n"


def _shown(key: str, value: Any, settings: Mapping[str, Any]) -> str:
    if value is None and key in ("eps", "atol", "rtol"):
        dtype = settings.get("dtype", "float64")
        default = DEFAULT_TOLERANCES.get(dtype, {}).get(key)
        return f"{default:g} ({dtype} default)" if default is not None else "(dtype default)"
    return _toml(value)


def _toml(value: Any) -> str:
    """Values as they would be written in pyproject.toml, so the table can be pasted back."""
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
