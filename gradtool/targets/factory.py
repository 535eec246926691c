"""Inputs from outside: --inputs-from factories and .pt files, --save-inputs, --init literals."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

from ..errors import InputError
from .values import given_specs, leaves, plain_values, unwrap

EXPECTED = ("a tuple of positional arguments, a pair (args tuple, kwargs dict), a single tensor, "
            "or a dict {case name: one of those}")


def load_inputs(text: str, seed: int, dtype: str, device: str) -> list[tuple[str, list[Any]]]:
    """[(case label, specs)] from a factory 'file.py:name' / 'module:name' or a .pt file."""
    from .cases import check_device

    check_device(device)  # before anything is loaded there: a usage error naming the fix
    if text.endswith(".pt"):
        data, where = _load_pt(text, device), text
    else:
        fn, where = _factory(text)
        data = _call(fn, where, seed, dtype, device)
    return _cases(data, where)


def _load_pt(text: str, device: str) -> Any:
    import torch

    if not Path(text).is_file():
        raise InputError(f"--inputs-from {text}: file not found",
                         "write one with gradtool check ... --save-inputs FILE.pt")
    try:
        # weights_only: tensors, tuples, dicts and numbers load; no pickled code ever runs.
        # Onto the run's device: values saved on a GPU replay on the CPU and the reverse.
        return torch.load(text, map_location=device, weights_only=True)
    except Exception as exc:
        raise InputError(f"--inputs-from {text}: cannot load it with torch.load(weights_only=True)"
                         f": {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                         "save tensors, tuples, lists and dicts of them with torch.save") from None


def _factory(text: str) -> tuple[Any, str]:
    from .load import load_module, lookup, source_of, split_target

    location, name = split_target(text)
    if name is None:
        raise InputError(f"--inputs-from {text}: name the factory, e.g. {text}:make_inputs",
                         "a factory is file.py:name or module:name, or a .pt file")
    fn = lookup(load_module(location), name, location)
    if not callable(fn):
        raise InputError(f"--inputs-from {text}: {name} is a {type(fn).__name__}, not callable")
    return fn, f"input factory {text} ({source_of(fn) or 'source unknown'})"


def _call(fn: Any, where: str, seed: int, dtype: str, device: str) -> Any:
    import torch

    # A generator of the run's device: the factory draws there with generator=, device=.
    offered = {"generator": torch.Generator(device=device).manual_seed(seed),
               "dtype": getattr(torch, dtype), "device": device}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if takes_any or k in params}
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise InputError(f"{where} raised {type(exc).__name__}: {exc}",
                         "a factory is called with the keywords it takes among generator (a "
                         f"seeded torch.Generator), dtype and device, and returns {EXPECTED}"
                         ) from exc


def _cases(data: Any, where: str) -> list[tuple[str, list[Any]]]:
    if isinstance(data, dict) and data and all(isinstance(k, str) for k in data):
        return [(label, _one(value, f"{where}, case {label!r}")) for label, value in data.items()]
    return [("case 0", _one(data, where))]


def _one(value: Any, where: str) -> list[Any]:
    import torch

    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)) \
            and isinstance(value[1], dict) and all(isinstance(k, str) for k in value[1]):
        return given_specs(list(value[0]), value[1])
    if isinstance(value, (tuple, list)):
        return given_specs(list(value))
    if isinstance(value, torch.Tensor):
        return given_specs([value])
    raise InputError(f"{where} returned {type(value).__name__} {_short(value)}; expected "
                     f"{EXPECTED}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def save_inputs(path: str, cases: list[tuple[str, list[Any], list[Any]]]) -> None:
    """Write [(label, specs, leaf values)] to a .pt file that --inputs-from replays."""
    import torch

    saved = {label: _pair(specs, values) for label, specs, values in cases}
    data = next(iter(saved.values())) if len(saved) == 1 else saved
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, path)
    except OSError as exc:
        raise InputError(f"cannot write --save-inputs {path}: {exc.strerror or exc}",
                         "check that the folder is writable") from None


def _pair(specs: list[Any], values: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    n = sum(1 for _ in leaves([unwrap(s) for s in specs]))
    args, kwargs = plain_values(specs, [v.detach().clone() if hasattr(v, "detach") else v
                                        for v in values[:n]])
    return tuple(args), kwargs


def parse_init(items: list[str] | tuple[str, ...]) -> dict[str, Any] | None:
    """--init NAME=VALUE (repeatable) -> keyword arguments; VALUE is a Python literal only."""
    init: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise InputError(f"--init {item!r} is not NAME=VALUE",
                             "e.g. --init hidden_size=4 --init bias=False")
        try:
            init[name.strip()] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            raise InputError(f"--init {item!r}: {text.strip()!r} is not a Python literal "
                             "(values are never evaluated)",
                             "use a number, True/False/None, a quoted string, or a tuple/list "
                             "of these, e.g. --init dropout=0.0 --init mode='mean'") from None
    return init or None
