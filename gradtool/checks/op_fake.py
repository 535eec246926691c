"""op_fake: the op's fake kernel exists and agrees with the real one, also with symbolic sizes."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..numerics.problem import tensor_outputs
from ..results import CheckResult, Finding
from ._common import skipped
from ._ops import (CUSTOM_OP_ALIAS, applies, clone_args, fake_source, has_fake,
                   interpreted_triton, overload, python_name, real_outputs, registered_at, result,
                   shape_text)

__all__ = ["applies", "run"]


def run(case: Any, context: Any) -> CheckResult:
    start = time.perf_counter()
    op, problem = overload(context), case.problem
    where = fake_source(op) or registered_at(context)
    if interpreted_triton(op):
        return skipped("op_fake", f"not run: {interpreted_triton(op)}")
    if not has_fake(op):
        return result("op_fake", [_missing(op, registered_at(context))], "", start, case,
                      registered_at(context))
    try:
        real = real_outputs(case)
    except RuntimeError as exc:
        if CUSTOM_OP_ALIAS not in str(exc):
            raise
        return skipped("op_fake", "not run: torch refuses the real kernel's aliasing "
                                         "output at every call (see op_schema)")
    findings = _static(op, case, real, where)
    details: list[str] = []
    if not findings:  # a fake wrong at the sampled sizes says all there is to say
        findings, details = _symbolic(op, case, where)
    n = len(real)
    return result("op_fake", findings,
                  f"the fake kernel agrees with the real one on shape, dtype, strides and device "
                  f"of {n} output{'s' if n != 1 else ''}, also with symbolic sizes",
                  start, case, where, details)


def _missing(op: Any, source: str | None) -> Finding:
    name = op._schema.name
    return Finding("op_fake.missing",
                   f"{name} has no fake kernel: torch.compile, torch.export and FX tracing need "
                   f"one; register it with @{python_name(op)}.register_fake (or "
                   f"torch.library.register_fake({name!r})), returning empty tensors of the "
                   "outputs' shapes", source=source)


def _fake_run(case: Any, mode: Any, symbolic: bool, values: list[Any] | None = None
              ) -> tuple[list[Any], list[Any]]:
    """(fake arguments, fake outputs): the op on fake copies of the case's values (every
    dimension symbolic when asked)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    def fake(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if not symbolic:
            return mode.from_tensor(value)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * value.dim())
        return mode.from_tensor(value, symbolic_context=context)

    copies = clone_args(case.problem.args if values is None else values)  # outside the mode
    with mode:
        args = [fake(a) for a in copies]
        return args, tensor_outputs(case.problem.fn(*args))


def _static(op: Any, case: Any, real: list[torch.Tensor], where: str | None,
            values: list[Any] | None = None) -> list[Finding]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        fakes = _fake_run(case, FakeTensorMode(), symbolic=False, values=values)[1]
    except Exception as exc:  # noqa: BLE001 - the user's fake kernel raising is the finding
        return [_raised(op, exc, where, "")]
    if len(fakes) != len(real):
        return [Finding("op_fake.outputs",
                        f"{op._schema.name}'s fake kernel returns {len(fakes)} tensor(s), the "
                        f"real one {len(real)}", source=where)]
    found = []
    for k, (f, r) in enumerate(zip(fakes, real)):
        found += _compare(op, k, f, r, where)
    return found


def _compare(op: Any, k: int, fake: Any, real: torch.Tensor, where: str | None) -> list[Finding]:
    name, out = op._schema.name, f"output {k}"
    if tuple(fake.shape) != tuple(real.shape):
        return [Finding("op_fake.shape",
                        f"{name}'s fake kernel gives {out} the shape {shape_text(fake.shape)}, "
                        f"the real kernel {shape_text(real.shape)}: torch.compile would build "
                        "the wrong graph around it", source=where)]
    found = []
    if fake.dtype != real.dtype:
        found.append(Finding("op_fake.dtype", f"{name}'s fake kernel gives {out} dtype "
                             f"{_short(fake.dtype)}, the real kernel {_short(real.dtype)}",
                             source=where))
    if fake.device != real.device:
        found.append(Finding("op_fake.device", f"{name}'s fake kernel puts {out} on "
                             f"{fake.device}, the real kernel on {real.device}", source=where))
    if real.numel() > 1 and _strides_matter(real) and tuple(fake.stride()) != tuple(real.stride()):
        found.append(Finding("op_fake.strides",
                             f"{name}'s fake kernel gives {out} strides {tuple(fake.stride())}, "
                             f"the real kernel {tuple(real.stride())}: make the fake allocate "
                             "the same layout (e.g. empty_like or empty_strided)", source=where))
    return found


def _strides_matter(t: torch.Tensor) -> bool:
    """Strides of size-1 dimensions are arbitrary; compare the others only."""
    return all(size > 1 for size in t.shape) or t.is_contiguous() is False


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _raised(op: Any, exc: BaseException, where: str | None, how: str) -> Finding:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    rule = "op_fake.symbolic_raises" if how else "op_fake.raises"
    return Finding(rule, f"{op._schema.name}'s fake kernel raises{how}: "
                         f"{type(exc).__name__}: {first}", source=where)


def _symbolic(op: Any, case: Any, where: str | None) -> tuple[list[Finding], list[str]]:
    """Trace the fake with every size symbolic (torch.compile(dynamic=True), export), then read
    its output sizes at other sizes (each size >= 2 doubled) against the real kernel there."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    how = " with symbolic sizes (torch.compile(dynamic=True), torch.export)"
    env = ShapeEnv()
    try:
        fake_args, fakes = _fake_run(case, FakeTensorMode(shape_env=env, static_shapes=False),
                                     symbolic=True)
    except Exception as exc:  # noqa: BLE001 - the user's fake kernel raising is the finding
        return [_raised(op, exc, where, how)], []
    sizes, values = _symbols(fake_args), _doubled(case)
    try:
        real = real_outputs(case, values)
    except Exception as exc:  # noqa: BLE001 - the op takes only some sizes: nothing to compare
        return [], [f"symbolic sizes: the fake traced; not compared at doubled sizes (the real "
                    f"kernel rejects them: {type(exc).__name__})"]
    if env.guards:  # the fake specialised on a size: torch.compile retraces it at new sizes
        return _static(op, case, real, where, values), []
    found = []
    for k, (fake, r) in enumerate(zip(fakes, real)):
        expected = [_evaluate(s, sizes) for s in fake.shape]
        if len(expected) != r.dim() or any(e is not None and e != got
                                           for e, got in zip(expected, r.shape)):
            inputs = ", ".join(f"{n} {shape_text(v.shape)}" for n, v in
                               zip(case.problem.names, values) if isinstance(v, torch.Tensor))
            found.append(Finding(
                "op_fake.dynamic_shape",
                f"{op._schema.name}'s fake kernel, traced with symbolic sizes, gives output {k} "
                f"the shape {_symbolic_text(fake.shape)}, which is "
                f"{shape_text([e if e is not None else '?' for e in expected])} at inputs "
                f"{inputs} where the real kernel gives {shape_text(r.shape)}: compute the "
                "sizes from the inputs' sizes, never from constants of one call", source=where))
    return found, []


def _symbols(fake_args: list[Any]) -> dict[str, int]:
    """Each symbolic size of the traced inputs -> its value at the doubled sizes."""
    mapping: dict[str, int] = {}
    for value in fake_args:
        for size in getattr(value, "shape", ()):
            if isinstance(size, torch.SymInt):
                mapping[str(size.node.expr)] = _double(int(size.node.hint))
    return mapping


def _double(n: int) -> int:
    return 2 * n if n >= 2 else n  # 0 and 1 stay: torch specialises them


def _doubled(case: Any) -> list[Any]:
    """The case's values with every size >= 2 doubled by tiling (same value domain)."""
    return [a.detach().repeat(*[2 if s >= 2 else 1 for s in a.shape]) if isinstance(
        a, torch.Tensor) and a.dim() else a for a in case.problem.args]


def _evaluate(size: Any, symbols: dict[str, int]) -> int | None:
    """A traced output size at the doubled input sizes (None: it depends on something else)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    import sympy

    expr = size.node.expr
    value = expr.xreplace({s: symbols[str(s)] for s in expr.free_symbols if str(s) in symbols})
    return int(value) if isinstance(value, sympy.Integer) else None


def _symbolic_text(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"
