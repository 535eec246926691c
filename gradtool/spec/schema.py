"""YAML op specs: the Spec model, and whole-file validation whose errors name file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError, did_you_mean
from ..targets.inputs import LiteralSpec, TensorSpec
from ..targets.values import Keyword
from .ops import op_reference
from .surrogates import Surrogate, make_surrogate
from .values import InputReader, read_setting, resolve_reference, swept
from .yaml_lines import MAX_BYTES, LineDict, LineList, line_of, plain, read_yaml, show

InputSpec = TensorSpec | LiteralSpec

FILE_KEYS = ("version", "specs")
CONFIG_KEYS = ("seed", "dtype", "device", "eps", "atol", "rtol", "nondet_tol", "mode", "checks",
               "reference", "autocast", "timeout", "ignore", "masked")
SPEC_KEYS = ("name", "target", "expr", "init", "inputs", "kwargs", "inputs_from", "cases",
             *CONFIG_KEYS, "tolerances", "xfail", "surrogate", "trust_callable", "op", "import")
CASE_KEYS = ("name", "seed", "inputs")
MAX_ERRORS = 50


@dataclass(frozen=True)
class SpecCase:
    """One input set of a spec."""

    label: str
    inputs: tuple[InputSpec, ...]
    seed: int | None = None


@dataclass(frozen=True)
class Spec:
    """One validated spec: what to check, on which inputs, with which settings and declarations."""

    path: str
    line: int
    name: str
    target: str | None
    expr: str | None
    init: dict[str, Any] | list[Any] | None
    cases: tuple[SpecCase, ...]   # () = no inputs declared: infer them as the CLI does
    config: dict[str, Any] = field(default_factory=dict)
    check_config: dict[str, dict[str, float]] = field(default_factory=dict)
    surrogate: Surrogate | None = None
    xfail: dict[str, str] = field(default_factory=dict)
    inputs_from: str | None = None  # a factory (file.py:name, module:name) or a .pt file
    trust_callable: bool = False  # the spec opts in to running a package's plain callable

    @property
    def input_names(self) -> tuple[str | None, ...]:
        return tuple(spec.name for spec in self.cases[0].inputs) if self.cases else ()


class SpecFileError(SpecError):
    """All the errors of one spec file; `errors` lists them, str() shows one per line."""

    def __init__(self, errors: list[SpecError]) -> None:
        more = "\n".join(str(e) for e in errors)
        super().__init__(more)
        first = errors[0]
        self.path, self.line, self.key, self.errors = first.path, first.line, first.key, errors


def find_spec_files(path: str | Path) -> list[Path]:
    """A file itself, or every *.yaml / *.yml under a directory (hidden ones skipped), sorted."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SpecError(f"no such file or directory: {str(path)!r}")
    found = [p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(found)


def load_file(path: str | Path) -> list[Spec]:
    """Read and validate a spec file; raise SpecFileError (a SpecError) listing every problem."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read the spec file: {exc.strerror or exc}", path=str(path)) \
            from None
    return load_text(data, str(path), Path(path).resolve().parent)


def load_text(data: str | bytes, path: str = "<spec>", base_dir: Path | None = None) -> list[Spec]:
    """Validate spec text as if it were the file `path` in folder `base_dir` (default: cwd)."""
    tree = read_yaml(data, path)
    validator = _Validator(path, (base_dir or Path.cwd()).resolve())
    specs = validator.file(tree)
    if validator.errors:
        raise SpecFileError(sorted(validator.errors, key=lambda e: e.line or 0))  # stable
    return specs


class _Validator:
    """Walks the YAML data, collecting every error (up to MAX_ERRORS) before giving up."""

    def __init__(self, path: str, base_dir: Path) -> None:
        self.path, self.base_dir, self.errors = path, base_dir, []
        self.inputs = InputReader(self.error)

    def error(self, message: str, key: str | None, line: int | None,
              hint: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(SpecError(message, path=self.path, line=line, key=key, hint=hint))

    def unknown_keys(self, data: LineDict, allowed: tuple[str, ...], key: str) -> None:
        for name in data:
            if name not in allowed:
                self.error(f"unknown key {show(name)}; allowed: {', '.join(allowed)}",
                           _join(key, str(name)), line_of(data, name, data.line),
                           did_you_mean(str(name), allowed))

    def file(self, tree: Any) -> list[Spec]:
        if not isinstance(tree, LineDict):
            self.error(f"a spec file is a mapping with version: 1 and specs: [...], got "
                       f"{show(tree)}", None, getattr(tree, "line", 1))
            return []
        self.unknown_keys(tree, FILE_KEYS, "")
        version = tree.get("version")
        if "version" not in tree:
            self.error("missing version: 1 (the spec format version)", None, tree.line)
        elif version != 1 or isinstance(version, bool):
            self.error(f"unsupported format version {show(version)}; this gradtool reads version 1",
                       "version", line_of(tree, "version"))
        entries = tree.get("specs")
        if not isinstance(entries, LineList) or not entries:
            self.error(f"expected a non-empty list of specs, got {show(entries)}", "specs",
                       line_of(tree, "specs", tree.line))
            return []
        specs = [self.spec(item, f"specs[{i}]", entries.item_lines[i])
                 for i, item in enumerate(entries)]
        self.unique_names([s for s in specs if s is not None])
        return [s for s in specs if s is not None]

    def unique_names(self, specs: list[Spec]) -> None:
        seen: dict[str, int] = {}
        for spec in specs:
            if spec.name in seen:
                self.error(f"duplicate spec name {spec.name!r} (first at line {seen[spec.name]}); "
                           "give one of them a different name:", "name", spec.line)
            seen.setdefault(spec.name, spec.line)

    def spec(self, data: Any, key: str, line: int) -> Spec | None:
        if not isinstance(data, LineDict):
            self.error(f"expected a mapping with target: or expr:, got {show(data)}", key, line)
            return None
        before = len(self.errors)
        self.unknown_keys(data, (*SPEC_KEYS, "sweep"), key)
        if ("target" in data) + ("expr" in data) + ("op" in data) != 1:
            self.error("give exactly one of target: (file.py:Name or module:Name), op: or expr:",
                       key, line)
        cases = swept(self.with_kwargs(self.cases(data, key), data, key), data, key, self.error)
        inputs_from = self.inputs_from(data, key, cases)
        names = tuple(s.name for s in cases[0].inputs) if cases else None
        target = self.target(data, key)
        expr = self.expr(data, key, names)
        config = self.config(data, key)
        spec = Spec(path=self.path, line=line, name=self.name(data, key, target, expr),
                    target=target, expr=expr, init=self.init(data, key), cases=cases,
                    config=config, check_config=self.tolerances(data, key),
                    surrogate=self.surrogate(data, key, names),
                    xfail=self.xfail(data, key, config.get("checks")), inputs_from=inputs_from,
                    trust_callable=self.trust_callable(data, key))
        return spec if len(self.errors) == before else None

    def name(self, data: LineDict, key: str, target: str | None, expr: str | None) -> str:
        value = data.get("name")
        if "name" in data and (not isinstance(value, str) or not value.strip()):
            self.error(f"expected a non-empty string, got {show(value)}", _join(key, "name"),
                       line_of(data, "name"))
        if isinstance(value, str) and value.strip():
            return value.strip()
        if target:
            return target.rpartition(":")[2]
        return " ".join(str(expr or data.get("target") or "?").split())

    def target(self, data: LineDict, key: str) -> str | None:
        if "target" not in data or "import" in data:  # op: ns::name after import:, or None
            return op_reference(self, data, key)
        try:
            return resolve_reference(data["target"], self.base_dir)
        except SpecError as exc:
            self.error(exc.message, _join(key, "target"), line_of(data, "target"), exc.hint)
            return None

    def reference(self, data: LineDict, key: str) -> str | None:
        """The float64 reference of a low-precision kernel: 'file.py:fn' or 'module:fn'."""
        try:
            return resolve_reference(data["reference"], self.base_dir)
        except SpecError as exc:
            self.error(exc.message, _join(key, "reference"), line_of(data, "reference"), exc.hint)
            return None

    def expr(self, data: LineDict, key: str, names: tuple[str | None, ...] | None) -> str | None:
        if "expr" not in data:
            return None
        text, where, line = data["expr"], _join(key, "expr"), line_of(data, "expr")
        if names is None or None in names:
            if "inputs" not in data and "cases" not in data or names is not None:
                self.error("an expr needs inputs:, each with a name: for the variable it is",
                           where, line)
            return None
        from .exprs import compile_expr

        try:
            compile_expr(text, [n or "" for n in names])
        except SpecError as exc:
            self.error(exc.message, where, line, exc.hint)
            return None
        for label in ("init", "surrogate"):
            if label in data:
                self.error(f"{label}: applies to a target:, not to an expr", _join(key, label),
                           line_of(data, label))
        return text

    def trust_callable(self, data: LineDict, key: str) -> bool:
        value = data.get("trust_callable", False)
        if not isinstance(value, bool):
            self.error(f"expected true or false, got {show(value)}",
                       _join(key, "trust_callable"), line_of(data, "trust_callable"))
            return False
        return value

    def init(self, data: LineDict, key: str) -> dict[str, Any] | list[Any] | None:
        value = data.get("init")
        if value is None:
            return None
        if isinstance(value, LineDict) and all(isinstance(k, str) for k in value):
            return plain(value)
        if isinstance(value, LineList):
            return plain(value)
        self.error(f"expected a mapping of keyword arguments or a list of positional arguments, "
                   f"got {show(value)}", _join(key, "init"), line_of(data, "init"))
        return None

    def with_kwargs(self, cases: tuple[SpecCase, ...], data: LineDict, key: str
                    ) -> tuple[SpecCase, ...]:
        """kwargs: {name: description} -> keyword arguments added to every case."""
        value, where = data.get("kwargs"), _join(key, "kwargs")
        if value is None:
            return cases
        if not isinstance(value, LineDict) or not value:
            self.error(f"expected a mapping {{keyword name: input description}}, got "
                       f"{show(value)}", where, line_of(data, "kwargs"))
            return cases
        keywords = []
        for name, desc in value.items():
            if self.inputs.name(name, f"{where}.{name}", line_of(value, name)):
                spec = self.inputs.describe(desc, f"{where}.{name}", line_of(value, name),
                                            name, None)
                keywords += [Keyword(name, getattr(spec, "spec", spec))] if spec else []
        return tuple(SpecCase(c.label, (*c.inputs, *keywords), c.seed)
                     for c in cases or (SpecCase("case 0", ()),))

    def inputs_from(self, data: LineDict, key: str, cases: tuple[SpecCase, ...]) -> str | None:
        """inputs_from: file.py:name / module:name / file.pt, checked without importing."""
        value, where = data.get("inputs_from"), _join(key, "inputs_from")
        if value is None:
            return None
        if cases:
            self.error("give inputs:/kwargs:/cases: or inputs_from:, not both", where,
                       line_of(data, "inputs_from"))
            return None
        try:
            if isinstance(value, str) and value.endswith(".pt"):
                path = (self.base_dir / value).resolve()
                if not path.is_relative_to(self.base_dir) or not path.is_file():
                    raise SpecError(f"file {value!r} not found in the spec's folder (or below)")
                return str(path)
            return resolve_reference(value, self.base_dir)
        except SpecError as exc:
            self.error(exc.message, where, line_of(data, "inputs_from"), exc.hint)
            return None

    def cases(self, data: LineDict, key: str) -> tuple[SpecCase, ...]:
        base = None
        if "inputs" in data:
            base = self.inputs.read_list(data["inputs"], _join(key, "inputs"),
                                         line_of(data, "inputs"))
            if base is None:
                return ()  # already reported; the cases would only repeat it
        if "cases" not in data:
            return (SpecCase("case 0", tuple(base)),) if base is not None else ()
        value, where = data["cases"], _join(key, "cases")
        if not isinstance(value, LineList) or not value:
            self.error(f"expected a non-empty list of cases, got {show(value)}", where,
                       line_of(data, "cases"))
            return ()
        cases = [self.case(item, f"{where}[{i}]", value.item_lines[i], i, base)
                 for i, item in enumerate(value)]
        result = tuple(c for c in cases if c is not None)
        self.same_names(result, value, where)
        return result

    def case(self, data: Any, key: str, line: int, index: int,
             base: list[InputSpec] | None) -> SpecCase | None:
        if not isinstance(data, LineDict):
            self.error(f"expected a mapping with name:, seed: and inputs:, got {show(data)}",
                       key, line)
            return None
        self.unknown_keys(data, CASE_KEYS, key)
        label = data.get("name", f"case {index}")
        if not isinstance(label, str) or not label.strip():
            self.error(f"expected a non-empty string, got {show(label)}", _join(key, "name"),
                       line_of(data, "name"))
        seed = self.seed(data, key) if "seed" in data else None
        if "inputs" not in data and base is None:
            self.error("this case has no inputs: and the spec declares none", key, line)
            return None
        inputs = self.inputs.read_case(data.get("inputs"), base, _join(key, "inputs"),
                                       line_of(data, "inputs", line))
        return SpecCase(str(label), tuple(inputs), seed) if inputs is not None else None

    def same_names(self, cases: tuple[SpecCase, ...], value: LineList, key: str) -> None:
        # Reports and exprs name inputs; every case must describe the same arguments.
        names = [tuple(s.name for s in c.inputs) for c in cases]
        for i, case_names in enumerate(names[1:], 1):
            if case_names != names[0]:
                self.error(f"inputs named {list(case_names)}, but the first case has "
                           f"{list(names[0])}; every case takes the same arguments", f"{key}[{i}]",
                           value.item_lines[i] if i < len(value.item_lines) else value.line)

    def seed(self, data: LineDict, key: str) -> int | None:
        value = data.get("seed")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            self.error(f"expected a non-negative integer, got {show(value)}", _join(key, "seed"),
                       line_of(data, "seed"))
            return None
        return value

    def config(self, data: LineDict, key: str) -> dict[str, Any]:
        result = {}
        for name in CONFIG_KEYS:
            if name in data:
                value = self.seed(data, key) if name == "seed" else \
                    self.reference(data, key) if name == "reference" else read_setting(
                        name, data[name], _join(key, name), line_of(data, name), self.error)
                if value is not None:
                    result[name] = value
        return result

    def tolerances(self, data: LineDict, key: str) -> dict[str, dict[str, float]]:
        from ..config.settings import CHECK_NAMES

        value, where = data.get("tolerances"), _join(key, "tolerances")
        if value is None:
            return {}
        if not isinstance(value, LineDict):
            self.error(f"expected a mapping of check name to {{eps, atol, rtol, nondet_tol}}, "
                       f"got {show(value)}", where, line_of(data, "tolerances"))
            return {}
        self.unknown_keys(value, CHECK_NAMES, where)
        result: dict[str, dict[str, float]] = {}
        for check, settings in value.items():
            sub = _join(where, str(check))
            if check not in CHECK_NAMES:
                continue
            if not isinstance(settings, LineDict):
                self.error(f"expected a mapping of eps/atol/rtol/nondet_tol, got {show(settings)}",
                           sub, line_of(value, check))
                continue
            self.unknown_keys(settings, ("eps", "atol", "rtol", "nondet_tol"), sub)
            result[check] = {
                name: parsed for name, raw in settings.items()
                if name in ("eps", "atol", "rtol", "nondet_tol") and (parsed := read_setting(
                    name, raw, _join(sub, name), line_of(settings, name), self.error)) is not None}
        return result

    def xfail(self, data: LineDict, key: str, checks: tuple[str, ...] | None) -> dict[str, str]:
        from ..config.settings import CHECK_NAMES

        value, where = data.get("xfail"), _join(key, "xfail")
        if value is None:
            return {}
        if not isinstance(value, LineDict):
            self.error(f"expected a mapping of check name to the reason it fails, got "
                       f"{show(value)}", where, line_of(data, "xfail"))
            return {}
        self.unknown_keys(value, CHECK_NAMES, where)
        result = {}
        for check, reason in value.items():
            line = line_of(value, check)
            if check not in CHECK_NAMES:
                continue
            if not isinstance(reason, str) or not reason.strip():
                self.error(f"expected the reason as a non-empty string, got {show(reason)}",
                           _join(where, check), line)
            elif checks is not None and check not in checks:
                self.error(f"check {check!r} is expected to fail but is not run "
                           f"(checks: {list(checks)})", _join(where, check), line)
            else:
                result[check] = reason.strip()
        return result

    def surrogate(self, data: LineDict, key: str,
                  names: tuple[str | None, ...] | None) -> Surrogate | None:
        value = data.get("surrogate")
        if value is None or "expr" in data:
            return None
        try:
            return make_surrogate(plain(value), base_dir=self.base_dir, input_names=names)
        except SpecError as exc:
            sub = (exc.key or "surrogate").partition(".")[2]
            line = line_of(value, sub) if sub else None
            self.error(_raw(exc), _join(key, exc.key or "surrogate"),
                       line or line_of(data, "surrogate"), exc.hint)
            return None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _raw(exc: SpecError) -> str:
    """The message without the `key: ` prefix SpecError puts in front of it (a file's error
    keeps its file:line)."""
    return exc.message if exc.path else exc.reason
