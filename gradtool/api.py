"""Library API: gradtool.check returns a Report (never prints, never exits); assert_gradients raises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .config.settings import CheckConfig
from .errors import GradtoolError
from .results import Report
from .run.collect import collect_one, is_spec_argument
from .run.runner import CaseSpec, Job, run
from .targets.inputs import InputSpec, LiteralSpec, TensorSpec, parse_input
from .targets.load import make_target


def _input_spec(value: InputSpec | str) -> InputSpec:
    if isinstance(value, str):
        return parse_input(value)
    if isinstance(value, (TensorSpec, LiteralSpec)):
        return value
    raise TypeError(f"inputs takes --input strings ('3x4', '5') or TensorSpec/LiteralSpec, "
                    f"got {type(value).__name__}; gradtool samples tensors itself (seeded)")


def check(target: Any, inputs: Sequence[InputSpec | str] | None = None, **settings: Any
          ) -> Report:
    """Check a target (an object, or a 'module:Name' / 'file.py:Name' string).

    inputs: one per forward argument, as InputSpec objects or --input strings ('3x4',
    '5', 'None'); omitted, they are inferred. settings: any CheckConfig field (seed, dtype,
    eps, atol, rtol, nondet_tol, checks, mode, probes, ...).
    """
    config = CheckConfig(**{k: (tuple(v) if k == "checks" else v) for k, v in settings.items()})
    specs = None if inputs is None else [_input_spec(i) for i in inputs]
    if isinstance(target, str):
        if is_spec_argument(target) and specs is not None:
            raise GradtoolError(f"{target} is a spec: its inputs come from the file")
        jobs, rejected = collect_one(target, config, specs)  # the CLI's own collection
        return run(jobs, config, rejected)
    name = (f"{getattr(target, '__module__', '?')}:"
            f"{getattr(target, '__qualname__', type(target).__name__)}")
    jobs = [Job(make_target(target, name), [CaseSpec("case 0", specs, config.seed)], config)]
    return run(jobs, config)


def assert_gradients(target: Any, inputs: Sequence[InputSpec | str] | None = None,
                     **settings: Any) -> Report:
    """Like check, but raise AssertionError with the plain-text report when anything fails."""
    from .render.terminal import render_plain

    report = check(target, inputs, **settings)
    if not report.ok(bool(settings.get("strict", False))):
        raise AssertionError("gradtool found gradient problems:\n" + render_plain(report, quiet=True))
    return report
