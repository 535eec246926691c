"""The drop-in's lean path in forward mode (check_forward_ad): a plain float64 call's clean pass
of the forward_ad check without the pipeline.

The gate is lean.py's (plain float64 values, a pure forward, forward_ad the mode's one check).
First a screen on the drop-in's call itself: jvp along forward_ad's seeded direction u (its
own draw, numerics/draws.py's `direction`), against the central difference at h, element by
element, and ⟨v, J u⟩ against ⟨vᵀJ, u⟩ by one backward on the drop-in's graph (forward_ad's
consistency test, at its v). Where every element agrees within atol alone, the whole probe test
passes whatever its third point (x + 2h u) measures: its Richardson estimate moves a third of
that gap, its tolerance grows by all of it (a noisy difference agrees this closely only by a
coincidence with a wrong jvp, as lean.py's backward screen reads it). Else forward_ad's engine
(numerics/forward.py:forward_mode) judges on a Problem of the call, and anything but its pass
lets the pipeline judge and report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config.registry import GRADCHECK_FORWARD
from ..config.settings import CheckConfig
from ..numerics.draws import Kept, direction
from ..numerics.problem import flat_cat, select_outputs
from ..results import Outcome
from ..tracebacks import calls_user_code
from .lean import _Call, _gate, _mask, _numel, _problem

DIRECTION_SEED = 4241  # numerics/forward.py:forward_mode's offset: the same u and v


@dataclass(frozen=True)
class ForwardPassed:
    """A lean pass in forward mode, and the jvp it made where one input requires grad and
    forward returns one tensor: the tangent and J·tangent in the output's shape (the batched
    forward-gradient test batches it)."""

    tangent: torch.Tensor | None = None
    jvp: torch.Tensor | None = None


def forward_passes(func: Callable[..., Any], args: tuple[Any, ...], out: Any,
                   settings: dict[str, Any]) -> ForwardPassed | bool:
    """The forward_ad check's certain pass of this call (jvp against finite differences, fast
    or full mode, and against backward); False: let the pipeline judge and report."""
    gated = _gate(func, args, out, settings, GRADCHECK_FORWARD)
    if gated is None:
        return False
    diff, leaves, outs, config = gated
    if not (_numel(leaves) and _numel(outs)):
        return ForwardPassed()  # forward_ad's no elements to compare: skipped, no failure
    try:
        screened = config.mode == "probe" and _screened(
            _Call(func, args, diff, _mask(out)), config, leaves, outs)
        if screened:
            u, ju = screened
            one = len(u) == 1 and isinstance(out, torch.Tensor)
            return ForwardPassed(u[0], ju.view(out.shape)) if one else ForwardPassed()
        from ..numerics.forward import forward_mode
        from ..numerics.jacobian import SMALL

        if config.mode != "probe" and _numel(leaves) * _numel(outs) > SMALL:
            return False  # full mode's plan is the pipeline's
        problem = _problem(func, args, diff, leaves, out)
        verdict = forward_mode(problem, config, leaves, outs, config.seed)
        return ForwardPassed() if verdict.outcome is Outcome.PASSED else False
    except Exception:  # noqa: BLE001 - the pipeline runs it again and reports what it raises
        return False


def _screened(call: _Call, config: CheckConfig, leaves: list[torch.Tensor],
              outs: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor] | None:
    """jvp along u within atol of the central difference at h on every output element, and
    ⟨v, J u⟩ within forward_ad's tolerance of ⟨vᵀJ, u⟩ (one backward): (u, J u), else None."""
    eps, atol, rtol = (config.tolerance(k) for k in ("eps", "atol", "rtol"))
    u, v = _vectors(config.seed, call.inputs, outs)
    ju = _jvp(call, u)
    plus, minus = (flat_cat(call.outputs([torch.add(x, d, alpha=f)
                                          for x, d in zip(call.inputs, u)]))
                   for f in (eps, -eps))
    grads = call.vjp(leaves, outs, v)
    # numpy on the same CPU float64 memory: a tenth of torch's dispatch for these few values
    ju_, plus_, minus_ = ju.numpy(), plus.numpy(), minus.numpy()
    with np.errstate(all="ignore"):  # NaN or inf: no agreement, the engine judges it
        if not bool((abs(ju_ - (plus_ - minus_) / (2 * eps)) <= atol).all()):
            return None
        forward = float(flat_cat(v).numpy() @ ju_)
        reverse = float(flat_cat(grads).numpy() @ flat_cat(u).numpy())
        return (u, ju) if abs(forward - reverse) <= atol + rtol * abs(reverse) else None


# A suite's many tiny calls draw the same few vectors (a generator and two draws: a sixth of a
# tiny call's screen): kept per seed and shapes, handed out as copies (the user's jvp receives u)
_DRAWN = Kept()


def _vectors(seed: int, inputs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """forward_ad's direction u (one tensor an input) and cotangent v (one an output), drawn as
    numerics/forward.py:forward_mode draws them from its seed: fresh copies."""
    def draw() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed + DIRECTION_SEED)
        return [direction(x, gen) for x in inputs], [direction(o.detach(), gen) for o in outs]

    key = (seed, *(x.shape for x in inputs), None, *(o.shape for o in outs))
    kept = _DRAWN.drawn(key, _numel(inputs) + _numel(outs), draw)
    return [t.clone() for t in kept[0]], [t.clone() for t in kept[1]]


@calls_user_code  # forward with dual inputs: a Function without jvp raises there, the user's
def _jvp(call: _Call, tangents: Sequence[torch.Tensor]) -> torch.Tensor:
    """J u, flat: one forward with dual inputs (forward AD ignores grad mode: no graph is
    built), the other arguments as given (the gate showed forward writes none)."""
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level(), torch.no_grad():
        given = {k: fwad.make_dual(x.clone(), t)
                 for k, x, t in zip(call.diff, call.inputs, tangents)}
        result = call.fn(*[given.get(k, a) for k, a in enumerate(call.args)])
        outs = select_outputs(result, call.mask)
        return flat_cat([_tangent(o) for o in outs])


def _tangent(out: torch.Tensor) -> torch.Tensor:
    import torch.autograd.forward_ad as fwad

    t = fwad.unpack_dual(out).tangent
    return torch.zeros_like(out.detach()) if t is None else t.detach()
