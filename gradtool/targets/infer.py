"""Input inference: from forward's signature, then candidate shapes, until forward runs."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Collection, Iterator
from typing import Any

import torch

from ..config.settings import CheckConfig
from ..errors import GradtoolError, InputError
from .cases import Case, build_case
from .inputs import Domain, InputSpec, LiteralSpec, TensorSpec
from .load import Target

# Elementwise ops first (every tensor the same shape), then shapes that make small matmuls work.
# Distinct sizes (3, 4, 5) keep a transposed or swapped gradient from hiding behind a square.
SAME_SHAPES = [(3, 4), (5,), (4, 4), (2, 3, 4)]
MIXED_SHAPES = [(3, 4), (5, 4), (5,), (4, 5), (4,), (3,), (4, 4), (2, 3, 4)]
MAX_ATTEMPTS = 400
PASSED_OVER = "inference passed over"  # a note's start: dropped from a case that passed
BATCH_LOOKAHEAD = 64  # candidates tried for a batched input after an all-1-D one was accepted
NUMBER_GUESS = {int: 2, float: 2.5, bool: True}


def infer_case(target: Target, config: CheckConfig, seed: int) -> Case:
    """The first candidate input set that forward accepts; InputError when none does."""
    if target.kind.op:  # a schema that leaves a type open: say which argument, not "tried"
        from .ops import require_inferable

        require_inferable(target)
        if not target.obj._schema.returns:  # writes in place, returns nothing: the schema's
            specs = next(_candidates(_slots(target), []))  # first candidate is the case
            return build_case(target, specs, config, seed, inferred=True)
    _refuse_non_tensors(target)
    slots = _slots(target)
    hinted = _parameter_shapes(target, seed)
    tried = 0
    last_error: BaseException | None = None
    fallback: Case | None = None  # forward ran, backward did not: used only if nothing better
    dropped: list[str] = []       # why candidates that forward accepted were passed over
    flat: Case | None = None      # accepted, every tensor 1-D: a batched one is looked for
    scalar: list[Any] | None = None  # the first all-0-d candidate both ran, passed over
    for specs in _candidates(slots, hinted):
        if tried >= MAX_ATTEMPTS or (flat is not None and tried >= flat_at + BATCH_LOOKAHEAD):
            break
        tried += 1
        if flat is not None and _rank(specs) < 3:
            continue
        try:
            case = build_case(target, specs, config, seed, inferred=True)
            _run_forward(case)
        except GradtoolError:
            raise
        except NoTensorOutput as exc:  # it ran: no other shape makes it return a tensor
            raise InputError(f"{target.name}: {exc}: there is no gradient to check",
                             "return the output as a tensor (not .item(), float() or a "
                             "number); an integer output has no gradient") from None
        except Exception as exc:  # the candidate did not fit; try the next one
            last_error = exc
            continue
        why = _backward_fails(case)
        if why is None and fallback is not None and _rank(specs) == 0:
            # Only 0-d tensors run backward so far, while forward took larger ones: a backward
            # that breaks on those is the report, unless a candidate with a larger tensor (a
            # 0-d temperature beside a 3x4 input) runs both.
            scalar = scalar or specs
            continue
        if why is None and flat is None and 0 < _rank(specs) < 2:
            flat, flat_at = case, tried  # accepted; a batched candidate would test layouts
            continue
        if why is None:
            if flat is not None:
                case.notes.append(f"preferred over {_shapes(flat.specs)}: a batched input "
                                  "exercises layouts")
            return _prefer_literals(target, _noted(case, dropped), config, seed)
        if len(dropped) < 3 and flat is None:
            dropped.append(f"{PASSED_OVER} {_shapes(specs)}, where backward {why} "
                           "(a shape the target need not support: not a failure)")
        fallback = fallback or case
    if flat is not None:
        return _prefer_literals(target, _noted(flat, dropped), config, seed)
    if fallback is not None:  # a broken backward must be reported by the checks, not hidden here
        chosen = _prefer_literals(target, fallback, config, seed)
        chosen.alternative = scalar  # the runner says how to pin those, if scalars are meant
        return chosen
    _refuse_non_tensors(target, f"; forward refused {tried} tensor candidates" + (
        f" (last error: {type(last_error).__name__}: {_first_line(last_error)})"
        if last_error else ""))  # a role read from the source, confirmed
    raise InputError(
        f"could not infer inputs for {target.name}: forward({', '.join(target.arg_names)}) "
        f"rejected {tried} candidate shapes"
        + (f" (last error: {type(last_error).__name__}: {_first_line(last_error)})"
           if last_error else ""),
        f"pass them with --input, one per argument, e.g. {slot_hint(slots)}  "
        "(a keyword as -i NAME=SPEC; see gradtool check --help)" + _integer_hint(last_error))


def _refuse_non_tensors(target: Target, confirmed: str = "",
                        shown: Collection[str] | None = None) -> None:
    """Arguments forward takes as a callable, a dict or a string, with no default: inference
    samples tensors only, so it says which ones to give and how. Before any candidate only an
    annotation decides; a role read from the source is told once tensors were tried and
    `confirmed` says what showed it (forward refused them all; backward gives the arguments
    `shown` no gradient): an argument may take a tensor or a callable."""
    from .roles import argument_roles, role_hint

    roles = argument_roles(target)
    params = [p for p in (target.signature.parameters.values() if target.signature else [])
              if p.default is inspect.Parameter.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = [p.name for p in params if p.name in roles]
    if not any(roles[n].declared or confirmed and (shown is None or n in shown)
               for n in needed):
        return
    tensors = [p.name for p in params if p.name not in roles]
    raise InputError(
        f"could not infer inputs for {target.name}: forward({', '.join(target.arg_names)}) "
        "takes " + ", ".join(f"{n} ({roles[n].words})" for n in needed)
        + f", which inference does not guess (it samples tensors){confirmed}",
        "; ".join([role_hint(n, roles[n], target) for n in needed]
                  + ([f"{', '.join(tensors)}: tensors, e.g. -i 3x4"] if tensors else [])))


def _integer_hint(error: BaseException | None) -> str:
    """For a forward that wanted integer tensors (indices, token ids): the form that makes
    them; inference samples floating tensors only."""
    text = str(error or "")
    if not re.search(r"\b(Long|Int|integer|index|indices)\b", text):
        return ""
    return ("; an argument that takes integers (indices, token ids) as, e.g., "
            "-i 2x5:integer[0,9] (values 0 to 9, never differentiated)")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""


def _slots(target: Target) -> list[list[Any]]:
    """For each forward argument, the kinds of value to try: 'tensor', None, or a literal."""
    slots = []
    params = list(target.signature.parameters.values()) if target.signature else []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        arity = tuple_arity(p)
        if arity:  # forward says it takes a tuple (a recurrent state): try one of tensors first
            slots.append([("tuple", arity)] + (["tensor", LiteralSpec(None)]
                                               if p.default is None else []))
        elif p.default is not inspect.Parameter.empty and p.default is not None:
            slots.append([LiteralSpec(p.default)])
        elif p.annotation in NUMBER_GUESS or p.annotation in ("int", "float", "bool"):
            kind = p.annotation if not isinstance(p.annotation, str) else eval_number(p.annotation)
            slots.append([LiteralSpec(NUMBER_GUESS[kind])])
        elif p.default is None:
            slots.append(["tensor", LiteralSpec(None)])  # optional: check it if a tensor fits
        else:
            slots.append(["tensor"])
    return slots


def tuple_arity(p: inspect.Parameter) -> int:
    """How many tensors a tuple argument holds, from its annotation or default (0: not one)."""
    if isinstance(p.default, tuple) and p.default and \
            all(isinstance(v, torch.Tensor) for v in p.default):
        return len(p.default)
    text = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
    match = re.search(r"(?:^|[^\w.])(?:typing\.)?[Tt]uple\[([^\[\]]*)\]", text)
    if not match:
        return 0
    items = [i.strip() for i in match.group(1).split(",")]
    if len(items) == 2 and items[1] == "...":
        return 2
    return len(items) if all("Tensor" in i for i in items) else 0


def slot_hint(slots: list[list[Any]]) -> str:
    """'-i 3x4 -i '(3x4, 3x4)'': one --input per argument, tuples in their nested form."""
    parts = []
    for slot in slots:
        first = slot[0]
        if isinstance(first, tuple):
            parts.append("-i '(" + ", ".join(["3x4"] * first[1]) + ")'")
        elif first == "tensor":
            parts.append("-i 3x4")
    return " ".join(parts) or "-i 3x4"


def eval_number(name: str) -> type:
    return {"int": int, "float": float, "bool": bool}[name]


def _parameter_shapes(target: Target, seed: int) -> list[tuple[int, ...]]:
    """Shapes an nn.Module's parameters suggest: (n,) for a vector, (3, in) for a weight."""
    if not target.kind.parameters:
        return []
    from .cases import instantiate

    shapes: list[tuple[int, ...]] = []
    for p in instantiate(target, seed).parameters():
        shape = tuple(p.shape)
        if not shape:  # a 0-d parameter (a learnable scale) suggests no input shape
            continue
        for guess in ([shape] if len(shape) == 1 else [(3, shape[-1]), shape]):
            if guess not in shapes:
                shapes.append(guess)
    return shapes[:4]


def _candidates(slots: list[list[Any]], hinted: list[tuple[int, ...]]
                ) -> Iterator[list[InputSpec]]:
    """Shapes with real inputs, then positive ones (log, sqrt, ...); 0-d tensors last, since
    a scalar makes almost any forward run and hides shape mistakes."""
    for domain, zero_d in ((Domain(), False), (Domain("positive"), False), (Domain(), True)):
        for specs in _shape_candidates(slots, hinted, zero_d):
            yield [_in(s, domain) for s in specs]


def _in(spec: Any, domain: Domain) -> Any:
    if isinstance(spec, tuple):
        return tuple(_in(s, domain) for s in spec)
    return TensorSpec(spec.shape, domain=domain) if isinstance(spec, TensorSpec) else spec


def _shape_candidates(slots: list[list[Any]], hinted: list[tuple[int, ...]], zero_d: bool
                      ) -> Iterator[list[InputSpec]]:
    extra = [()] if zero_d else []
    same, mixed = hinted + SAME_SHAPES + extra, hinted + MIXED_SHAPES + extra
    for choice in itertools.product(*slots):
        n_tensors = sum(c[1] if isinstance(c, tuple) else c == "tensor" for c in choice)
        shapes = itertools.chain(([s] * n_tensors for s in same),
                                 itertools.product(mixed, repeat=n_tensors))
        seen = set()
        for shape_set in shapes:
            key = tuple(shape_set)
            if key in seen:
                continue
            seen.add(key)
            it = iter(shape_set)
            yield [_fill(c, it) for c in choice]


def _fill(choice: Any, shapes: Iterator[Any]) -> Any:
    if isinstance(choice, tuple):  # ("tuple", n): n tensors of the candidate's shapes
        return tuple(TensorSpec(tuple(next(shapes))) for _ in range(choice[1]))
    return TensorSpec(tuple(next(shapes))) if choice == "tensor" else choice


def _run_forward(case: Case) -> None:
    problem = case.problem
    with torch.no_grad():
        result = problem.fn(*problem.with_inputs(problem.inputs))  # copies: user code owns them
    from ..numerics.problem import tensor_outputs

    outs = [t for t in tensor_outputs(result) if t.is_floating_point() or t.is_complex()]
    if not outs:
        raise NoTensorOutput(result)
    if not all(bool(torch.isfinite(t).all()) for t in outs):
        raise ValueError("forward returned NaN/Inf on these inputs (outside its domain?)")


class NoTensorOutput(TypeError):
    """Forward ran and returned nothing to differentiate (a Python number, an integer tensor)."""

    def __init__(self, result: Any) -> None:
        if isinstance(result, torch.Tensor):
            what = f"a {str(result.dtype).replace('torch.', '')} tensor"
        else:
            what = f"{type(result).__name__} {_short(result)}"
        super().__init__(f"forward returned {what}, no floating-point tensor")
        self.what = what


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _backward_fails(case: Case) -> str | None:
    """Why backward does not accept these shapes ('raised ValueError: ...', 'gave NaN/Inf'),
    or None when it runs and gives finite gradients."""
    problem = case.problem
    if not problem.diff:
        return None
    try:
        leaves, outs = problem.graph()
        outs = [o for o in outs if (o.is_floating_point() or o.is_complex()) and o.requires_grad]
        grads = problem.vjp(leaves, outs, [torch.ones_like(o) for o in outs])
    except Exception as exc:  # noqa: BLE001 - said in a note when another shape is chosen
        return f"raised {type(exc).__name__}: {_first_line(exc)}"
    return None if all(bool(torch.isfinite(g).all()) for g in grads) else "gave NaN/Inf"


def _rank(specs: list[Any]) -> int:
    """The highest rank among a candidate's tensors."""
    ranks = [len(s.shape) for s in _tensor_specs(specs)]
    return max(ranks, default=0)


def _tensor_specs(specs: list[Any]) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for spec in specs:
        out += _tensor_specs(list(spec)) if isinstance(spec, tuple) else \
            [spec] if isinstance(spec, TensorSpec) else []
    return out


def _shapes(specs: list[Any]) -> str:
    """'3x4, (5,)': a candidate's tensor shapes as --input writes them."""
    return ", ".join("x".join(map(str, s.shape)) if len(s.shape) > 1 else
                     f"({s.shape[0]},)" if s.shape else "()" for s in _tensor_specs(specs))


def _noted(case: Case, dropped: list[str]) -> Case:
    """The case, saying which shapes forward accepted and backward did not (not silently)."""
    case.notes.extend(dropped)
    return case


def _prefer_literals(target: Target, case: Case, config: CheckConfig, seed: int) -> Case:
    """A Function whose backward returns None for a tensor we guessed takes a constant there."""
    if not target.kind.function_class:
        return case
    problem = case.problem
    try:  # a preference only: a forward the probe has not learnt yet (mark_dirty) may refuse
        leaves, outs = problem.graph()
    except Exception:  # noqa: BLE001 - the checks run the case and report what it does
        return case
    node = next((o.grad_fn for o in outs if o.grad_fn is not None), None)
    if node is None:
        return case
    try:
        grads = node.apply(*[torch.ones_like(o) for o in outs])
    except Exception:
        return case
    grads = grads if isinstance(grads, tuple) else (grads,)
    specs = list(case.specs)
    changed = False
    for position, spec in enumerate(specs):
        annotated = _annotation(target, position) is torch.Tensor
        if isinstance(spec, TensorSpec) and not annotated and position < len(grads) \
                and grads[position] is None:
            specs[position] = LiteralSpec(NUMBER_GUESS[float])
            changed = True
    if not changed:
        return case
    constants = [case.infos[i].name for i, s in enumerate(specs) if s is not case.specs[i]]
    _refuse_non_tensors(target, f"; backward gives {', '.join(constants)} no gradient",
                        constants)
    try:
        better = build_case(target, specs, config, seed, inferred=True)
        _run_forward(better)
    except Exception:
        return case
    better.notes.append(f"backward returns None for {', '.join(constants)}: treated as a "
                        "constant")
    return better


def _annotation(target: Target, position: int) -> Any:
    params = list(target.signature.parameters.values()) if target.signature else []
    return params[position].annotation if position < len(params) else None
