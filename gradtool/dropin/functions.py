"""gradtool.gradcheck / gradgradcheck: torch's signatures and contract, gradtool's reports.

A drop-in for `torch.autograd.gradcheck` and `gradgradcheck`: the same arguments (every keyword of
torch 2.4 to 2.15, positional order included), True on success, and on failure a
`GradcheckFailure` -- which IS a `torch.autograd.gradcheck.GradcheckError` -- whose message is
gradtool's plain report (the wrong elements, the diagnosis, look at:, reproduce:);
`raise_exception=False` returns False instead. An exception raised by the user's code propagates
unchanged, as it does from torch's.

Verdict policy (docs/library-and-pytest.md says it for users):
- Scope is gradcheck's: the given tensors that require grad (an nn.Module's parameters are not
  added), at the given values, with `eps`, `atol` and `rtol` as given (|a - n| <= atol + rtol |n|,
  torch's rule). Below float64, torch's float64 defaults left as they are mean gradtool's per-dtype
  tolerances (torch's would fail float32 on its own rounding).
- The Jacobian is gradtool's `gradient` check (`complex` for complex values, `forward_ad` for
  check_forward_ad): full mode, or probe mode (its fastest sound mode) for `fast_mode=True`.
  A probe whose measured finite-difference error is beyond the fixed tolerance of what it
  tests cannot pass: full mode judges that call (numerics/probe.py), or where full mode is
  over budget the probe is inconclusive and torch's own fast test decides.
  Every other test gradcheck runs beside it is run as gradcheck runs it: the inputs' and outputs'
  validation, reentrancy within nondet_tol, check_grad_dtypes, check_undefined_grad,
  check_batched_grad, check_batched_forward_grad, backward's multiplication by grad_output
  (torch_tests.py, batched.py: gradtool's own code on torch's public API), and forward mode of
  complex values, which gradtool does not check itself (torch's public gradcheck runs it).
  gradtool evaluates the function on copies it owns, laid out as the tensors given where one is
  not compact (given.py: an as_strided over a partial view reads the storage it would read),
  an nn.Parameter given received as one, and on torch's terms (grad mode on, values requiring
  grad) where its forward without a graph computes otherwise.
  So gradtool never passes what torch's function fails for a defect; where
  torch's own finite differences fail a correct function (a step across a kink, rounding its
  fixed tolerance cannot absorb), gradtool's verdict (inconclusive is not a failure) stands.
- A plain float64 call whose gradient check passes is judged by that check's engine alone
  (lean.py: the pipeline's pass, without its Run, Case and Report; lean_forward.py: forward_ad's
  under check_forward_ad); every other call, and every failure, runs gradtool.check for the
  report. Its reentrancy test then runs backward once more at the probe's first random
  cotangent, and check_batched_grad batches the probe's two, where torch draws its own (one
  output; fast mode).
- gradtool's other checks (contract, layout, double backward, ...) are opt-in: `extra_checks=True`.
- gradgradcheck is gradcheck of the function (inputs, grad_outputs) -> backward's gradients,
  built with a graph, exactly as torch's: the caller's grad_outputs, else random ones (non-
  contiguous under gen_non_contig_grad_outputs); check_fwd_over_rev and check_rev_over_rev are
  that gradcheck's check_forward_ad and check_backward_ad.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from .calls import call, grad, owned
from .given import laid_out, on_torch_terms
from .lean import passes as lean_pass
from .lean_forward import forward_passes
from .torch_tests import (check_inputs, check_outputs, differentiable_outputs, forward_mode,
                          no_differentiable_outputs, reentrant)
from .torch_tests import run as torch_runs
from ..errors import TargetError
from ..numerics.handed import Handed, recording, serving
from ..tracebacks import calls_user_code, user_errors_propagate

__all__ = ["GradcheckFailure", "gradcheck", "gradgradcheck"]

# torch's float64 defaults: left as they are below float64, they mean gradtool's dtype defaults.
TORCH_DEFAULTS = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}


class GradcheckFailure(GradcheckError):
    """A gradient gradtool found wrong: torch's GradcheckError, with gradtool's report as message
    (`report` holds the Report itself, or None for a test gradtool ran as torch runs it)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


def gradcheck(func: Callable[..., Any], inputs: Any, *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, raise_exception: bool = True, nondet_tol: float = 0.0,
              check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
              check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
              check_forward_ad: bool = False, check_backward_ad: bool = True,
              fast_mode: bool = False, masked: bool | None = None,
              extra_checks: bool = False) -> bool:
    """torch.autograd.gradcheck's contract, judged by gradtool (see the module docstring).

    extra_checks=True adds gradtool's default checks (contract, layout, double backward, ...)."""
    __tracebackhide__ = True  # pytest shows the test's line and the report, not gradtool's
    _keywords(check_forward_ad, check_backward_ad, check_batched_grad,
              check_batched_forward_grad)
    args = _as_tuple(inputs)
    try:
        check_inputs(args)  # torch's refusals, in its words (ValueError, RuntimeError)
        start = time.perf_counter()
        out = call(func, *args)
        seconds = time.perf_counter() - start  # what a forward costs: the culprit's budget
        outputs = differentiable_outputs(out)
        check_outputs(outputs)
        with owned((GradcheckError,)):
            _tests(func, args, out, outputs, _settings(args, eps, atol, rtol, nondet_tol,
                                                       fast_mode, masked), seconds,
                   check_undefined_grad=check_undefined_grad,
                   check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad,
                   check_batched_forward_grad=check_batched_forward_grad,
                   check_forward_ad=check_forward_ad, check_backward_ad=check_backward_ad,
                   extra_checks=extra_checks)
    except GradcheckError as exc:
        from .saved import with_saved_inputs  # a failure's: run/reproduce.py not imported else

        if raise_exception:
            failure = exc if isinstance(exc, GradcheckFailure) else \
                GradcheckFailure(f"{_name(func)}: {exc}")
            # raised from here, without gradtool's frames below: the message is the report
            raise with_saved_inputs(failure, _name(func), args).with_traceback(None) from None
        return False
    return True


def _tests(func: Callable[..., Any], args: tuple[Any, ...], out: Any,
           outputs: tuple[torch.Tensor, ...], settings: dict[str, Any], seconds: float, *,
           check_undefined_grad: bool, check_grad_dtypes: bool, check_batched_grad: bool,
           check_batched_forward_grad: bool, check_forward_ad: bool, check_backward_ad: bool,
           extra_checks: bool) -> None:
    """gradcheck's tests in torch's order, so that the first failure is the one torch's
    gradcheck would raise: GradcheckError (a GradcheckFailure with gradtool's report)."""
    eps, nondet_tol = settings.get("eps", TORCH_DEFAULTS["eps"]), settings["nondet_tol"]
    fast_mode = settings["mode"] == "probe"
    if not outputs:  # torch's test: finite differences find every output constant
        no_differentiable_outputs(func, args, eps, fast_mode, nondet_tol)
    judged = laid_out(func, args)  # gradtool's copies laid out as the tensors given
    complex_values = any(t.is_complex() for t in (*_tensors(args), *outputs))
    passed = tangent = None  # lean passes, whose backwards and jvp the later tests share
    if outputs and check_backward_ad:
        # a plain float64 call's clean pass needs no pipeline; anything else gets its report,
        # which reads what the lean path evaluated instead of paying it again (handed.py)
        handed = Handed.of_call(judged, args)
        handed.bind([args[k] for k in handed.diff], out, outputs)
        handed.seconds = seconds
        with recording(handed):
            passed = None if extra_checks or complex_values else \
                lean_pass(judged, args, out, settings)
        if passed is None:
            with serving(handed):
                _judge(on_torch_terms(judged, args, out), args, settings, backward=True,
                       extra=extra_checks, complex_values=complex_values)
        reentrant(args, outputs, nondet_tol, check_grad_dtypes, passed)
    if outputs and check_forward_ad and complex_values:
        # gradtool checks no forward mode of complex values: torch's own check runs
        forward_mode(func, args, **{k: settings.get(k, v) for k, v in TORCH_DEFAULTS.items()},
                     check_undefined_grad=check_undefined_grad, fast_mode=fast_mode,
                     masked=settings["masked"])
    elif outputs and check_forward_ad:
        forward = False if extra_checks else forward_passes(judged, args, out, settings)
        if not forward:
            _judge(judged, args, settings, backward=False,
                   extra=extra_checks and not check_backward_ad)
        elif judged is func:  # the lean pass's jvp, made on the user's function itself
            tangent = forward
    torch_runs(func, args, outputs, check_undefined_grad=check_undefined_grad,
               undefined_forward=not complex_values,  # else torch's ran it above
               check_batched_grad=check_batched_grad,
               check_batched_forward_grad=check_batched_forward_grad,
               check_forward_ad=check_forward_ad, check_backward_ad=check_backward_ad,
               masked=settings["masked"], shared=passed, shared_jvp=tangent)


def _keywords(forward: bool, backward: bool, batched: bool, batched_forward: bool) -> None:
    """The keyword combinations torch's gradcheck refuses, refused alike (AssertionError)."""
    _refuse(("check_forward_ad", forward), ("check_backward_ad", backward),
            [("check_batched_grad", batched, "check_backward_ad"),
             ("check_batched_forward_grad", batched_forward, "check_forward_ad")])


def _second_keywords(forward: bool, backward: bool, undefined: bool, batched: bool) -> None:
    """The keyword combinations torch's gradgradcheck refuses, refused alike."""
    _refuse(("check_fwd_over_rev", forward), ("check_rev_over_rev", backward),
            [("check_undefined_grad", undefined, "check_rev_over_rev"),
             ("check_batched_grad", batched, "check_rev_over_rev")])


def _refuse(forward: tuple[str, bool], backward: tuple[str, bool],
            needs: list[tuple[str, bool, str]]) -> None:
    """torch's words: neither mode asked for, or a keyword set without the mode it needs."""
    if not (forward[1] or backward[1]):
        raise AssertionError(f"Expected at least one of {forward[0]} or {backward[0]} to be True")
    on = {forward[0]: forward[1], backward[0]: backward[1]}
    for name, value, mode in needs:
        if value and not on[mode]:
            raise AssertionError(f"Setting {name}=True requires {mode} to be True")


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    """gradcheck's inputs: a tuple, a list, or one value."""
    return inputs if isinstance(inputs, tuple) else \
        tuple(inputs) if isinstance(inputs, list) else (inputs,)


def _settings(args: Sequence[Any], eps: float, atol: float, rtol: float, nondet_tol: float,
              fast_mode: bool, masked: bool | None) -> dict[str, Any]:
    """gradtool.check's settings for gradcheck's keywords."""
    tolerances = {"eps": eps, "atol": atol, "rtol": rtol}
    if any(t.is_floating_point() and t.dtype != torch.float64 for t in _tensors(args)):
        tolerances = {k: v for k, v in tolerances.items() if v != TORCH_DEFAULTS[k]}
    return {**tolerances, "nondet_tol": nondet_tol, "masked": bool(masked),
            "mode": "probe" if fast_mode else "full", "module_parameters": False}


def _judge(func: Callable[..., Any], args: tuple[Any, ...], settings: dict[str, Any], *,
           backward: bool, extra: bool, complex_values: bool = False) -> None:
    """gradtool's checks of reverse (backward) or forward mode on the call, gradtool's default
    checks too when `extra`: GradcheckFailure with the plain report when one fails."""
    from ..api import check
    from .saved import plain_report
    from ..config.registry import (DEFAULT_CHECKS, GRADCHECK_BACKWARD, GRADCHECK_COMPLEX,
                                   GRADCHECK_FORWARD)
    if backward:  # gradtool's default run where asked: forward_ad then only for a jvp's own
        names = DEFAULT_CHECKS if extra else \
            GRADCHECK_BACKWARD + (GRADCHECK_COMPLEX if complex_values else ())
    else:  # forward mode asked for: on any target
        names = GRADCHECK_FORWARD + tuple(n for n in DEFAULT_CHECKS
                                          if extra and n not in GRADCHECK_FORWARD)
    with user_errors_propagate():
        report = check(_signed(func), args, **settings, checks=names, forward_any=not backward)
    if report.rejected:  # gradtool could not take the target (a module it cannot copy): its
        # usage error, with the fix, never a wrong-gradient verdict
        raise TargetError("; ".join(f"{r.source}: {r.message}" for r in report.rejected))
    if not report.ok():
        raise GradcheckFailure("gradtool found gradient problems:\n" + plain_report(report),
                               report)
    if settings["mode"] == "probe" and any(
            c.outcome.value == "inconclusive" and c.mode == "probe" for _, _, c in report.checks()):
        _torch_fast(func, args, settings, backward, report)


def _torch_fast(func: Callable[..., Any], args: tuple[Any, ...], settings: dict[str, Any],
                backward: bool, report: Any) -> None:
    """fast_mode=True where gradtool's probe could not judge (finite differences too noisy for
    it, full mode over budget): torch's own fast test decides, so the drop-in never passes
    what torch's fast mode fails without a word on why."""
    from .saved import plain_report

    tolerances = {k: settings.get(k, v) for k, v in TORCH_DEFAULTS.items()}
    try:
        call(torch.autograd.gradcheck, func, args, **tolerances, nondet_tol=settings["nondet_tol"],
                                 fast_mode=True, check_undefined_grad=False,
                                 check_forward_ad=not backward, check_backward_ad=backward,
                                 masked=settings["masked"])
    except GradcheckError as exc:
        raise GradcheckFailure(
            f"gradtool's probe could not judge this call and torch's fast-mode test fails:\n"
            f"{exc}\n" + plain_report(report), report) from None


def gradgradcheck(func: Callable[..., Any], inputs: Any, grad_outputs: Any = None, *,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True,
                  nondet_tol: float = 0.0, check_undefined_grad: bool = True,
                  check_grad_dtypes: bool = False, check_batched_grad: bool = False,
                  check_fwd_over_rev: bool = False, check_rev_over_rev: bool = True,
                  fast_mode: bool = False, masked: bool = False,
                  extra_checks: bool = False) -> bool:
    """torch.autograd.gradgradcheck's contract: gradcheck of backward's gradients as a function
    of (inputs, grad_outputs), built with a graph (see the module docstring)."""
    __tracebackhide__ = True  # pytest shows the test's line and the report, not gradtool's
    _second_keywords(check_fwd_over_rev, check_rev_over_rev, check_undefined_grad,
                     check_batched_grad)
    args = _as_tuple(inputs)
    if grad_outputs is None:
        outputs = differentiable_outputs(call(func, *args))
        grad_outputs = tuple(_random_like(o, gen_non_contig_grad_outputs) for o in outputs)
    elif not isinstance(grad_outputs, (tuple, list)):
        grad_outputs = (grad_outputs,)
    grad_outputs = tuple(grad_outputs)
    backward = _backward_of(func, args, grad_outputs)
    return gradcheck(backward, args + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol,
                     check_undefined_grad=check_undefined_grad,
                     check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad,
                     check_forward_ad=check_fwd_over_rev, check_backward_ad=check_rev_over_rev,
                     fast_mode=fast_mode, masked=masked, extra_checks=extra_checks)


def _random_like(output: torch.Tensor, non_contiguous: bool) -> torch.Tensor:
    """A grad_output as torch's gradgradcheck makes one: uniform in [-1, 1), requiring grad."""
    from torch.testing import make_tensor

    dtype = output.dtype if output.is_floating_point() or output.is_complex() else torch.double
    return make_tensor(output.shape, dtype=dtype, device=output.device, low=-1, high=1,
                       requires_grad=True, noncontiguous=non_contiguous)


def _backward_of(func: Callable[..., Any], args: tuple[Any, ...],
                 grad_outputs: tuple[Any, ...]) -> Callable[..., Any]:
    """(inputs..., grad_outputs...) -> the gradients of func's differentiable inputs, with a
    graph: the function whose Jacobian is func's second derivative."""
    n = len(grad_outputs)
    wants = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    wants_v = [isinstance(v, torch.Tensor) and v.requires_grad for v in grad_outputs]

    @calls_user_code
    def backward(*values: Any) -> tuple[torch.Tensor, ...]:
        # Its value is a gradient whatever the caller's grad mode (finite differences run it
        # under no_grad): the graph inside is always built.
        with torch.enable_grad():
            xs = [v.requires_grad_() if w else v for v, w in zip(values[:-n], wants)]
            vs = [v.requires_grad_() if w else v for v, w in zip(values[-n:], wants_v)]
            outs = differentiable_outputs(func(*xs))
            diff = [x for x, w in zip(xs, wants) if w]
            grads = grad(outs, diff, vs, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return _named_after(backward, func, len(args), n)


def _named_after(backward: Any, func: Any, n_args: int, n_grads: int) -> Any:
    """The report names backward's function after func: 'backward of Name', its arguments
    func's and grad_output(s) (a signature made only where the pipeline runs: _signed), look
    at: func's backward (a Function's) or func itself."""
    owner = getattr(func, "__self__", None)
    cls = owner if isinstance(owner, type) else None
    backward.gradtool_signature = lambda: _signature(func, n_args, n_grads)
    backward.gradtool_second_order = True  # no first-order culprit search (run/runner.py)
    backward.__name__ = backward.__qualname__ = f"backward of {_name(func)}"
    backward.__module__ = getattr(cls or func, "__module__", None) or __name__
    backward.__wrapped__ = cls.backward if cls is not None else func  # look at: there
    shown = f"{cls.__qualname__}.apply" if cls is not None else _name(func)
    backward.gradtool_reproduce = (f"gradtool.gradgradcheck({shown}, <the same inputs>) in "
                                   "Python (the check of its backward's gradients)")
    return backward


def _signature(func: Any, n_args: int, n_grads: int) -> Any:
    """backward's signature for the report: func's argument names, then grad_output(s)."""
    import inspect

    from ..targets.resolve import classify

    try:
        names = list(classify(func, _name(func)).arg_names)
    except Exception:  # noqa: BLE001 - naming is best effort: the check runs either way
        names = []
    names = (names + [f"arg{k}" for k in range(len(names), n_args)])[:n_args]
    names += ["grad_output"] if n_grads == 1 else [f"grad_output{k}" for k in range(n_grads)]
    return inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])


def _signed(func: Callable[..., Any]) -> Callable[..., Any]:
    """func with the signature gradgradcheck's backward defers (classifying its function
    reads source: a tenth of a tiny gradgradcheck call, wanted by the pipeline's report
    alone), set on func itself, the wrapper given.py may have put around backward included."""
    signature = getattr(func, "gradtool_signature", None)
    if signature is not None and "__signature__" not in vars(func):
        func.__signature__ = signature()
    return func


def _tensors(args: Sequence[Any]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def _name(func: Any) -> str:
    owner = getattr(func, "__self__", None)
    named = owner if isinstance(owner, type) else func
    return getattr(named, "__qualname__", None) or type(named).__name__
