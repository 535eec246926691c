"""The run: one description (Run) of what to check, collected into jobs (or rejections) and run."""

from __future__ import annotations

import sys

import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config.settings import CheckConfig
from ..errors import GradtoolError, InputError, NothingToCheck, SpecError
from ..results import Rejected, Report
from ..targets.inputs import InputSpec
from ..targets.load import Target
from ..targets.resolve import make_target, resolve
from .reproduce import setting_flags
from .runner import CaseSpec, Job, run

SPEC_SUFFIXES = (".yaml", ".yml")


def is_spec_argument(arg: str) -> bool:
    """A YAML file or a folder is read as specs; anything else is a target."""
    path = Path(arg)
    return path.suffix in SPEC_SUFFIXES or path.is_dir()


@dataclass(frozen=True)
class Sources:
    """What the options give besides the targets, as typed: -i texts, --inputs-from, --init,
    --import and --sweep (parsed where collection runs: in a worker, the user's code), or the
    library's inputs already made into specs (`given`: the user's own values)."""

    inputs: tuple[str, ...] = ()
    inputs_from: str | None = None
    init: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    sweeps: tuple[str, ...] = ()
    given: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Run:
    """One run: what to check, where its cases come from, and its CheckConfig.

    The one description `gradtool check`/`list`/`graph` (in every worker: picklable, and
    deterministic), `gradtool.check` and the pytest plugin build. Its arguments are target
    strings, spec files or folders, objects (the library's) and loaded Specs (the plugin's).
    Where callers differ, a field says so: `empty_ok` makes an argument naming nothing (an
    empty spec folder) an empty Report, as the library wants, not the CLI's NothingToCheck."""

    arguments: tuple[Any, ...]
    config: CheckConfig
    sources: Sources = field(default_factory=Sources)
    empty_ok: bool = False

    def __call__(self) -> tuple[list[Job], list[Rejected]]:
        """The collection: (jobs, rejected)."""
        return collect(list(self.arguments), self.config, empty_ok=self.empty_ok,
                       **self.parsed())

    def report(self, progress: Callable[[int], Callable[[str], None] | None] | None = None
               ) -> Report:
        """Collect, then run every job in this process (runner.run: a failure never stops the
        others); progress(number of jobs) may give a callback told each target's name. Its
        duration counts the collection too."""
        start = time.perf_counter()
        jobs, rejected = self()
        return run(jobs, self.config, rejected, progress(len(jobs)) if progress else None,
                   start)

    def parsed(self) -> dict[str, Any]:
        """The sources parsed: input specs, a factory's cases, constructor arguments, sweeps."""
        from ..targets.factory import parse_init
        from ..targets.inputs import parse_input
        from ..targets.sizes import parse_sweep

        sources, config = self.sources, self.config
        inputs = list(sources.given) if sources.given is not None else \
            [parse_input(text) for text in sources.inputs] if sources.inputs else None
        cases = None
        if sources.inputs_from:
            if inputs is not None:
                raise GradtoolError("give --input or --inputs-from, not both")
            from ..targets.factory import load_inputs

            cases = [CaseSpec(label, specs, config.seed, sources.inputs_from)
                     for label, specs in load_inputs(sources.inputs_from, config.seed,
                                                     config.dtype, config.device)]
        return {"inputs": inputs, "cases": cases, "init": parse_init(sources.init),
                "imports": sources.imports, "sweeps": [parse_sweep(t) for t in sources.sweeps]}


def collect(arguments: list[str], config: CheckConfig, inputs: list[Any] | None = None,
            cases: list[CaseSpec] | None = None, init: dict[str, Any] | None = None,
            imports: tuple[str, ...] = (), sweeps: list[Any] | None = None,
            empty_ok: bool = False) -> tuple[list[Job], list[Rejected]]:
    """Every argument's jobs, and the rejections (a bad argument does not stop the others;
    one bad argument alone is its own short error, exit 2; nothing at all is NothingToCheck
    unless empty_ok)."""
    if imports:  # before any target: they register the ops named as ns::name
        from ..targets.ops import import_all

        import_all(imports)
    jobs: list[Job] = []
    rejected: list[Rejected] = []
    errors = []
    for arg in arguments:
        try:
            found, bad = collect_one(arg, config, inputs, cases, init, imports, sweeps)
        except GradtoolError as exc:
            errors.append(exc)
            rejected.append(Rejected(str(arg), str(exc)))
            continue
        jobs += found
        rejected += bad
    if not jobs and errors and len(errors) == len(rejected):
        raise errors[0]
    if not jobs and not rejected and not empty_ok:
        raise NothingToCheck(f"nothing to check in {', '.join(map(str, arguments))}")
    return jobs, rejected


def collect_one(arg: Any, config: CheckConfig, inputs: list[InputSpec] | None = None,
                cases: list[CaseSpec] | None = None, init: dict[str, Any] | None = None,
                imports: tuple[str, ...] = (), sweeps: list[Any] | None = None
                ) -> tuple[list[Job], list[Rejected]]:
    """The jobs one argument (a target string, spec path, object or Spec) names; invalid spec
    files become Rejected entries.

    Raises GradtoolError when a target cannot be resolved at all."""
    text = isinstance(arg, str)
    if not text and _is_spec(arg):  # loaded already (the plugin's specs)
        return spec_jobs(arg, config), []
    if text and is_spec_argument(arg):
        if sweeps:
            raise InputError(f"--sweep applies to -i shapes; {arg} is a spec",
                             "give the spec its own sweep: {D: [15, 16, 17]}")
        return collect_specs(arg, config)
    if inputs is not None or sweeps:
        cases = swept_cases(inputs or [], sweeps or [], config.seed) or cases
    given = inputs if cases is None else None
    if not text:  # the library's object
        return object_jobs(arg, config, given, cases), []
    return target_jobs(arg, config, given, cases, init, imports), []


def _is_spec(arg: Any) -> bool:
    # A loaded Spec means spec/ is imported: never imported for that question alone (~80 ms of
    # YAML and schema on the first gradtool.check of a process).
    schema = sys.modules.get("gradtool.spec.schema")
    return schema is not None and isinstance(arg, schema.Spec)


def swept_cases(inputs: list[Any], sweeps: list[Any], seed: int, base: str = "",
                where: str = "--sweep") -> list[CaseSpec] | None:
    """One case per combination of swept sizes (None: no size symbol and no sweep)."""
    from ..targets.sizes import sweep_cases

    found = sweep_cases(inputs, sweeps, where)
    return [CaseSpec(f"{base}{label}", specs, seed) for label, specs in found] or None


def target_jobs(arg: str, config: CheckConfig, inputs: list[InputSpec] | None,
                cases: list[CaseSpec] | None = None, init: dict[str, Any] | None = None,
                imports: tuple[str, ...] = ()) -> list[Job]:
    """Jobs for a target string; raises GradtoolError (exit 2) when it cannot be resolved."""
    targets = resolve(arg, init=init, imports=imports)
    given = "--input" if inputs is not None else "--inputs-from" if cases else "--init"
    if (inputs is not None or cases or init) and len(targets) > 1:
        raise GradtoolError(f"{arg} holds {len(targets)} targets; {given} applies to one",
                            "name one: " + ", ".join(t.name for t in targets[:4]))
    if init and (not targets[0].kind.parameters or not inspect.isclass(targets[0].obj)):
        what = "module instance" if targets[0].kind.parameters else targets[0].kind
        raise GradtoolError(f"--init applies to an nn.Module class; {arg} is a {what}",
                            "drop --init, or name the class")
    jobs = [Job(t, cases or [CaseSpec("case 0", inputs, config.seed)], config) for t in targets]
    _refuse_shape_literals(jobs)
    return jobs


def _refuse_shape_literals(jobs: list[Job]) -> None:
    """-i 64 or -i 3,4 where the signature takes a tensor: refused before the target runs."""
    from ..targets.inputs import refuse_shape_literals

    for job in jobs:
        for case in job.cases:
            refuse_shape_literals(job.target, case.inputs)


def object_jobs(obj: Any, config: CheckConfig, inputs: list[InputSpec] | None,
                cases: list[CaseSpec] | None = None) -> list[Job]:
    """The job of an object given to the library, named as a command line would load it (a
    Function given as MyFunction.apply by its class, everywhere: report, JSON, reproduce:)."""
    from ..targets.kinds import FUNCTION

    owner = getattr(obj, "__self__", None)
    obj = owner if FUNCTION.claims(owner) else obj
    loadable = _loadable_name(obj)
    name = loadable or (f"{getattr(obj, '__module__', '?')}:"
                        f"{getattr(obj, '__qualname__', type(obj).__name__)}")
    target = make_target(obj, name)
    # An op names itself reproducibly (file.py:ns::name); other unloadable objects say how.
    reproduce = None if loadable or target.kind.named_reproducibly \
        else _python_reproduce(obj, config.seed)
    jobs = [Job(target, cases or [CaseSpec("case 0", inputs, config.seed)], config,
                reproduce=reproduce)]
    _refuse_shape_literals(jobs)
    return jobs


def _loadable_name(obj: Any) -> str | None:
    """'module:Name' that the command line loads back to this very object (torch:sin,
    pkg.mod:MyFunction), or None: a lambda, a local function, an instance, __main__."""
    import importlib

    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or module == "__main__":
        return None
    for name in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if not isinstance(name, str) or "<" in name:
            continue
        try:
            found: Any = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part)
        except Exception:  # noqa: BLE001 - not importable by that name: try the next
            continue
        if found is obj:  # as a command line in the working directory loads it
            from .reproduce import loadable_location

            return f"{loadable_location(module)}:{name}"
    return None


def _python_reproduce(obj: Any, seed: int) -> str:
    """How to reproduce an object no command line can load: the call, in Python (the one an
    object made by gradtool itself declares: the drop-in's gradgradcheck)."""
    declared = getattr(obj, "gradtool_reproduce", None)
    if isinstance(declared, str):
        return declared
    qualname = getattr(obj, "__qualname__", "") or ""
    what = "lambda" if "<lambda>" in qualname else (
        "local function" if "<locals>" in qualname else
        "class" if inspect.isclass(obj) else type(obj).__name__)
    code = getattr(obj, "__code__", None)
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return (f"gradtool.check(<the {what}{where}>, <the same inputs>, seed={seed}) in Python "
            "(it has no module:Name a command line can load; give it a module-level name for "
            "one)")


def collect_specs(arg: str, config: CheckConfig) -> tuple[list[Job], list[Rejected]]:
    from ..spec.schema import find_spec_files, load_file

    path = Path(arg)
    if not path.exists():
        raise GradtoolError(f"spec path not found: {arg}", "check the path")
    files = find_spec_files(path)
    jobs, rejected = [], []
    for file in files:
        try:
            jobs += [job for spec in load_file(file) for job in spec_jobs(spec, config)]
        except GradtoolError as exc:
            rejected.append(Rejected(str(file), str(exc)))
    return jobs, rejected


def spec_jobs(spec, config: CheckConfig) -> list[Job]:
    """One job per spec: its target (or expr), its cases and its settings."""
    job_config = config.with_(**{k: (tuple(v) if k == "checks" else v)
                                 for k, v in spec.config.items()})
    if "ignore" in spec.config:  # a spec's ignored rules add to the project's
        job_config = job_config.with_(ignore=tuple(dict.fromkeys(
            (*config.ignore, *spec.config["ignore"]))))
    target = _spec_target(spec, config.trust_callables)
    seed = job_config.seed
    cases = [CaseSpec(c.label, list(c.inputs) if c.inputs else None,
                      c.seed if c.seed is not None else seed) for c in spec.cases] or \
        [CaseSpec("case 0", None, seed)]
    if spec.inputs_from:
        cases = _factory_cases(spec, job_config)
    return [Job(target, cases, job_config, dict(spec.check_config), dict(spec.xfail),
                spec.surrogate, f"{spec.path}:{spec.line}",
                reproduce=" ".join(["gradtool", "check", str(spec.path),
                                     *setting_flags(config, skip=tuple(spec.config))]))]


def _factory_cases(spec, config: CheckConfig) -> list[CaseSpec]:
    from ..targets.factory import load_inputs

    try:
        found = load_inputs(spec.inputs_from, config.seed, config.dtype, config.device)
    except GradtoolError as exc:
        raise SpecError(exc.message, path=spec.path, line=spec.line, key="inputs_from",
                        hint=exc.hint) from None
    return [CaseSpec(label, specs, config.seed, spec.inputs_from) for label, specs in found]


def _spec_target(spec, trust_callables: bool = False) -> Target:
    from ..spec.trust import check_trusted

    try:
        if spec.expr is not None:
            return _expr_target(spec)
        targets = resolve(spec.target, init=spec.init)
        if len(targets) == 1:
            check_trusted(targets[0], spec, trust_callables)
    except SpecError:
        raise
    except GradtoolError as exc:
        raise SpecError(str(exc), path=spec.path, line=spec.line, key="target") from None
    if len(targets) != 1:
        raise SpecError("target must name one Function, Module or callable",
                        path=spec.path, line=spec.line, key="target")
    target = targets[0]
    target.name = spec.name or target.name
    return target


def _expr_target(spec) -> Target:
    from ..spec.exprs import compile_expr

    names = [i.name for i in spec.cases[0].inputs] if spec.cases else []
    fn = compile_expr(spec.expr, names)
    target = make_target(fn, spec.name)
    target.arg_names = tuple(names)
    target.signature = None
    target.qualname = f"expr: {spec.expr}"
    target.source = f"{spec.path}:{spec.line}"
    return target
