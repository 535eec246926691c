"""Library API: gradtool.check returns a Report (never prints, never exits); assert_gradients raises."""

from __future__ import annotations

from typing import Any

from .config.settings import CheckConfig
from .errors import GradtoolError
from .results import Report
from .run.collect import collect_one, is_spec_argument
from .run.runner import CaseSpec, Job, run
from .targets.inputs import parse_input
from .targets.resolve import make_target


def _input_specs(inputs: Any, kwargs: dict[str, Any] | None) -> list[Any] | None:
    """--input strings, InputSpecs, the user's own values, or any nesting of them -> specs."""
    from .targets.values import given_specs

    if inputs is None and kwargs is None:
        return None
    if isinstance(inputs, str) or not isinstance(inputs, (tuple, list, type(None))):
        inputs = (inputs,)  # gradcheck also takes a single tensor
    if kwargs is not None and not isinstance(kwargs, dict):
        raise GradtoolError(f"kwargs takes a dict of keyword arguments, got "
                            f"{type(kwargs).__name__}", "e.g. kwargs={'mask': mask}")
    return given_specs(list(inputs or ()), kwargs, parse_input)


def _given_dtype(specs: list[Any] | None, settings: dict[str, Any]) -> dict[str, Any]:
    """Given tensors of one floating dtype (one device) set the run's dtype (so its tolerances)
    and device, unless the caller set them: the check runs where the values are."""
    import torch

    from .targets.values import ValueSpec, leaves

    given = [leaf.value for _, leaf in leaves([getattr(s, "spec", s) for s in specs or []])
             if isinstance(leaf, ValueSpec) and isinstance(leaf.value, torch.Tensor)]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in given if t.is_floating_point()}
    devices = {str(t.device) for t in given}
    found = {"dtype": dtypes.pop() if len(dtypes) == 1 else None,
             "device": devices.pop() if len(devices) == 1 else None}
    return {**{k: v for k, v in found.items() if v is not None}, **settings}


def check(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
          **settings: Any) -> Report:
    """Check a target (an object, or a 'module:Name' / 'file.py:Name' string).

    inputs: the positional forward arguments, like gradcheck's: tensors (checked at exactly those
    values, which are never modified), literals, --input strings ('3x4', '5', 'None'), InputSpec
    objects, or tuples/lists/dicts of these; omitted, they are inferred. Which tensors are checked
    follows gradcheck: those that require grad if any does, else every floating one.
    kwargs: keyword arguments of forward, in the same forms. settings: any CheckConfig field
    (seed, dtype, eps, atol, rtol, nondet_tol, checks, mode, probes, ...).
    """
    specs = _input_specs(inputs, kwargs)
    settings = _given_dtype(specs, settings)
    config = CheckConfig(**{k: (tuple(v) if k == "checks" else v) for k, v in settings.items()})
    if isinstance(target, str):
        if is_spec_argument(target) and specs is not None:
            raise GradtoolError(f"{target} is a spec: its inputs come from the file")
        jobs, rejected = collect_one(target, config, specs)  # the CLI's own collection
        return _quietly(run, jobs, config, rejected)
    loadable = _loadable_name(target)
    name = loadable or (f"{getattr(target, '__module__', '?')}:"
                        f"{getattr(target, '__qualname__', type(target).__name__)}")
    made = make_target(target, name)
    # An op names itself reproducibly (file.py:ns::name); other unloadable objects say how.
    reproduce = None if loadable or made.kind.named_reproducibly \
        else _python_reproduce(target, config.seed)
    jobs = [Job(made, [CaseSpec("case 0", specs, config.seed)], config, reproduce=reproduce)]
    return _quietly(run, jobs, config)


def _quietly(fn: Any, *args: Any) -> Report:
    """torch's vmap-fallback notice is off while gradtool evaluates, then back on (its default;
    torch offers no way to read the setting)."""
    from .targets.ops import silence_vmap_fallback

    silence_vmap_fallback()
    try:
        return fn(*args)
    finally:
        silence_vmap_fallback(True)


def _loadable_name(target: Any) -> str | None:
    """'module:Name' that the command line loads back to this very object (torch:sin,
    pkg.mod:MyFunction), or None: a lambda, a local function, an instance, __main__."""
    import importlib

    module = getattr(target, "__module__", None)
    if not isinstance(module, str) or module == "__main__":
        return None
    for name in (getattr(target, "__qualname__", None), getattr(target, "__name__", None)):
        if not isinstance(name, str) or "<" in name:
            continue
        try:
            found: Any = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part)
        except Exception:  # noqa: BLE001 - not importable by that name: try the next
            continue
        if found is target:
            return f"{module}:{name}"
    return None


def _python_reproduce(target: Any, seed: int) -> str:
    """How to reproduce a target no command line can load: the call, in Python."""
    import inspect

    qualname = getattr(target, "__qualname__", "") or ""
    what = "lambda" if "<lambda>" in qualname else (
        "local function" if "<locals>" in qualname else
        "class" if inspect.isclass(target) else type(target).__name__)
    code = getattr(target, "__code__", None)
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return (f"gradtool.check(<the {what}{where}>, <the same inputs>, seed={seed}) in Python "
            "(it has no module:Name a command line can load; give it a module-level name for "
            "one)")


def assert_gradients(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
                     **settings: Any) -> Report:
    """Like check, but raise AssertionError with the plain-text report when anything fails."""
    from .render.terminal import render_plain

    report = check(target, inputs, kwargs, **settings)
    if not report.ok(bool(settings.get("strict", False))):
        raise AssertionError("gradtool found gradient problems:\n" + render_plain(report, quiet=True))
    return report
