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
    """'a/b.py:Name' -> ('a/b.py', 'Name'); 'pkg.mod' -> ('pkg.mod', None). pytest's separator
    is taken too ('a/b.py::Name', 'a/b.py::Outer::Inner'): it is what a test id writes."""
    if ".py::" in text:  # not an op's ns::name: those name no file
        path, _, rest = text.partition(".py::")
        text = f"{path}.py:{rest.replace('::', '.')}"
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
    """Import a dotted module, or load a .py file by path, as `python -m` and pytest would: the
    working directory and a package file's root (the first folder upward without __init__.py)
    on sys.path, so a package that is not installed imports its own modules."""
    on_path(os.getcwd())
    if is_path(location):
        return _load_path(Path(location))
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as exc:
        hint = None
        if Path(location + ".py").exists():
            hint = f"to load the file, write {location}.py"
        raise TargetError(f"cannot import module {location!r}: {exc} (looked in the working "
                          f"directory {os.getcwd()} and the installed packages)",
                          hint or _not_found_hint(location, exc)) from None
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except Exception as exc:  # user code raising at import time is a bad target, not a gradtool bug
        raise _import_raised(repr(location), exc) from exc  # --traceback shows it whole


def on_path(folder: str) -> None:
    """Put a folder first on sys.path (once), as `python -m` puts the working directory."""
    if folder not in sys.path:
        sys.path.insert(0, folder)


def package_root(path: Path) -> tuple[Path, str | None]:
    """(root, dotted name) of a file inside a package: the first folder upward without
    __init__.py, and the name `python -m` would give it; (its folder, None) outside one."""
    folder, parts = path.parent, [path.stem]
    while (folder / "__init__.py").exists() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    dotted = ".".join(parts)
    if len(parts) == 1 or not all(p.isidentifier() for p in parts):
        return path.parent, None
    return folder, dotted


def _not_found_hint(location: str, exc: ModuleNotFoundError) -> str:
    top = (exc.name or location).split(".")[0]
    return (f"run gradtool from the folder that holds {top}/ or {top}.py (or install it: "
            f"pip install -e .), or pass the file itself: path/to/{location.replace('.', '/')}.py")


def _import_raised(what: str, exc: BaseException) -> TargetError:
    """The user's import raised: the message shows their frames (file:line), not gradtool's."""
    hint = torch_needed(exc)
    if isinstance(exc, ModuleNotFoundError) and hint is None and exc.name:
        top = exc.name.partition(".")[0]
        hint = (f"{top} is not importable from {os.getcwd()}: install it, or run gradtool "
                f"from the folder that holds {top}/ or {top}.py")
    return TargetError(f"importing {what} raised {type(exc).__name__}: {exc}"
                       + "".join(f"\n    {frame}" for frame in user_frames(exc)), hint)


def user_frames(exc: BaseException, limit: int = 6) -> list[str]:
    """'path:line in name: code' of the innermost frames neither gradtool's, torch's nor the
    import machinery's: where the user's module raised."""
    import traceback

    ours = (str(Path(__file__).resolve().parents[1]), str(Path(importlib.__file__).parent))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(ours) and "/torch/" not in f.filename.replace(
                  "\\", "/") and not f.filename.startswith("<")]
    return [f"{display_path(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
            for f in frames[-limit:]]


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
    root, dotted = package_root(resolved)
    on_path(str(root))  # so the file can import its neighbours, or its package's modules
    if dotted is not None and (module := _import_in_package(path, dotted, root)) is not None:
        return module
    name = _free_module_name(path.stem)
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses and pickling inside the user's file look it up.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise _syntax_error(exc) from None
    except Exception as exc:
        del sys.modules[name]
        raise _import_raised(str(path), exc) from exc
    return module


def _import_in_package(path: Path, dotted: str, root: Path) -> ModuleType | None:
    """The file imported by its package name (its intra-package imports then work); None when
    that name is another file's (an installed or imported package of the same name, a `tests`
    package of another project): loaded by path then, as before."""
    top = sys.modules.get(dotted.partition(".")[0])
    if top is not None and not any(Path(p).resolve().parent == root.resolve()
                                   for p in getattr(top, "__path__", None) or ()):
        return None
    try:
        module = importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and (dotted + ".").startswith(exc.name + "."):  # the name is not this file's
            return None
        raise _import_raised(f"{path} as {dotted} (package root {root} on sys.path)", exc) \
            from None
    except SyntaxError as exc:
        raise _syntax_error(exc) from None
    except Exception as exc:
        raise _import_raised(f"{path} as {dotted} (package root {root} on sys.path)", exc) \
            from exc
    file = getattr(module, "__file__", None)
    return module if file and Path(file).resolve() == path.resolve() else None


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
