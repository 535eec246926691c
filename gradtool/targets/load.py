"""The Target record, and loading what a target string names: modules, files, attributes, sources."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ..errors import TargetError, did_you_mean
from .needs import torch_needed


@dataclass
class Target:
    """One thing to check: how to call it, what its arguments are called, where its code is."""

    name: str                     # as shown and reproduced: "specs/examples/linear.py:LinearFunction"
    kind: Any                     # its adapter, a targets/kinds.py Kind (which imports this
    #                               module): what differs by kind; str(kind) is its name
    obj: Any                      # the Function class, nn.Module (class or instance) or callable
    qualname: str
    arg_names: tuple[str, ...]    # forward's positional arguments (no ctx / self)
    signature: inspect.Signature | None = None
    init: Any = None              # constructor arguments for an nn.Module class
    function_cls: type | None = None  # the autograd.Function class, for Function targets
    source: str | None = None     # file:line of backward (Function) or forward
    forward_source: str | None = None
    once_differentiable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def split_target(text: str) -> tuple[str, str | None]:
    """'a/b.py:Name' -> ('a/b.py', 'Name'); 'pkg.mod' -> ('pkg.mod', None)."""
    head, sep, tail = text.rpartition(":")
    if sep and tail and all(part.isidentifier() for part in tail.split(".")):
        return head, tail
    if sep and not tail:
        raise TargetError(f"target {text!r} has an empty name after ':'",
                          "write it as module:Name or path/to/file.py:Name")
    return text, None


def is_path(location: str) -> bool:
    return location.endswith(".py") or os.sep in location or "/" in location


def load_module(location: str) -> ModuleType:
    """Import a dotted module, or load a .py file by path (registered in sys.modules first)."""
    if is_path(location):
        return _load_path(Path(location))
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as exc:
        hint = None
        if Path(location + ".py").exists():
            hint = f"to load the file, write {location}.py"
        raise TargetError(f"cannot import module {location!r}: {exc}",
                          hint or "check the spelling, or pass a file path like path/to/file.py")
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except Exception as exc:  # user code raising at import time is a bad target, not a gradtool bug
        raise TargetError(f"importing {location!r} raised {type(exc).__name__}: {exc}",
                          torch_needed(exc)) from exc


def _load_path(path: Path) -> ModuleType:
    if not path.exists():
        raise TargetError(f"file not found: {path}", "check the path (relative to the current folder)")
    if path.suffix != ".py":
        raise TargetError(f"{path} is not a Python file", "a target file must end in .py")
    resolved = path.resolve()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        # Compare names first: resolving all ~1,000 of torch's module paths costs ~0.2 s.
        if file and os.path.basename(file) == resolved.name and Path(file).resolve() == resolved:
            return module
    name = _free_module_name(path.stem)
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses and pickling inside the user's file look it up.
    sys.modules[name] = module
    folder = str(resolved.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise _syntax_error(exc) from None
    except Exception as exc:
        del sys.modules[name]
        raise TargetError(f"importing {path} raised {type(exc).__name__}: {exc}",
                          torch_needed(exc)) from exc
    return module


def _free_module_name(stem: str) -> str:
    name = stem if stem.isidentifier() else "_gradtool_user"
    candidate, n = name, 1
    while candidate in sys.modules:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _syntax_error(exc: SyntaxError) -> TargetError:
    where = f"{exc.filename}:{exc.lineno}" if exc.filename else "the target file"
    line = (exc.text or "").strip()
    return TargetError(f"syntax error in {where}: {exc.msg}" + (f"\n    {line}" if line else ""))


def lookup(module: ModuleType, name: str, location: str) -> Any:
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise TargetError(f"{location} has no attribute {name!r}",
                              did_you_mean(part, names) or f"available: {', '.join(names[:12])}")
        obj = getattr(obj, part)
    return obj


def is_once_differentiable(fn: Callable[..., Any]) -> bool:
    """True for a backward wrapped by torch.autograd.function.once_differentiable."""
    wrapped = getattr(fn, "__wrapped__", None)
    code = getattr(fn, "__code__", None)
    return wrapped is not None and code is not None and \
        code.co_filename.replace("\\", "/").endswith("torch/autograd/function.py")


def source_of(fn: Any) -> str | None:
    """'path:line' of a function's definition (relative to the current folder when inside it)."""
    try:
        fn = inspect.unwrap(fn)
        path = inspect.getsourcefile(fn)
        line = _def_line(fn, path)
    except (TypeError, OSError):
        return None
    if path is None or line is None:
        return None
    return f"{display_path(path)}:{line}"


def _def_line(fn: Any, path: str | None) -> int | None:
    """The `def` line, not a decorator's above it. A function's code knows where it starts,
    so only its decorators are read (inspect.getsourcelines tokenizes the whole body: ~5 ms a
    target, paid on every check of a tiny op)."""
    code = getattr(fn, "__code__", None)
    if code is None or path is None:
        lines, line = inspect.getsourcelines(fn)
        return line + next((k for k, text in enumerate(lines)
                            if text.lstrip().startswith(("def ", "async def "))), 0)
    import linecache

    lines = linecache.getlines(path)
    start = code.co_firstlineno
    if not lines or start > len(lines):
        raise OSError("source not available")
    if not lines[start - 1].lstrip().startswith("@"):
        return start
    for k in range(start - 1, len(lines)):
        if lines[k].lstrip().startswith(("def ", "async def ")):
            return k + 1
    return start


def display_path(path: str) -> str:
    """path relative to the current folder when inside it (memoised per folder: a tiny check
    names its sources several times a call)."""
    return _display_path(path, os.getcwd())


@functools.lru_cache(maxsize=1024)
def _display_path(path: str, cwd: str) -> str:
    try:
        relative = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative
