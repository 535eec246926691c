"""`expr:` targets: a checked arithmetic-and-torch expression, run by walking its AST (no eval)."""

from __future__ import annotations

import ast
import inspect
import keyword
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import SpecError, did_you_mean
from ..tracebacks import interprets_user_code

MAX_LENGTH = 2000
MAX_NODES = 500
MAX_DEPTH = 60   # the compiler and the closures it builds recurse once per level

# Functions reachable as torch.NAME (and as the bare NAME). None of them grows a tensor beyond its
# inputs' sizes, writes files or takes code: an expr can only compute.
TORCH_FUNCTIONS = frozenset("""
    abs acos acosh add amax amin asin asinh atan atan2 atanh bmm cat ceil clamp clip cos cosh
    cross cumprod cumsum det diag diag_embed diagonal digamma dist div dot erf erfc erfinv exp exp2
    expm1 flatten flip float_power floor fmod frac hypot inner inverse kron lerp lgamma log log10
    log1p log2 log_softmax logaddexp logdet logit logsumexp matmul max maximum mean min minimum mm
    mul mv neg nan_to_num outer permute pow prod reciprocal relu remainder reshape roll round rsqrt
    sigmoid sign sin sinc sinh softmax sqrt square squeeze stack std sub sum t tan tanh trace
    transpose tril triu trunc unsqueeze var where xlogy
""".split())
LINALG_FUNCTIONS = frozenset("""
    cholesky cross det eigh eigvalsh inv matrix_exp matrix_norm multi_dot norm pinv qr slogdet solve
    svd svdvals vecdot vector_norm
""".split())
NN_FUNCTIONS = frozenset("""
    celu elu gelu hardtanh leaky_relu log_softmax logsigmoid mish normalize relu relu6 selu silu
    softmax softplus softsign tanhshrink
""".split())
# Bare names: every torch function, plus the linalg and nn.functional ones people write unprefixed.
BARE_FUNCTIONS: dict[str, str] = {
    **{name: f"torch.{name}" for name in TORCH_FUNCTIONS},
    **{name: f"torch.linalg.{name}" for name in
       ("cholesky", "inv", "solve", "slogdet", "eigh", "eigvalsh", "svdvals", "pinv", "matrix_exp",
        "vector_norm", "matrix_norm", "norm")},
    **{name: f"torch.nn.functional.{name}" for name in
       ("softplus", "gelu", "silu", "elu", "selu", "celu", "leaky_relu", "logsigmoid", "hardtanh",
        "normalize", "mish", "softsign", "relu6", "tanhshrink")},
}
METHODS = frozenset("""
    abs amax amin atan2 clamp clip clone cos cosh cumprod cumsum det diag_embed diagonal div dot exp
    expm1 flatten flip hypot inverse log log1p log_softmax logdet logsumexp matmul max maximum mean
    min minimum mm mul neg norm outer permute pow prod reciprocal relu reshape roll rsqrt sigmoid
    sign sin sinh softmax sqrt square squeeze std sub sum t tan tanh trace transpose tril triu
    unsqueeze var
""".split())
PROPERTIES = frozenset({"T", "mT", "H", "mH"})
CONSTANTS = {"torch.pi": 3.141592653589793, "torch.e": 2.718281828459045}
KEYWORDS = frozenset("""
    alpha beta correction diagonal dim dim0 dim1 dims end_dim eps exponent keepdim lambd left
    max min negative_slope offset ord other p shifts start_dim threshold unbiased upper
""".split())

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.MatMult: operator.matmul,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_REFUSED = {
    ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression",
    ast.NamedExpr: "an assignment (:=)", ast.IfExp: "a conditional (use torch.where)",
    ast.BoolOp: "and/or (use & and | on comparisons, or torch.where)", ast.Await: "await",
    ast.Yield: "yield", ast.YieldFrom: "yield", ast.JoinedStr: "an f-string",
    ast.Dict: "a dict", ast.Set: "a set", ast.Starred: "a starred argument",
}
_ALLOWED_HINT = ("an expr may use numbers, the input names, + - * / // % ** @, comparisons, "
                 "torch functions such as torch.sin or exp, and methods such as x.sum(dim=0)")

Evaluator = Callable[[dict[str, Any]], Any]


class ExprFunction:
    """The compiled expr: call it with one positional argument per input name."""

    def __init__(self, text: str, input_names: tuple[str, ...], body: Evaluator) -> None:
        self.text, self.input_names, self._body = text, input_names, body
        self.__name__ = self.__qualname__ = "expr"
        self.__doc__ = text
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in input_names])

    @interprets_user_code
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.__signature__.bind(*args, **kwargs)
        return self._body(dict(bound.arguments))

    def __repr__(self) -> str:
        return f"expr({self.text!r})"


def compile_expr(text: str, input_names: Sequence[str]) -> ExprFunction:
    """Check `text` against the allow-list and return a callable; SpecError for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"expected a non-empty expression string, got {text!r}")
    if len(text) > MAX_LENGTH:
        raise SpecError(f"expression is {len(text)} characters long; at most {MAX_LENGTH}")
    names = tuple(input_names)
    for name in names:
        _check_input_name(name)
    tree = _parse(text)
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES:
        raise SpecError(f"expression has {count} syntax nodes; at most {MAX_NODES}")
    if _depth(tree) > MAX_DEPTH:
        raise SpecError(f"expression is nested more than {MAX_DEPTH} levels deep")
    compiler = _Compiler(names)
    body = compiler.expr(tree.body)
    if not compiler.used:
        raise SpecError(f"expression {_short(text)} uses none of the inputs ({', '.join(names)})")
    return ExprFunction(text, names, body)


def _check_input_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise SpecError(f"input name {name!r} cannot be used in an expr: it must be an identifier")
    if name.startswith("__") or name == "torch" or name in BARE_FUNCTIONS:
        raise SpecError(f"input name {name!r} is reserved in an expr (a dunder, torch, or a "
                        "function name); rename the input")


def _depth(tree: ast.AST) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:  # iterative: a recursive walk is what the limit protects
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _short(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _parse(text: str) -> ast.Expression:
    try:
        with warnings.catch_warnings():  # '1if x' warns; the spec error says what is wrong
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        if _is_statement(text):
            raise SpecError(f"{_short(text)} is a statement (import, assignment, ...); an expr is "
                            "a single expression", hint=_ALLOWED_HINT) from None
        raise SpecError(f"{_short(text)} is not a valid expression: {exc.msg} "
                        f"(column {exc.offset})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SpecError(f"expression cannot be parsed: {type(exc).__name__}: {exc}") from None


def _is_statement(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(text.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _dotted(node: ast.expr) -> str | None:
    """'torch.linalg.det' for a chain of attributes on the name torch, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return ".".join(["torch", *reversed(parts)])
    return None


def _allowed_path(path: str) -> bool:
    head, _, name = path.rpartition(".")
    return ((head == "torch" and name in TORCH_FUNCTIONS)
            or (head == "torch.linalg" and name in LINALG_FUNCTIONS)
            or (head == "torch.nn.functional" and name in NN_FUNCTIONS))


def _refuse_dunder(name: str) -> None:
    if name.startswith("_"):
        raise SpecError(f"{name!r}: names starting with an underscore (dunders, private "
                        "attributes) are refused in an expr", hint=_ALLOWED_HINT)


class _Compiler:
    """Turns each allowed AST node into a closure over an environment of input values."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.used = names, False

    def expr(self, node: ast.expr) -> Evaluator:
        method = getattr(self, f"_{type(node).__name__.lower()}", None)
        if method is None:
            what = _REFUSED.get(type(node), f"{type(node).__name__} syntax")
            raise SpecError(f"{what} is not allowed in an expr", hint=_ALLOWED_HINT)
        return method(node)

    def _binop(self, node: ast.BinOp) -> Evaluator:
        left, right = self.expr(node.left), self.expr(node.right)
        if isinstance(node.op, ast.Pow):
            return lambda env: _power(left(env), right(env))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise SpecError(f"operator {type(node.op).__name__} is not allowed in an expr",
                            hint=_ALLOWED_HINT)
        return lambda env: op(_operand(left(env)), _operand(right(env)))

    def _unaryop(self, node: ast.UnaryOp) -> Evaluator:
        operand = self.expr(node.operand)
        ops = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
        op = ops.get(type(node.op))
        if op is None:
            raise SpecError("`not` is not allowed in an expr (use ~ on a comparison)",
                            hint=_ALLOWED_HINT)
        return lambda env: op(_operand(operand(env)))

    def _compare(self, node: ast.Compare) -> Evaluator:
        if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
            raise SpecError("only single comparisons (<, <=, >, >=, ==, !=) are allowed in an expr")
        op = _COMPARE[type(node.ops[0])]
        left, right = self.expr(node.left), self.expr(node.comparators[0])
        return lambda env: op(left(env), right(env))

    def _constant(self, node: ast.Constant) -> Evaluator:
        value = node.value
        if value is not None and not isinstance(value, (bool, int, float, complex)):
            raise SpecError(f"constant {value!r} is not allowed in an expr; only numbers, "
                            "True/False and None")
        return lambda env: value

    def _name(self, node: ast.Name, owner: bool = False) -> Evaluator:
        _refuse_dunder(node.id)
        if owner and node.id not in self.names:
            raise SpecError(f"unknown name {node.id!r}: an expr reaches no module but torch, and "
                            "attributes only of its inputs", hint=_ALLOWED_HINT)
        if node.id in self.names:
            self.used = True
            name = node.id
            return lambda env: env[name]
        if node.id in BARE_FUNCTIONS:
            raise SpecError(f"{node.id!r} is a function; call it, e.g. {node.id}(x)")
        hint = did_you_mean(node.id, [*self.names, *BARE_FUNCTIONS])
        raise SpecError(f"unknown name {node.id!r}; an expr may use its inputs "
                        f"({', '.join(self.names)}) and allowed torch functions", hint=hint)

    def _attribute(self, node: ast.Attribute) -> Evaluator:
        _refuse_dunder(node.attr)
        path = _dotted(node)
        if path is not None:
            if path in CONSTANTS:
                constant = CONSTANTS[path]
                return lambda env: constant
            raise SpecError(f"{path!r} is not an allowed value; call an allowed torch function",
                            hint=_ALLOWED_HINT)
        if node.attr not in PROPERTIES:
            raise SpecError(f"attribute .{node.attr} is not allowed in an expr; allowed are "
                            f"{', '.join(sorted(PROPERTIES))} and method calls such as .sum()")
        value, attr = self._owner(node.value), node.attr
        return lambda env: getattr(value(env), attr)

    def _call(self, node: ast.Call) -> Evaluator:
        func = node.func
        if isinstance(func, ast.Attribute) and _dotted(func) is None:
            return self._method(func, node)
        path = _dotted(func) if isinstance(func, ast.Attribute) else self._bare(func)
        if path is None or not _allowed_path(path):
            for part in (path or "").split("."):
                _refuse_dunder(part)
            raise SpecError(f"{path or ast.unparse(func)!r} is not an allowed function in an expr",
                            hint=did_you_mean(path or "", _all_paths()) or _ALLOWED_HINT)
        args, kwargs = self._arguments(node)
        resolved: list[Any] = []

        def call(env: dict[str, Any]) -> Any:
            if not resolved:
                resolved.append(_resolve(path))
            return resolved[0](*(a(env) for a in args), **{k: v(env) for k, v in kwargs.items()})
        return call

    def _bare(self, func: ast.expr) -> str | None:
        if not isinstance(func, ast.Name):
            raise SpecError(f"only named torch functions can be called in an expr, not "
                            f"{ast.unparse(func)!r}", hint=_ALLOWED_HINT)
        _refuse_dunder(func.id)
        if func.id in self.names:
            raise SpecError(f"input {func.id!r} is a value, not a function")
        if func.id not in BARE_FUNCTIONS:
            hint = did_you_mean(func.id, BARE_FUNCTIONS)
            raise SpecError(f"{func.id!r} is not an allowed function in an expr",
                            hint=hint or _ALLOWED_HINT)
        return BARE_FUNCTIONS[func.id]

    def _method(self, func: ast.Attribute, node: ast.Call) -> Evaluator:
        _refuse_dunder(func.attr)
        value, attr = self._owner(func.value), func.attr  # first: `os.system()` is about `os`
        if attr not in METHODS:
            raise SpecError(f"method .{attr}() is not allowed in an expr",
                            hint=did_you_mean(attr, METHODS) or _ALLOWED_HINT)
        args, kwargs = self._arguments(node)
        return lambda env: getattr(_tensor(value(env), attr), attr)(
            *(a(env) for a in args), **{k: v(env) for k, v in kwargs.items()})

    def _arguments(self, node: ast.Call) -> tuple[list[Evaluator], dict[str, Evaluator]]:
        return [self.expr(arg) for arg in node.args], self._keywords(node.keywords)

    def _keywords(self, keywords: list[ast.keyword]) -> dict[str, Evaluator]:
        result = {}
        for kw in keywords:
            if kw.arg is None:
                raise SpecError("**kwargs is not allowed in an expr")
            if kw.arg not in KEYWORDS:
                raise SpecError(f"keyword argument {kw.arg}= is not allowed in an expr",
                                hint=did_you_mean(kw.arg, KEYWORDS)
                                or f"allowed keywords: {', '.join(sorted(KEYWORDS))}")
            result[kw.arg] = self.expr(kw.value)
        return result

    def _owner(self, node: ast.expr) -> Evaluator:
        return self._name(node, owner=True) if isinstance(node, ast.Name) else self.expr(node)

    def _subscript(self, node: ast.Subscript) -> Evaluator:
        value, index = self.expr(node.value), self._index(node.slice)
        return lambda env: value(env)[index(env)]

    def _index(self, node: ast.expr) -> Evaluator:
        if isinstance(node, ast.Slice):
            parts = [self._index(p) if p is not None else (lambda env: None)
                     for p in (node.lower, node.upper, node.step)]
            return lambda env: slice(*(p(env) for p in parts))
        if isinstance(node, ast.Tuple):
            items = [self._index(e) for e in node.elts]
            return lambda env: tuple(i(env) for i in items)
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            return lambda env: Ellipsis
        return self.expr(node)

    def _tuple(self, node: ast.Tuple) -> Evaluator:
        items = [self.expr(e) for e in node.elts]
        return lambda env: tuple(i(env) for i in items)

    def _list(self, node: ast.List) -> Evaluator:
        items = [self.expr(e) for e in node.elts]
        return lambda env: [i(env) for i in items]


def _all_paths() -> list[str]:
    return [*(f"torch.{n}" for n in TORCH_FUNCTIONS),
            *(f"torch.linalg.{n}" for n in LINALG_FUNCTIONS),
            *(f"torch.nn.functional.{n}" for n in NN_FUNCTIONS)]


def _resolve(path: str) -> Any:
    import torch  # lazily: validating a spec must not import torch

    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _operand(value: Any) -> Any:
    # `[x] * 10**9` would build a huge list: arithmetic is for numbers and tensors only.
    if isinstance(value, (list, tuple)):
        raise TypeError("arithmetic on lists or tuples is not allowed in an expr")
    return value


def _tensor(value: Any, method: str) -> Any:
    if isinstance(value, (list, tuple, int, float, complex, bool)) or value is None:
        raise TypeError(f".{method}() needs a tensor, got {type(value).__name__}")
    return value


def _power(base: Any, exponent: Any) -> Any:
    base, exponent = _operand(base), _operand(exponent)
    # 10**10**10 on Python ints would run for ever; float powers overflow at once instead.
    if isinstance(base, int) and isinstance(exponent, int):
        return float(base) ** exponent
    return base ** exponent
