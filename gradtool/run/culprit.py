"""Locate the wrong custom Function in a model: capture each one's inputs, check it on its own."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..config.settings import DEFAULT_TOLERANCES, CheckConfig
from ..errors import InternalError
from ..numerics.problem import Problem, function_nodes, tensor_outputs
from ..numerics.sparse import Encoding, is_sparse, rebuilding
from ..numerics.tangent import projected_tensors
from ..results import CheckResult, InputInfo, Outcome
from ..targets.cases import Case, arg_name, bind
from ..targets.inputs import InputSpec, LiteralSpec, TensorSpec
from ..targets.load import Target
from ..targets.resolve import make_target
from ..targets.subclass import clone_keeping, keeps_class, plain, retyping
from .alone import FunctionFinding, check_alone, finding_of, wrt
from .applyhook import Call, Hook, hooked, same_definition
from .budget import over_budget, over_on_graph
from .paths import calls_user_ops, failing_inputs, is_whole, named_whole
from .replay import anchors_of, replaying
from .sites import user_site

@dataclass
class Application:
    """One custom Function application seen during the forward: class, argument copies, call
    site, node."""

    cls: type
    args: list[Any]
    kwargs: dict[str, Any]
    created_at: str | None
    node: Any = None          # the grad_fn its outputs got (None: no graph was recorded)
    mutates: bool = False     # returned one of its inputs (ctx.mark_dirty)
    ordinal: int = 0          # how many applications of cls came before it in the forward
    # Arguments that were the forward's own leaves (position -> leaf index), and the forward:
    # re-checked by replaying that forward (run/replay.py), so closures over them stay true.
    anchors: dict[int, int] = field(default_factory=dict)
    outer: Problem | None = None
    # The forward's leaves, in input order: which inputs its node reaches (run/second.py)
    leaves: list[Any] = field(default_factory=list, repr=False)
    # The model is this application: the only one, fed the forward's leaves themselves, every
    # output a view of its outputs (so the model's check is the Function's own)
    whole: bool = False
    # A hook on its outputs, or on the forward's inputs or outputs, that may change gradients:
    # no shortcut names it without a re-check (hooks on other tensors are not seen)
    hooked: bool = False


class _Recorder(Hook):
    """Records every custom Function application of a forward and, once it ends, its node."""

    def __init__(self) -> None:
        self.calls: list[Application] = []
        self.originals: dict[int, tuple[Any, ...]] = {}  # id(app) -> the objects forward got
        self._open: list[tuple[Application, Call, list[torch.Tensor]]] = []

    def forward(self, call: Call) -> Any:
        try:
            app = self._enter(call)
        except Exception:  # noqa: BLE001 - recording must never change the user's forward
            return call.run()
        out = call.run()
        self._open.append((app, call, tensor_outputs(out)))
        return out

    def _enter(self, call: Call) -> Application:
        app = Application(call.cls, [_snapshot(v) for v in call.args],
                          {k: _snapshot(v) for k, v in call.kwargs.items()},
                          user_site(sys._getframe(2)))
        app.ordinal = sum(1 for other in self.calls if same_definition(other.cls, app.cls))
        self.calls.append(app)
        self.originals[id(app)] = (*call.args, *call.kwargs.values())
        return app

    def settle(self, graph: dict[int, Any]) -> None:
        """Each application's node, now that apply has wrapped its outputs: its ctx, where an
        output (or the graph) holds it; an application under no_grad has none."""
        for app, call, outputs in self._open:
            ctx = call.ctx
            if ctx is None:
                continue
            if id(ctx) in graph or any(o.grad_fn is ctx for o in outputs):
                app.node = ctx
            # an input handed back as itself with this node: marked dirty (written in place)
            app.mutates = any(o is v and o.grad_fn is ctx for o in outputs
                              for v in self.originals.get(id(app), ()))
            app.hooked = app.hooked or _hooks_on(outputs)
        self._open.clear()


def _hooks_on(tensors: Sequence[Any]) -> bool:
    """A tensor hook (register_hook) may change the gradient between Functions."""
    return any(getattr(t, "_backward_hooks", None) for t in tensors)


def _snapshot(value: Any) -> Any:
    """A copy taken before forward runs (it may write in place); requires_grad travels along."""
    if isinstance(value, torch.Tensor):  # a subclass's values cloned plainly, its class kept
        return clone_keeping(value).requires_grad_(value.requires_grad)
    return value


def record(problem: Problem) -> tuple[list[Application], list[Any]]:
    """_record, once per Problem: the contract's inner check, the culprit search and double
    backward's share one recording (kept in Problem.cache)."""
    if problem.cache.applications is None:
        start = time.perf_counter()
        problem.cache.applications = _record(problem)
        problem.cache.applications_s = time.perf_counter() - start
    return problem.cache.applications


def _record(problem: Problem) -> tuple[list[Application], list[Any]]:
    """Run the forward once: (applications whose node is in the graph, graph nodes not captured).

    Where torch's own Functions sit in the graph (reentrant checkpointing), one backward is
    recorded too: they apply the user's Functions again there, with a graph.
    """
    recorder = _Recorder()
    with hooked(recorder):
        leaves, outs = problem.graph()
    nodes = function_nodes(outs)
    recorder.settle(nodes)
    # What user code received for a leaf: the leaf, or its projection (a sym/spd input)
    given = list(leaves)
    for index, tensor in projected_tensors(problem.fn, problem.diff).items():
        given[index] = tensor
    for app in recorder.calls:
        app.anchors = {} if app.kwargs else anchors_of(recorder.originals[id(app)], given)
        app.outer = problem if app.anchors else None
        app.leaves = leaves
    if any(_is_torch(node._forward_cls) for node in nodes.values()):
        grads = [torch.ones_like(o) for o in outs]
        with hooked(recorder):
            problem.vjp(leaves, outs, grads)
        recorder.settle({})
        nodes.update((id(app.node), app.node) for app in recorder.calls if app.node is not None)
    recorder.originals.clear()  # the forward's objects: not kept past this point
    seen = {id(app.node) for app in recorder.calls if app.node is not None}
    # A Function applied inside another Function's forward records no node: it is not checked.
    used = [app for app in recorder.calls if app.node is not None and id(app.node) in nodes
            and not _is_torch(app.cls)]
    missed = [node for key, node in nodes.items()
              if key not in seen and not _is_torch(node._forward_cls)]
    if _hooks_on([*leaves, *outs]):
        for app in used:
            app.hooked = True
    # (a structured input reaches user code through its projection: not the leaf itself)
    if len(used) == 1 and not missed and len(nodes) == 1 and \
            all(g is leaf for g, leaf in zip(given, leaves)):
        used[0].whole = is_whole(used[0], outs, len(leaves))
    return used, missed


def _is_torch(cls: type) -> bool:
    """torch's own Functions (checkpointing, say) are not the user's to check."""
    return cls.__module__.split(".")[0] == "torch"


def case_from_values(target: Target, values: Sequence[Any], config: CheckConfig,
                     differentiable: Sequence[bool] | None = None,
                     kwargs: dict[str, Any] | None = None, label: str = "captured",
                     aliases: dict[int, str] | None = None) -> Case:
    """A Case for a Function target from concrete values (default: tensors that require grad);
    `aliases`: names for positions forward does not name (its *args), the model's own."""
    if differentiable is None:
        differentiable = [isinstance(v, torch.Tensor) and v.requires_grad for v in values]
    args, names, diff, specs, infos = [], [], [], [], []
    encodings: dict[int, Encoding] = {}  # sparse inputs, held as strided values (as build_case)
    templates: dict[int, Any] = {}  # storage subclasses: held plain, forward sees their class
    for position, (value, grad) in enumerate(zip(values, differentiable)):
        name = target.arg_names[position] if position < len(target.arg_names) else \
            (aliases or {}).get(position) or arg_name(target, position)
        spec: InputSpec
        if isinstance(value, torch.Tensor):
            grad = grad and (value.is_floating_point() or value.is_complex())
            if keeps_class(value):
                templates[position] = value
            value = plain(value)
            spec = TensorSpec(tuple(value.shape), str(value.dtype).removeprefix("torch."),
                              requires_grad=grad, name=name)
            if grad and is_sparse(value):
                encodings[position] = Encoding.of(value, config.masked)
                value = encodings[position].value()
        else:
            spec, grad = LiteralSpec(value, name), False
        diff += [position] if grad else []
        args.append(value)
        names.append(name)
        specs.append(spec)
        infos.append(InputInfo(name, f"captured {spec.describe(config.dtype)}", grad))
    fn, batched_fn, _, _ = bind(target, len(args), config, config.seed)

    def wrap(bound: Callable[..., Any]) -> Callable[..., Any]:
        """keyword-only forward arguments passed along (to a float64 reference too), never
        checked; sparse inputs rebuilt in their layout"""
        bound = functools.partial(bound, **kwargs) if kwargs else bound
        bound = retyping(bound, templates)
        return rebuilding(bound, encodings) if encodings else bound

    fn = wrap(fn)
    # vmap batches no sparse tensor, nor a subclass's values
    batched_fn = wrap(batched_fn) if batched_fn and not encodings and not templates else None
    problem = Problem(fn, args, names, diff, batched_fn=batched_fn, sparse=encodings)
    return Case(label, config.seed, specs, problem, infos, wrap=wrap, n_positional=len(args))


def locate_functions(problem: Problem, config: CheckConfig,
                     recheck: Callable[..., list[FunctionFinding]] | None = None
                     ) -> list[FunctionFinding]:
    """Check every custom Function applied in one forward of `problem` on its captured inputs.

    One finding per Function class and call site, in forward order. Never raises: a forward
    that cannot be re-run yields no findings.
    """
    try:  # the probe saw no Function node in forward's graph: nothing to record
        applications, missed = record(problem) if problem.has_functions or \
            not problem.facts.learnt else ([], [])
    except Exception:  # noqa: BLE001 - locating is a diagnosis; it must not break the report
        return []
    findings = [check_application(app, config, problem.freeze_seed)
                for app in unique(applications)]
    for cls in dict.fromkeys(type(node)._forward_cls for node in missed):
        findings.append(_not_captured(cls))
    from .ops_inside import locate_ops  # custom ops (torch.library) inside, named ns::name

    findings = findings + [FunctionFinding(**found) for found in locate_ops(problem, config)]
    # run/received.py passes its re-check in received strides (culprit cannot import it).
    return recheck(problem, config, findings) if recheck is not None else findings


def unique(applications: Sequence[Application]) -> list[Application]:
    """The first application of each Function class at each call site, in forward order."""
    first: dict[tuple[type, str | None], Application] = {}
    for app in applications:
        first.setdefault((app.cls, app.created_at), app)
    return list(first.values())


def captured_case(app: Application, config: CheckConfig, freeze_seed: int | None
                  ) -> tuple[Target, Case, CheckConfig]:
    """The Function of one application as a target, with a case of the inputs it received."""
    target = make_target(app.cls, f"{app.cls.__module__}:{app.cls.__qualname__}")
    args, kwargs = _positional(target, app)
    own = _config_for(config, args)
    model = app.outer.input_names if app.outer is not None else []
    aliases = {k: model[leaf] for k, leaf in app.anchors.items() if leaf < len(model)}
    case = case_from_values(target, args, own, kwargs=kwargs, aliases=aliases)
    # What the model's run knew: whether it writes its inputs; a fixed RNG keeps dropout-like
    # masks fixed.
    changes: dict[str, Any] = {"facts": case.problem.facts.with_(mutates=app.mutates,
                                                                 seed=freeze_seed)}
    if app.outer is not None and app.anchors:
        # Some arguments were the forward's own leaves: a closure may hold them, so each
        # evaluation replays the forward rather than calling the Function on copies.
        fn, scope = replaying(app.outer, app.cls, app.ordinal, app.anchors)
        # the Problem's values are plain: a subclass argument is handed over as its class
        fn = retyping(fn, {k: v for k, v in enumerate(args) if keeps_class(v)})
        if case.problem.sparse:  # the replayed forward takes sparse inputs as given
            fn = rebuilding(fn, case.problem.sparse)
        changes.update(fn=fn, scope=scope, batched_fn=None)
    case.problem = replace(case.problem, **changes)  # a Problem is built complete, never edited
    return target, case, own


def check_application(app: Application, config: CheckConfig,
                      freeze_seed: int | None = None) -> FunctionFinding:
    """The first-order gradient check of one Function on the inputs it received."""
    target: Target | None = None
    try:
        target, case, own = captured_case(app, config, freeze_seed)
        result = check_alone(case, target, own)
    except InternalError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. arguments that no longer bind
        result = CheckResult("gradient", Outcome.ERROR, f"{type(exc).__name__}: {exc}")
    source = target.source if target is not None else None
    return finding_of(app, source, result)


def _positional(target: Target, app: Application) -> tuple[list[Any], dict[str, Any]]:
    """Keyword arguments given to apply moved to their positions, as forward sees them."""
    if not app.kwargs or target.signature is None:
        return list(app.args), dict(app.kwargs)
    bound = target.signature.bind(*app.args, **app.kwargs)
    return list(bound.args), dict(bound.kwargs)


def _config_for(config: CheckConfig, values: Sequence[Any]) -> CheckConfig:
    """The run's settings, with the dtype (so the default tolerances) of the captured tensors."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            dtype = str(value.dtype).removeprefix("torch.")
            return config.with_(dtype=dtype) if dtype in DEFAULT_TOLERANCES else config
    return config


def _not_captured(cls: type) -> FunctionFinding:
    from ..targets.load import source_of

    text = (f"{cls.__qualname__} is in the graph but its inputs were not captured "
            "(applied without Function.apply)")
    return FunctionFinding(cls.__qualname__, source_of(cls.backward), None, Outcome.SKIPPED,
                           (), text)


def describe(findings: Sequence[FunctionFinding]) -> list[str]:
    """Report lines: one verdict per Function, then the detail of each that did not pass."""
    if not findings:
        return []
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.qualname] = counts.get(f.qualname, 0) + 1
    parts = [_short(f, counts[f.qualname] > 1) for f in findings]
    lines = ["custom Functions, each checked alone on the inputs it received: " + "; ".join(parts)]
    lines += [f.summary for f in findings if f.outcome is not Outcome.PASSED]
    if all(f.outcome is Outcome.PASSED for f in findings):
        lines.append("every custom Function passes alone on the inputs it received: the "
                     "mismatch comes from code between them (a detach, an in-place write, a "
                     "non-differentiable op) or from what a Function reads besides its "
                     "arguments (a closure, a module's attribute)")
    return lines


def _short(finding: FunctionFinding, ambiguous: bool) -> str:
    where = f" ({finding.created_at})" if finding.created_at else ""
    if finding.outcome is Outcome.PASSED:
        return f"{finding.qualname}{where if ambiguous else ''} passes"
    if finding.outcome is Outcome.FAILED:
        return f"{finding.qualname}{where} is {wrt(finding.wrong_inputs)}"
    if finding.outcome is Outcome.ERROR:
        return f"{finding.qualname}{where} could not be re-run alone"
    return f"{finding.qualname}{where} {finding.outcome.value}"


def forward_line(problem: Problem) -> str | None:
    """file:line of the forward line that applied the first custom Function in the graph."""
    try:
        applications, _ = record(problem)
    except Exception:  # noqa: BLE001 - a pointer is optional
        return None
    return next((app.created_at for app in applications if app.created_at), None)


def annotate(result: CheckResult, problem: Problem, config: CheckConfig,
             recheck: Callable[..., list[FunctionFinding]] | None = None) -> CheckResult:
    """A failed module/callable gradient result, with each Function's own verdict added;
    `look at:` names a Function only on evidence specific to it."""
    if result.outcome is not Outcome.FAILED:
        return result
    skipped = over_on_graph(problem, config)  # the drop-in's: said, not paid
    if skipped is not None:
        return replace(result, details=(*result.details, skipped))
    whole = _whole_model(result, problem)
    if whole is not None:
        return named_whole(result, problem, whole)
    skipped = _over_budget(problem, config)
    if skipped is not None:  # the drop-in's failing call: said, not paid
        return replace(result, details=(*result.details, skipped))
    findings = locate_functions(problem, config, recheck)
    if not findings:
        return result
    failing = [f for f in findings if f.outcome is Outcome.FAILED]
    if len(failing) > 1:
        return _several(result, problem, config, findings, failing)
    bad = failing[0] if failing and failing[0].source else None
    return replace(result, details=(*result.details, *describe(findings)),
                   source=bad.source if bad else result.source)


def _over_budget(problem: Problem, config: CheckConfig) -> str | None:
    """budget.over_budget of the recording forward's applications, where there are any."""
    if not config.gradcheck_cost or not problem.has_functions:
        return None  # (nothing recorded for the command line's run)
    try:
        applications, _ = record(problem)
    except Exception:  # noqa: BLE001 - the search itself then finds nothing to check
        return None
    return over_budget(problem, config, unique(applications))


def _whole_model(result: CheckResult, problem: Problem) -> Application | None:
    """The one application the model is (see _is_whole), when the blocks or a failure finding
    say which inputs failed."""
    if not problem.has_functions or not failing_inputs(result):
        return None
    try:
        applications, _ = record(problem)
    except Exception:  # noqa: BLE001 - no shortcut then: the search decides
        return None
    if len(applications) != 1 or not applications[0].whole or applications[0].hooked or \
            calls_user_ops(problem):
        return None
    return applications[0]


def _several(result: CheckResult, problem: Problem, config: CheckConfig,
             findings: list[FunctionFinding], failing: list[FunctionFinding]) -> CheckResult:
    """Several Functions fail alone: blame one only when the composite's gradient becomes
    right with its backward replaced by autograd through its forward, and no other's does."""
    from .substitute import fixed_by_forward  # lazy: several failing Functions only

    fixing = [f for f in failing
              if f.cls is not None and fixed_by_forward(problem, config, {f.cls})]
    names = _names([f.qualname for f in failing])
    if len(fixing) == 1:
        found = fixing[0]
        why = (f"of the Functions that fail alone ({names}), {found.qualname} is the one to "
               f"blame: the model's gradient is right once its backward is replaced by "
               f"autograd through its forward, and with no other one's")
        return replace(result, details=(*result.details, *describe(findings), why),
                       source=found.source or result.source)
    if fixing:
        how = (f"the model's gradient is right with the backward of any one of "
               f"{_names([f.qualname for f in fixing])} replaced by autograd through its "
               "forward")
    else:
        how = ("the model's gradient stays wrong whichever one's backward is replaced by "
               "autograd through its forward")
    why = (f"the culprit is ambiguous: {names} each fail alone, and {how}: either more than "
           "one of them is wrong, or some follow a convention of their own (a gradient in the "
           "tangent space of group elements stored as quaternions, say, fails Euclidean finite "
           "differences alone by design), so no single Function is blamed: look at the model's "
           "forward")
    return replace(result, details=(*result.details, *describe(findings), why))


def _names(names: Sequence[str]) -> str:
    unique_names = list(dict.fromkeys(names))
    if len(unique_names) < 2:
        return "".join(unique_names)
    return ", ".join(unique_names[:-1]) + " and " + unique_names[-1]


__all__ = ["Application", "FunctionFinding", "annotate", "captured_case", "case_from_values",
           "check_application", "describe", "forward_line", "function_nodes", "locate_functions",
           "record", "unique", "wrt"]
