"""Facts: what the probe phase learnt about a case before any check, as one frozen record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..results import Finding


@dataclass(frozen=True)
class Facts:
    """Everything a check may need to know about how the target behaves, learnt once.

    targets/probe.py learns it for every case before the first check runs, so a check run
    alone (`--check gradient`) sees exactly what a full run sees. A Problem gradtool derives
    internally (double backward's, the float64 reference, the realified complex one, a Function
    captured inside a model) is given its facts by its creator. Nothing writes a field later:
    the record is replaced whole.
    """

    learnt: bool = False              # the probe ran (False: defaults, nothing was learnt)
    mutates: bool = False             # forward writes to an input: it is given copies
    seed: int | None = None           # forward is stochastic: torch's RNG re-seeded with this
    output_mask: tuple[bool, ...] | None = None  # which tensor outputs are compared (None: all)
    output_names: tuple[str, ...] = ()  # the compared outputs' names
    # the compared outputs' (shape, dtype, tracked by autograd): the cost plan counts from them
    output_shapes: tuple[tuple[tuple[int, ...], str, bool], ...] = ()
    left_out: tuple[str, ...] = ()    # float outputs autograd does not track
    complex: bool | None = None       # a complex input or output (None: not known yet)
    has_functions: bool = False       # the user's custom Function nodes in forward's graph
    #                                   (a torch.library op's generated Function is not one)
    precision: str | None = None      # the least precise floating dtype among inputs, outputs
    findings: tuple[Finding, ...] = ()  # rules the probe saw broken (forward's purity)
    forward_seconds: float | None = None  # the cheaper of the probe's forwards: the cost model
    # forward's outputs differ between calls on the same inputs with torch's RNG frozen (no
    # randomness gradtool controls: uninitialised memory, a counter): (output, how) per output
    drift: tuple[tuple[str, str], ...] = ()
    # the largest difference of a drift below what the checks resolve (a summation order): a
    # central difference may move by twice it over 2h, so the first bound allows for that
    drift_size: float = 0.0

    @property
    def stochastic(self) -> bool:
        return self.seed is not None

    @property
    def outputs_known(self) -> bool:
        return self.output_mask is not None

    def with_(self, **changes: Any) -> Facts:
        return replace(self, **changes)


def output_facts(outs: Sequence[Any], labels: Sequence[str] | None, keep_all: bool = False,
                 leaves: Sequence[Any] = ()) -> dict[str, Any]:
    """Which of forward's tensor outputs are compared, their names, and which are left out.

    Outputs autograd never differentiates (ctx.mark_non_differentiable, a layer norm's mean and
    rstd) have no analytical Jacobian to compare. When none is tracked, every float output
    stays: a forward that detaches everything must fail, not pass empty.
    """
    floats = [o.is_floating_point() or o.is_complex() for o in outs]
    tracked = [f and o.requires_grad for f, o in zip(floats, outs)]
    mask = floats if keep_all or not any(tracked) else tracked
    names = list(labels) if labels else output_names(len(outs))
    return {
        "output_mask": tuple(mask),
        "output_names": tuple(n for n, keep in zip(names, mask) if keep),
        "output_shapes": tuple((tuple(o.shape), str(o.dtype).replace("torch.", ""),
                                bool(o.requires_grad)) for o, keep in zip(outs, mask) if keep),
        "left_out": tuple(n for n, f, keep in zip(names, floats, mask) if f and not keep),
        "complex": any(v.is_complex() for v in leaves) or any(o.is_complex() for o in outs),
    }


def output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output {k}" for k in range(count)]
