"""Each command's options as one frozen record, built from click's parameters (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="Options")

# The options [tool.gradtool] also sets: the command line wins over pyproject, which wins over the
# defaults (config/pyproject.py merges them). `format` is --format's, for the report formats only.
SETTINGS = ("seed", "dtype", "device", "eps", "atol", "rtol", "nondet_tol", "mode", "strict",
            "masked", "exhaustive", "probes", "max_memory", "timeout", "annotations")


def file_param(name: str) -> str:
    """The click parameter of a report format's option (--junit-xml -> junit_file)."""
    return f"{name}_file"


@dataclass(frozen=True)
class Options:
    """The base of every command's options."""

    @classmethod
    def from_click(cls: type[T], params: dict[str, Any]) -> T:
        """The record of a command's click parameters (tuples for repeated options; the report
        files, one option per registered format, gathered by format name)."""
        from ..config import registry

        params = dict(params)
        files = tuple((name, params.pop(file_param(name))) for name in registry.FORMATS
                      if file_param(name) in params)
        if files:
            params["files"] = tuple((name, path) for name, path in files if path)
        unknown = set(params) - {f.name for f in fields(cls)}
        if unknown:  # a click option without a field: a bug, said at once
            raise TypeError(f"{cls.__name__} has no field for {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})

    def settings(self) -> dict[str, Any]:
        """The command line's values of the settings pyproject also sets (None: not given)."""
        from ..config import registry

        given = {name: getattr(self, name, None) for name in SETTINGS}
        files = dict(getattr(self, "files", ()))
        checks = getattr(self, "checks", ())
        fmt = getattr(self, "fmt", None)
        targets = getattr(self, "targets", ())
        return {**given, **{f.pyproject_key: files.get(f.name)
                            for f in registry.FORMATS.values() if f.pyproject_key},
                "checks": list(checks) or None,
                "format": fmt if fmt in ("terminal", "json") else None,
                "paths": list(targets) or None}


@dataclass(frozen=True)
class TargetOptions(Options):
    """What to check it on: check, graph and list share these (defaults None: pyproject's)."""

    inputs: tuple[str, ...] = ()
    seed: int | None = None
    dtype: str | None = None
    device: str | None = None
    inputs_from: str | None = None
    init: tuple[str, ...] = ()
    traceback: bool = False
    imports: tuple[str, ...] = ()
    sweeps: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportOptions(Options):
    """Where and how the report goes: check and trace share these."""

    fmt: str | None = None
    files: tuple[tuple[str, str], ...] = ()  # (format name, path): config/registry.py FORMATS
    annotations: str | None = None
    color: str = "auto"
    quiet: bool = False
    verbose: bool = False


@dataclass(frozen=True)
class IsolationOptions(Options):
    """Worker processes: how many, how long and how much memory each target may take."""

    workers: str | None = None
    timeout: float | None = None
    max_rss: int | None = None
    isolate: bool = True


@dataclass(frozen=True)
class CheckOptions(TargetOptions, ReportOptions, IsolationOptions):
    """`gradtool check`."""

    targets: tuple[str, ...] = ()
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    nondet_tol: float | None = None
    mode: str | None = None
    checks: tuple[str, ...] = ()
    reference: str | None = None
    autocast: str | None = None
    probes: int | None = None
    max_memory: float | None = None
    strict: bool | None = None
    masked: bool | None = None
    exhaustive: bool | None = None
    resample: int | None = None
    trust_callables: bool = False
    save_inputs: str | None = None
    repro: str | None = None
    repro_budget: int | None = None
    show_config: bool = False


@dataclass(frozen=True)
class GraphOptions(TargetOptions):
    """`gradtool graph`."""

    target: str = ""
    fmt: str = "tree"
    grads: bool = False
    depth: int | None = None
    output: str | None = None
    color: str = "auto"


@dataclass(frozen=True)
class ListOptions(TargetOptions):
    """`gradtool list`."""

    targets: tuple[str, ...] = ()
    rules: bool = False


@dataclass(frozen=True)
class TraceOptions(ReportOptions, IsolationOptions):
    """`gradtool trace`."""

    script: str | None = None
    args: tuple[str, ...] = ()
    module: str | None = None
    max_calls: int = 1000
    save: str | None = None
    list_: bool = False
    checks: tuple[str, ...] = ()
    mode: str | None = None
    device: str | None = None
    atol: float | None = None
    rtol: float | None = None
    strict: bool | None = None
