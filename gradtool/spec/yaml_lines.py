"""Bounded, safe YAML reading for specs: plain data plus the line of every key and list item."""

from __future__ import annotations

from typing import Any

import yaml

from ..errors import SpecError

# A spec file is a few kilobytes; these bounds make every load finish quickly whatever the input.
MAX_BYTES = 256 * 1024
MAX_DEPTH = 40          # nesting, also after expanding aliases (a recursive alias hits it)
MAX_NODES = 50_000      # nodes after expanding aliases: a "billion laughs" document stops here
MAX_EVENTS = 200_000

_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class LineDict(dict):  # type: ignore[type-arg]
    """A mapping read from YAML; `line` is where it starts, `key_lines[key]` where each key is."""

    line: int
    key_lines: dict[Any, int]


class LineList(list):  # type: ignore[type-arg]
    """A list read from YAML; `line` is where it starts, `item_lines[i]` where each item is."""

    line: int
    item_lines: list[int]


# libyaml's parser when PyYAML was built with it (ten times faster); both parse iteratively.
_SafeBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeBase):  # type: ignore[misc,valid-type]
    """A safe loader whose dates stay strings (a spec has no use for datetime objects)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def line_of(container: Any, key: Any, default: int | None = None) -> int | None:
    """The line of `key` in a LineDict (or of item `key` in a LineList), else `default`."""
    if isinstance(container, LineDict):
        return container.key_lines.get(key, default)
    if isinstance(container, LineList) and isinstance(key, int) and 0 <= key < len(container):
        return container.item_lines[key]
    return default


def read_yaml(data: str | bytes, path: str) -> Any:
    """Parse one YAML document into LineDict/LineList/scalars; raise SpecError on anything else."""
    if len(data) > MAX_BYTES:
        raise SpecError(f"file is {len(data)} bytes; a spec file may hold at most {MAX_BYTES}",
                        path=path)
    try:
        _check_shape(data, path)
        loader = _Loader(data)
        try:
            node = loader.get_single_node()
            return _Builder(loader, path).build(node, 0) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, path) from None
    except RecursionError:
        raise SpecError(f"YAML nested deeper than {MAX_DEPTH} levels", path=path) from None


def _check_shape(data: str | bytes, path: str) -> None:
    """Walk the parser's events (an iterative parser) to bound depth and size before composing."""
    depth = events = documents = 0
    for event in yaml.parse(data, Loader=_Loader):
        events += 1
        line = event.start_mark.line + 1
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(f"YAML nested deeper than {MAX_DEPTH} levels", path=path, line=line)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise SpecError("a spec file holds one YAML document; list several specs under "
                                "`specs:` instead of separating documents with ---",
                                path=path, line=line)
        if events > MAX_EVENTS:
            raise SpecError(f"YAML has more than {MAX_EVENTS} elements", path=path, line=line)


def _yaml_error(exc: yaml.YAMLError, path: str) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = f"{context}, {problem}" if context else problem
    line = mark.line + 1 if mark is not None else None
    if isinstance(exc, yaml.reader.ReaderError):
        text = "the file is not valid UTF-8 text or holds control characters"
        return SpecError(f"invalid YAML: {text}", path=path)
    if "maximum nesting depth" in text:  # PyYAML >= 6.0.3 bounds nesting itself, in the scanner
        return SpecError(f"YAML nested deeper than {MAX_DEPTH} levels", path=path, line=line)
    return SpecError(f"invalid YAML: {text}", path=path, line=line)


class _Builder:
    """Turns composed nodes into plain data, counting nodes through aliases (no shared objects)."""

    def __init__(self, loader: _Loader, path: str) -> None:
        self.loader, self.path, self.count = loader, path, 0

    def error(self, message: str, node: yaml.Node) -> SpecError:
        return SpecError(message, path=self.path, line=node.start_mark.line + 1)

    def build(self, node: yaml.Node, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.error(f"YAML expands to more than {MAX_NODES} values "
                             "(aliases that repeat an anchor many times?)", node)
        if depth > MAX_DEPTH:
            raise self.error(f"YAML nested deeper than {MAX_DEPTH} levels "
                             "(an alias that refers to itself?)", node)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, depth)
        if isinstance(node, yaml.SequenceNode):
            return self._sequence(node, depth)
        return self._scalar(node)

    def _scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error("unsupported YAML node", node)
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception as exc:  # noqa: BLE001 — explicit tags (!!int x, !!bool y) fail anyhow
            tag = node.tag.rsplit(":", 1)[-1]
            detail = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
            raise self.error(f"cannot read {node.value[:40]!r} as {tag}: {detail}", node) from None

    def _sequence(self, node: yaml.SequenceNode, depth: int) -> LineList:
        if node.tag != _SEQ:
            raise self.error(f"unsupported YAML tag {node.tag!r}; use a plain list", node)
        result = LineList(self.build(item, depth + 1) for item in node.value)
        result.line = node.start_mark.line + 1
        result.item_lines = [item.start_mark.line + 1 for item in node.value]
        return result

    def _mapping(self, node: yaml.MappingNode, depth: int) -> LineDict:
        if node.tag != _MAP:
            raise self.error(f"unsupported YAML tag {node.tag!r}; use a plain mapping", node)
        result = LineDict()
        result.line, result.key_lines = node.start_mark.line + 1, {}
        merges = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merges.append(value_node)
                continue
            key = self._key(key_node)
            if key in result.key_lines:
                raise self.error(f"duplicate key {key!r} (first at line {result.key_lines[key]})",
                                 key_node)
            result[key] = self.build(value_node, depth + 1)
            result.key_lines[key] = key_node.start_mark.line + 1
        for merge in merges:  # `<<: *defaults` — explicit keys win over merged ones
            self._merge(result, merge, depth)
        return result

    def _key(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error("a mapping key must be a plain value, not a list or mapping", node)
        key = self._scalar(node)
        return key

    def _merge(self, result: LineDict, node: yaml.Node, depth: int) -> None:
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        for source in sources:
            merged = self.build(source, depth + 1)
            if not isinstance(merged, LineDict):
                raise self.error("`<<` merges a mapping (or a list of mappings) only", source)
            for key, value in merged.items():
                if key not in result.key_lines:
                    result[key] = value
                    result.key_lines[key] = merged.key_lines[key]


def plain(value: Any) -> Any:
    """A deep copy of LineDict/LineList data as plain dicts and lists (init kwargs, literals)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def show(value: Any, limit: int = 60) -> str:
    """A short repr of a bad value for an error message."""
    text = repr(plain(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
