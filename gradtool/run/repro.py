"""--repro DIR: for each failing target, a shrunk case written as a standalone pytest file."""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config.settings import CheckConfig
from ..errors import GradtoolError
from ..results import CaseResult, Outcome, Report, Reproducer, TargetResult
from ..targets.inputs import Keyword, LiteralSpec, TensorSpec
from .reproduce import _cli_input
from .runner import CaseSpec, Job
from .shrink import MAX_VALUES, Shrunk, shrink

DEFAULT_BUDGET = 40
# CheckConfig fields a reproducer passes on when they differ from the defaults.
SETTINGS = ("dtype", "eps", "atol", "rtol", "nondet_tol", "mode", "probes", "autocast",
            "reference", "masked")


def write_reproducers(report: Report, jobs: Sequence[Job], folder: str,
                      budget: int = DEFAULT_BUDGET) -> tuple[Reproducer, ...]:
    """A test file per failing target (nothing at all for a passing run)."""
    written: list[Reproducer] = []
    names: set[str] = set()
    for target in report.targets:
        found = _first_failure(target)
        job = next((j for j in jobs if j.target.name == target.target), None)
        if found is None or job is None:
            continue
        case, check = found
        written.append(_one(job, case, check, Path(folder), budget, names))
    return tuple(written)


def _first_failure(target: TargetResult) -> tuple[CaseResult, str] | None:
    for case in target.cases:
        for check in case.checks:
            if check.outcome is Outcome.FAILED:
                return case, check.name
    return None


def _one(job: Job, case: CaseResult, check: str, folder: Path, budget: int,
         names: set[str]) -> Reproducer:
    def skipped(why: str, checks_run: int = 0) -> Reproducer:
        return Reproducer(job.target.name, "", check, "", "", "", checks_run, budget,
                          f"not written: {why}")

    if job.surrogate is not None:
        return skipped("the spec's surrogate cannot be replayed by assert_gradients")
    if job.target.init:
        return skipped("a module class built with --init; check an instance instead")
    spec = next((s for s in job.cases if case.label.startswith(s.label)), job.cases[0])
    shrunk = shrink(job, CaseSpec(case.label, spec.inputs, case.seed, spec.origin), check,
                    budget)
    if shrunk is None:
        return skipped(f"the {check} check does not fail the same way when run again here")
    if not all(_leaf(s) for s in shrunk.specs):
        return skipped("nested inputs are not written yet", shrunk.checks_run)
    name = _file_name(job.target, names)
    path = folder / f"test_{name}.py"
    config = job.config.with_(**job.check_config.get(check, {}))
    try:
        folder.mkdir(parents=True, exist_ok=True)  # a large given value is saved beside first
        text = test_source(_target_text(job, folder), name, shrunk, config, path)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GradtoolError(f"cannot write --repro {path}: {exc.strerror or exc}",
                            "check that the folder is writable") from None
    notes = [n for n, on in (("budget exhausted", shrunk.exhausted),
                             ("values simplified", shrunk.values), (shrunk.note, shrunk.note))
             if on]
    return Reproducer(job.target.name, str(path), check, shrunk.kind, shrunk.before,
                      shrunk.after, shrunk.checks_run, budget, ", ".join(notes))


def _leaf(spec: Any) -> bool:
    from ..targets.values import ValueSpec

    inner = spec.spec if isinstance(spec, Keyword) else spec
    return isinstance(inner, (TensorSpec, LiteralSpec, ValueSpec))


def _file_name(target: Any, names: set[str]) -> str:
    stem = re.sub(r"\W+", "_", target.name.rpartition(":")[2] or target.qualname).strip("_")
    stem = stem or "target"
    name, k = stem, 2
    while name in names:
        name, k = f"{stem}_{k}", k + 1
    names.add(name)
    return name


def _target_text(job: Job, folder: Path) -> str:
    """A Python expression for the target string, a file path relative to the test file (so
    the folder can move with the code), or the importable module:Name."""
    location, sep, name = job.target.name.rpartition(":")
    if not sep or not location.endswith(".py"):
        if sep and "/" not in location:
            return repr(job.target.name)  # module:Name
        obj = job.target.function_cls or job.target.obj  # a spec's target: its class's file
        obj = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
        location, name = inspect.getsourcefile(obj) or "", obj.__qualname__
    file, here = Path(location).resolve(), folder.resolve()
    if os.path.commonpath([file, here]) == file.anchor:  # nothing shared: an absolute path
        return repr(f"{file.as_posix()}:{name}")
    relative = Path(os.path.relpath(file, here)).as_posix()
    return f'str(HERE / {relative!r}) + {":" + name!r}'


def test_source(target: str, name: str, shrunk: Shrunk, config: CheckConfig,
                path: Path) -> str:
    """The standalone test: its inputs, then one assert_gradients call."""
    values = [(k, s) for k, s in enumerate(shrunk.specs) if _is_value(s)]
    lines = ['"""Minimal reproducer written by `gradtool check --repro`.',
             "",
             f"The {shrunk.check} check of {name} fails: {shrunk.kind}.",
             f"Shrunk {shrunk.before} -> {shrunk.after} in {shrunk.checks_run} checks"
             + (" (values simplified)." if shrunk.values else "."),
             "It fails while the bug is there and passes once it is fixed.",
             "Run it with pytest, or with python (which runs the test too).",
             '"""', "", "from pathlib import Path", ""]
    device = _device(config, [_inner(s).value for _, s in values])
    if device is not None:
        lines.append("import pytest")
    if values or device is not None:
        lines.append("import torch")
    lines += ["import gradtool", "", "HERE = Path(__file__).resolve().parent",
              f"TARGET = {target}", "", "", f"def test_{name}():"]
    if device is not None:  # replayed where it failed, or skipped saying what it needs
        lines += ["    if not torch.cuda.is_available():",
                  f"        pytest.skip('this reproducer runs on {device}: it needs CUDA')"]
    big = [(k, s) for k, s in values if _inner(s).value.numel() > MAX_VALUES]
    if big:  # too many to write out: saved beside the test
        import torch

        saved = path.with_suffix(".inputs.pt")
        torch.save({str(k): _inner(s).value.detach().clone() for k, s in big}, saved)
        lines.append(f"    saved = torch.load(HERE / {saved.name!r})")
    inputs, kwargs = [], []
    for k, spec in enumerate(shrunk.specs):
        inner = _inner(spec)
        if _is_value(spec):
            lines.append(f"    v{k} = {_tensor_text(inner, k, big)}")
            text = f"v{k}"
        else:
            text = repr(_cli_input(inner, config))
        (kwargs if isinstance(spec, Keyword) else inputs).append(
            f"{spec.name!r}: {text}" if isinstance(spec, Keyword) else text)
    call = [f"TARGET, [{', '.join(inputs)}]"]
    if kwargs:
        call.append("kwargs={" + ", ".join(kwargs) + "}")
    call.append(f"seed={shrunk.seed}")
    call.append(f"checks=[{shrunk.check!r}]")
    defaults = CheckConfig()
    call += [f"{key}={getattr(config, key)!r}" for key in SETTINGS
             if getattr(config, key) != getattr(defaults, key)]
    lines.append(f"    gradtool.assert_gradients({', '.join(call)})")
    # without it, `python FILE` defines the test, runs nothing and exits 0: read as a pass
    lines += ["", "", 'if __name__ == "__main__":', f"    test_{name}()",
              f"    print('test_{name} passed')"]
    return "\n".join(lines) + "\n"


def _inner(spec: Any) -> Any:
    return spec.spec if isinstance(spec, Keyword) else spec


def _is_value(spec: Any) -> bool:
    from ..targets.values import ValueSpec

    inner = _inner(spec)
    return isinstance(inner, ValueSpec) and hasattr(inner.value, "numel")


def _tensor_text(spec: Any, k: int, big: list[tuple[int, Any]]) -> str:
    value = spec.value
    grad = ".requires_grad_(True)" if spec.requires_grad else ""
    if any(j == k for j, _ in big):
        return f"saved[{str(k)!r}]{grad}"
    dtype = str(value.dtype).removeprefix("torch.")
    place = "" if value.device.type == "cpu" else f"device={str(value.device)!r}, "
    return (f"torch.tensor({value.tolist()!r}, dtype=torch.{dtype}, {place}"
            f"requires_grad={spec.requires_grad})")


def _device(config: CheckConfig, values: Sequence[Any]) -> str | None:
    """The CUDA device the failure happened on (the run's, or a given value's), else None."""
    for device in [config.device, *(str(v.device) for v in values)]:
        if str(device).startswith("cuda"):
            return str(device)
    return None
