"""Input specs: the --input mini-language, and seeded sampling of tensors in a domain."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import DTYPES
from ..errors import InputError, did_you_mean

DOMAINS = ("real", "positive", "negative", "nonzero", "range", "sym", "spd", "simplex",
           "integer")
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
# Per input only: a complex tensor's parts are checked at its real counterpart's precision.
COMPLEX_DTYPES = ("complex128", "complex64")

INPUT_HELP = """\
Each --input/-i is one positional forward argument, in order; NAME=SPEC is a keyword one.
  tensor:   SHAPE[:OPTION...]   SHAPE is 3x4, (3,4), (5,) or () for 0-d;
            OPTIONs: a dtype (float64, float32, complex128, int64, ...), a domain
            (real, positive, negative, nonzero, [lo,hi], sym, spd, simplex, integer),
            nograd (no gradient is checked for it); sym and spd are perturbed and
            compared as symmetric matrices (their tangent space)
  literal:  5, 2.5, None, True, 'mean'  (a non-tensor argument);
            prefix = to force a literal: =(1,2)
  nested:   (SPEC, SPEC) a tuple, [SPEC, SPEC] a list, {'k': SPEC} a dict (any depth)
  keyword:  NAME=SPEC, e.g. mask=3x4:nograd
Examples: -i 3x4 -i 4x5:positive -i 5   |   -i '(10,)' -i '(10,):[-1,1]:nograd'
          -i 2x3 -i 'state=(2x4, 2x4)'   |   -i 3x4 -i mask=3x4:nograd"""


@dataclass(frozen=True)
class Domain:
    """Where a tensor's values are drawn: a kind and, for range/integer, the bounds."""

    kind: str = "real"
    lo: float | None = None
    hi: float | None = None

    def describe(self) -> str:
        if self.kind in ("range", "integer") and self.lo is not None:
            return f"{'integer' if self.kind == 'integer' else ''}[{self.lo:g},{self.hi:g}]"
        return self.kind


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument: shape, dtype (None = the run's dtype), domain, and whether it is checked."""

    shape: tuple[int, ...]
    dtype: str | None = None
    domain: Domain = Domain()
    requires_grad: bool = True
    name: str | None = None
    tangent: str | None = None  # a declared projection (spec `tangent: sym`); sym/spd imply it

    def projection(self) -> str | None:
        """The tangent space the input is perturbed and compared in (None: free)."""
        if self.tangent is not None:
            return None if self.tangent == "free" else self.tangent
        return "sym" if self.domain.kind in ("sym", "spd") else None

    def describe(self, default_dtype: str = "float64") -> str:
        shape = "x".join(map(str, self.shape)) if self.shape else "()"
        if len(self.shape) == 1:
            shape = f"({self.shape[0]},)"
        parts = [shape, self.dtype or ("int64" if self.domain.kind == "integer" else default_dtype)]
        if self.domain.kind != "real":
            parts.append(self.domain.describe())
        if not self.differentiable(default_dtype):
            parts.append("nograd")
        return ":".join(parts)

    def differentiable(self, default_dtype: str = "float64") -> bool:
        dtype = self.dtype or default_dtype
        return self.requires_grad and dtype not in INTEGER_DTYPES and self.domain.kind != "integer"


@dataclass(frozen=True)
class LiteralSpec:
    """A non-tensor argument passed as is (a constant, None for an optional bias, a flag)."""

    value: Any
    name: str | None = None
    explicit: bool = field(default=False, compare=False)  # typed as -i =VALUE: meant as is

    def describe(self, default_dtype: str = "float64") -> str:
        return repr(self.value)

    def differentiable(self, default_dtype: str = "float64") -> bool:
        return False


InputSpec = TensorSpec | LiteralSpec


@dataclass(frozen=True)
class Keyword:
    """A keyword argument: its name and its spec (a leaf spec or a nested structure of them)."""

    name: str
    spec: Any

_DIM = r"(?:\d+|[A-Z][A-Z0-9_]*)"   # a size, or a size symbol (N, D) that --sweep fills in
_SHAPE_X = re.compile(rf"^{_DIM}(x{_DIM})+$")
_TRAILING_X = re.compile(rf"^({_DIM}x)+$")  # 3x, 3x4x: a size left out, or a 1-d shape?
_SHAPE_PAREN = re.compile(rf"^\(\s*({_DIM}\s*(,\s*{_DIM}\s*)*,?\s*)?\)$")
_SYMBOL = re.compile(r"^[A-Z][A-Z0-9_]*$")
_RANGE = re.compile(r"^(integer)?\[\s*([^,\]]+)\s*,\s*([^,\]]+)\s*\]$")


_KEYWORD = re.compile(r"^([A-Za-z_]\w*)\s*=(?!=)(.*)$", re.DOTALL)
_DICT_KEY = re.compile(r"^\s*('[^']*'|\"[^\"]*\"|-?\d+|[A-Za-z_]\w*)\s*:(.*)$", re.DOTALL)
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def parse_input(text: str) -> Any:
    """Parse one --input value: a spec, a keyword (NAME=SPEC) or a nested tuple/list/dict of
    specs; raises InputError naming the bad part and the fix."""
    keyword = _KEYWORD.match(text.strip())
    if keyword:
        return Keyword(keyword.group(1), _parse_value(keyword.group(2).strip(), text))
    return _parse_value(text.strip(), text)


def _parse_value(raw: str, text: str) -> Any:
    if raw[:1] in _CLOSE and not _SHAPE_PAREN.match(raw) and _closes_at_end(raw):
        return _parse_nested(raw, text)
    return _parse_leaf(raw, text)


def _closes_at_end(raw: str) -> bool:
    depth = 0
    for k, char in enumerate(raw):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0:
            return k == len(raw) - 1
    return False


def _parse_nested(raw: str, text: str) -> Any:
    """(a, b) a tuple, [a, b] a list, {'k': a} a dict, of specs; all literals stay one literal."""
    opening, inner = raw[0], raw[1:-1]
    items = [p for p in _split_top(inner, ",")]
    trailing = bool(items) and not items[-1]
    items = [p for p in items if p]
    if opening == "(" and len(items) == 1 and not trailing:
        return _parse_value(items[0], text)  # (2x4) is just 2x4, as in Python
    if opening == "{":
        pairs = []
        for item in items:
            match = _DICT_KEY.match(item)
            if not match:
                raise InputError(f"--input {text!r}: {item!r} is not 'key: SPEC'",
                                 "write a dict as {'w': 3x4, 'b': (4,)}")
            key = match.group(1)
            key = ast.literal_eval(key) if key[0] in "'\"-0123456789" else key
            pairs.append((key, _parse_value(match.group(2).strip(), text)))
        value: Any = dict(pairs)
        leaves = list(value.values())
    else:
        leaves = [_parse_value(item, text) for item in items]
        value = tuple(leaves) if opening == "(" else leaves
    if all(isinstance(v, LiteralSpec) for v in leaves):
        return LiteralSpec(_literal(raw, text))  # (1, 2), [-1, 1]: a plain literal as before
    return value


def _split_top(inner: str, sep: str) -> list[str]:
    parts, depth, current, quote = [], 0, "", ""
    for char in inner:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        else:
            depth += char in "([{"
            depth -= char in ")]}"
        if char == sep and depth == 0 and not quote:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return parts + [current.strip()]


def _parse_leaf(raw: str, text: str) -> InputSpec:
    if raw.startswith("="):
        return LiteralSpec(_literal(raw[1:], text), explicit=True)
    head, *options = _split_options(raw)
    if _TRAILING_X.match(head):
        sizes = head[:-1].split("x")
        raise InputError(f"--input {text!r}: shape {head!r} ends in 'x' (a size left out?)",
                         f"write a 1-d shape as ({sizes[0]},)" if len(sizes) == 1 else
                         f"write the shape whole, e.g. {'x'.join(sizes)}x4, or {'x'.join(sizes)}")
    shape = _parse_shape(head)
    if shape is None and options and (head.isdigit() or _SYMBOL.match(head)):
        shape = (_dim(head),)  # '5:positive' — options make a bare number a 1-d shape
    if shape is None:
        if options:
            raise InputError(f"--input {text!r}: {head!r} is not a shape", _shape_hint())
        return LiteralSpec(_literal(raw, text))
    return _apply_options(TensorSpec(shape), options, text)


def _split_options(raw: str) -> list[str]:
    # Colons separate options, but not inside the brackets of a range.
    parts, depth, current = [], 0, ""
    for char in raw:
        depth += char in "[("
        depth -= char in "])"
        if char == ":" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts]


def _parse_shape(head: str) -> tuple[int, ...] | None:
    if _SHAPE_X.match(head):
        return tuple(_dim(d) for d in head.split("x") if d)
    if _SHAPE_PAREN.match(head):
        inner = head.strip()[1:-1]
        return tuple(_dim(d) for d in inner.split(",") if d.strip())
    return None


def _dim(text: str) -> Any:
    """An int, or a size symbol kept as its name (targets/sizes.py substitutes it)."""
    text = text.strip()
    return int(text) if text.isdigit() else text


def _shape_hint() -> str:
    return "write a shape as 3x4, (3,4), (5,) or () — e.g. --input 3x4:positive"


def _apply_options(spec: TensorSpec, options: list[str], text: str) -> TensorSpec:
    dtype, domain, requires_grad = spec.dtype, spec.domain, spec.requires_grad
    for option in options:
        range_match = _RANGE.match(option)
        if option in DTYPES or option in INTEGER_DTYPES or option in COMPLEX_DTYPES:
            dtype = option
        elif option == "nograd":
            requires_grad = False
        elif option in DOMAINS and option != "range":
            domain = Domain(option)
        elif range_match:
            domain = _range_domain(range_match, option, text)
        elif option.startswith("sparse") or option in ("coo", "csr", "csc", "bsr", "bsc"):
            raise InputError(f"--input {text!r}: --input samples strided tensors only, not "
                             f"{option!r}", "give sparse tensors as values: gradtool.check("
                             "target, [a, b], masked=True), or torch.save((args, kwargs), "
                             "'INPUTS.pt') and --inputs-from INPUTS.pt (docs/inputs.md)")
        else:
            known = (*DOMAINS, *DTYPES, *COMPLEX_DTYPES, *INTEGER_DTYPES, "nograd")
            raise InputError(f"--input {text!r}: unknown option {option!r}",
                             did_you_mean(option, known) or
                             f"options are a dtype, a domain ({', '.join(DOMAINS[:5])}, "
                             "[lo,hi], sym, spd, simplex, integer) or nograd")
    return TensorSpec(spec.shape, dtype, domain, requires_grad)


def _range_domain(match: re.Match[str], option: str, text: str) -> Domain:
    try:
        lo, hi = float(match.group(2)), float(match.group(3))
    except ValueError:
        raise InputError(f"--input {text!r}: range {option!r} needs two numbers",
                         "write it as [lo,hi], e.g. [-1,1]") from None
    if not lo < hi:
        raise InputError(f"--input {text!r}: range {option!r} is empty (lo must be < hi)")
    return Domain("integer" if match.group(1) else "range", lo, hi)


def _literal(raw: str, text: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise InputError(f"--input {text!r} is neither a tensor shape nor a Python literal",
                         _shape_hint() + "; a literal is 5, 2.5, None, True or 'name'") from None


def validate_tensor_spec(spec: TensorSpec) -> None:
    """Check that the domain fits the shape (spd needs square matrices, etc.)."""
    symbol = next((d for d in spec.shape if isinstance(d, str)), None)
    if symbol is not None:
        raise InputError(f"size {symbol} in shape {'x'.join(map(str, spec.shape))} has no "
                         "value", f"add --sweep {symbol}=16 (or {symbol}=awkward)")
    kind = spec.domain.kind
    if (kind in ("sym", "spd") or spec.tangent == "sym") and (
            len(spec.shape) < 2 or spec.shape[-1] != spec.shape[-2]):
        what = f"domain {kind}" if kind in ("sym", "spd") else "tangent sym"
        raise InputError(f"{what} needs a square matrix shape (..., n, n), got {spec.shape}")
    if kind == "simplex" and (not spec.shape or spec.shape[-1] < 1):
        raise InputError(f"domain simplex needs at least one dimension, got {spec.shape}")
    if any(d < 0 for d in spec.shape):
        raise InputError(f"shape {spec.shape} has a negative dimension")


def sample(spec: TensorSpec, generator: Any, default_dtype: str, device: str) -> Any:
    """Draw one tensor for the spec from the seeded generator (torch imported here, lazily)."""
    import torch

    validate_tensor_spec(spec)
    # Integer-valued inputs are indices more often than not: int64 unless a dtype is given.
    dtype_name = spec.dtype or ("int64" if spec.domain.kind == "integer" else default_dtype)
    dtype = getattr(torch, dtype_name)
    shape, kind = spec.shape, spec.domain.kind
    if kind == "integer" or dtype_name in INTEGER_DTYPES:
        lo, hi = (spec.domain.lo, spec.domain.hi) if spec.domain.lo is not None else (0, 10)
        # drawn on the CPU from the case's CPU generator: the same values on every device
        values = torch.randint(int(lo), int(hi) + 1, shape, generator=generator, device="cpu")
        return values.to(dtype=dtype, device=device)
    base = torch.randn(shape, generator=generator, dtype=torch.float64, device="cpu")
    unit = torch.rand(shape, generator=generator, dtype=torch.float64, device="cpu")
    values = _in_domain(spec.domain, base, unit, shape)
    if dtype_name in COMPLEX_DTYPES:  # the domain holds for the real part; imag is N(0, 1)
        imag = torch.randn(shape, generator=generator, dtype=torch.float64, device="cpu")
        values = torch.complex(values, imag)
    return values.to(dtype=dtype, device=device)


def _in_domain(domain: Domain, base: Any, unit: Any, shape: tuple[int, ...]) -> Any:
    import torch

    kind = domain.kind
    if kind == "positive":
        return 0.5 + 1.5 * unit          # away from 0, where log/sqrt/1/x blow up
    if kind == "negative":
        return -(0.5 + 1.5 * unit)
    if kind == "nonzero":
        return torch.where(base >= 0, 1.0, -1.0) * (0.5 + 1.5 * unit)
    if kind == "range":
        lo, hi = domain.lo, domain.hi
        return lo + (hi - lo) * (0.05 + 0.9 * unit)  # a margin keeps x ± eps inside
    if kind == "sym":
        return (base + base.mT) / 2
    if kind == "spd":
        n = shape[-1]
        return base @ base.mT / n + torch.eye(n, dtype=base.dtype, device=base.device)
    if kind == "simplex":
        return torch.softmax(base, dim=-1)
    return base


def refuse_shape_literals(target: Any, specs: list[Any] | None) -> None:
    """InputError, before the target runs, when an --input literal that reads like a shape
    (64, (3, 4)) goes to an argument the signature (an op's schema, an annotation) says is a
    tensor: `-i 3,4` is the tuple (3, 4), not a 3x4 tensor."""
    if not specs or getattr(target, "signature", None) is None:
        return
    params = list(target.signature.parameters.values())
    positional = [s for s in specs if not isinstance(s, Keyword)]
    by_name = {p.name: p for p in params}
    pairs = [(params[k] if k < len(params) else None, s) for k, s in enumerate(positional)]
    pairs += [(by_name.get(s.name), s.spec) for s in specs if isinstance(s, Keyword)]
    for param, spec in pairs:
        if param is None or not isinstance(spec, LiteralSpec):
            continue
        sizes = _shape_like(spec.value)
        if sizes is None:
            continue
        shape = f"-i {'x'.join(map(str, sizes))} or -i '({','.join(map(str, sizes))})'" \
            if len(sizes) > 1 else f"-i '({sizes[0]},)'"
        if _wants_tensor(param):
            raise InputError(
                f"--input {spec.value!r} gives {param.name!r} of {target.name} the "
                f"{type(spec.value).__name__} {spec.value!r}, where its signature takes a tensor",
                f"a tensor of that shape is {shape} (the shape syntax: gradtool check --help)")
        if len(sizes) > 1 and not spec.explicit and not _takes_literal(param):
            # -i 3,4 is the usual slip for 3x4; a tuple is taken only where the signature
            # says the argument is not a tensor (an annotation or a default)
            raise InputError(
                f"--input {','.join(map(str, sizes))} gives {param.name!r} of {target.name} "
                f"the {type(spec.value).__name__} {spec.value!r}, and nothing in its signature "
                "says it takes one",
                f"a tensor of that shape is {shape} (the shape syntax: gradtool check --help); "
                f"the tuple itself is -i '={spec.value!r}'")


def _takes_literal(param: Any) -> bool:
    """Whether the signature says an argument is not a tensor: annotated otherwise, or a
    non-tensor default."""
    if param.annotation is not inspect.Parameter.empty:
        return True
    return param.default is not inspect.Parameter.empty and param.default is not None \
        and type(param.default).__name__ != "Tensor"


def _wants_tensor(param: Any) -> bool:
    annotation = param.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return str(name).rpartition(".")[2] == "Tensor"


def _shape_like(value: Any) -> tuple[int, ...] | None:
    """The sizes of an int or a tuple/list of ints (what a shape typed as a literal gives)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    if items and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        return tuple(items)
    return None
