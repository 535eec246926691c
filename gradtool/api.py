"""Library API: gradtool.check returns a Report (never prints, never exits); assert_gradients raises."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .config.settings import CheckConfig
from .errors import GradtoolError
from .results import Report
from .run.collect import Run, Sources, is_spec_argument
from .targets.inputs import parse_input


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


def _given_dtype(specs: list[Any] | None, settings: dict[str, Any], target: Any = None
                 ) -> dict[str, Any]:
    """Given tensors of one floating dtype (one device) set the run's dtype (so its tolerances)
    and device, unless the caller set them: the check runs where the values are, else where a
    module's parameters and buffers are."""
    import torch

    from .targets.values import ValueSpec, leaves

    given = [leaf.value for _, leaf in leaves([getattr(s, "spec", s) for s in specs or []])
             if isinstance(leaf, ValueSpec) and isinstance(leaf.value, torch.Tensor)]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in given if t.is_floating_point()}
    devices = {str(t.device) for t in given} or module_devices(target)
    found = {"dtype": dtypes.pop() if len(dtypes) == 1 else None,
             "device": devices.pop() if len(devices) == 1 else None}
    return {**{k: v for k, v in found.items() if v is not None}, **settings}


def _callable_reference(settings: dict[str, Any]) -> dict[str, Any]:
    """reference= given as a callable (a function, a Function class): kept in the config's
    extra, the setting itself its name (reports and reproducers show a name, never an object)."""
    reference = settings.get("reference")
    if reference is None or isinstance(reference, str):
        return settings
    if not callable(reference):
        raise GradtoolError(f"reference= takes a callable or 'module:fn', got "
                            f"{type(reference).__name__}", "e.g. reference=my_float64_fn")
    name = (f"{getattr(reference, '__module__', '?')}:"
            f"{getattr(reference, '__qualname__', type(reference).__name__)}")
    extra = {**settings.get("extra", {}), "reference": reference}
    return {**settings, "reference": name, "extra": extra}


def module_devices(target: Any) -> set[str]:
    """The devices of an nn.Module instance's parameters and buffers (empty for anything else)."""
    import torch

    if not isinstance(target, torch.nn.Module):
        return set()
    return {str(t.device) for t in [*target.parameters(), *target.buffers()]}


def sample(text: str) -> Any:
    """An input to sample, in the --input language ('3x4', '(5,)', '3x3:spd', '5', 'None'):
    explicit, so it can stand beside real tensors, where a plain string is passed as is."""
    return parse_input(text)


def check(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
          **settings: Any) -> Report:
    """Check a target (an object, or a 'module:Name' / 'file.py:Name' string).

    inputs: the positional forward arguments, like gradcheck's: tensors (checked at exactly those
    values, which are never modified), literals, --input strings ('3x4', '5', 'None') when no
    tensor is given (beside a tensor a string is passed as is), sample('3x4') anywhere, or
    tuples/lists/dicts of these; omitted, they are inferred. Which tensors are checked
    follows gradcheck: those that require grad if any does, else every floating one.
    kwargs: keyword arguments of forward, in the same forms. settings: any CheckConfig field
    (seed, dtype, eps, atol, rtol, nondet_tol, checks, mode, probes, ...).
    """
    from .render import terminal  # noqa: F401 - str(report) reads as the plain report

    specs = _input_specs(inputs, kwargs)
    settings = _callable_reference(_given_dtype(specs, settings, target))
    config = _config(settings)
    if isinstance(target, str) and is_spec_argument(target) and specs is not None:
        raise GradtoolError(f"{target} is a spec: its inputs come from the file")
    given = Sources(given=None if specs is None else tuple(specs))
    # The CLI's own run; an argument naming nothing (an empty spec folder) is an empty Report.
    return _quietly(Run((target,), config, given, empty_ok=True).report)


def _config(settings: dict[str, Any]) -> CheckConfig:
    """The CheckConfig of check's settings: an unknown name is an error naming it, the nearest
    setting and every other (not Python's bare TypeError); `checks` may be one name."""
    import dataclasses
    import difflib

    from .errors import ConfigError

    known = [f.name for f in dataclasses.fields(CheckConfig)]
    for name in settings:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"gradtool.check has no setting {name!r}: {hint}"
                              f"the settings are {', '.join(known)}")
    checks = settings.get("checks")
    if isinstance(checks, str):  # checks="gradient": one check, not its letters
        settings = {**settings, "checks": (checks,)}
    return CheckConfig(**{k: (tuple(v) if k == "checks" else v) for k, v in settings.items()})


def _quietly(fn: Any, *args: Any) -> Report:
    """torch's vmap-fallback notice is off while gradtool evaluates, then back on (its default;
    torch offers no way to read the setting)."""
    from .numerics.batching import silence_vmap_fallback

    silence_vmap_fallback()
    try:
        with torch_trace_silenced():
            return fn(*args)
    finally:
        silence_vmap_fallback(True)


@contextlib.contextmanager
def torch_trace_silenced() -> Iterator[None]:
    """torch's structured-trace logger (`torch.__trace`, always at DEBUG, emitting once any
    handler is attached: pytest attaches its capture handlers) is off while gradtool runs fake
    tensors and symbolic shapes, so a test's captured log holds the test's own records; its
    state is restored after."""
    import logging

    trace = logging.getLogger("torch.__trace")
    before, trace.disabled = trace.disabled, True
    try:
        yield
    finally:
        trace.disabled = before


def assert_gradients(target: Any, inputs: Any = None, kwargs: dict[str, Any] | None = None,
                     **settings: Any) -> Report:
    """Like check, but raise AssertionError with the plain-text report when anything fails."""
    __tracebackhide__ = True  # pytest shows the user's test line, not this one
    from .render.terminal import render_plain

    report = check(target, inputs, kwargs, **settings)
    if not report.ok(bool(settings.get("strict", False))):
        raise AssertionError("gradtool found gradient problems:\n" + render_plain(report, quiet=True))
    return report
