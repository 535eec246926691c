"""The layouts the layout check tries (a transposed, sliced, expanded or channels_last copy of
the same values) and the evaluations trying them costs on correct code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..numerics.problem import Problem


@dataclass(frozen=True)
class Variant:
    """One layout: its name, how a report says it, and how to build it from a contiguous tensor
    (k: the tensor's position; None where the layout does not apply or changes nothing)."""

    name: str
    words: str
    make: Callable[[torch.Tensor, int], torch.Tensor | None]
    same_values: bool = True   # False: it carries values of its own (an expanded tensor)


def _dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.numel() > 0


def transposed(t: torch.Tensor, _: int = 0) -> torch.Tensor | None:
    """The same values, the last two dimensions stored transposed (what .t()/.mT leave)."""
    if t.dim() < 2 or not _dense(t):
        return None
    out = t.mT.contiguous().mT
    return None if out.is_contiguous() else out  # a 1-element dimension: nothing changes


def sliced(t: torch.Tensor, _: int = 0) -> torch.Tensor | None:
    """The same values every other element of a larger buffer, at storage offset 1 (a slice);
    the gaps hold NaN, so a backward reading them shows it."""
    if t.dim() == 0 or not _dense(t) or not (t.is_floating_point() or t.is_complex()):
        return None
    pad = torch.full_like(t, float("nan"))
    return torch.stack([pad, t], dim=-1).flatten(-2)[..., 1::2]


def expanded(t: torch.Tensor, _: int = 0) -> torch.Tensor | None:
    """One value broadcast with stride 0 everywhere: the grad_output `.sum()` gives."""
    if t.numel() < 2 or not _dense(t):
        return None
    # A storage of one element, as autograd's SumBackward gives: reading past it raises.
    return t.reshape(-1)[:1].clone().reshape((1,) * t.dim()).expand(t.shape)


def channels_last(t: torch.Tensor, _: int = 0) -> torch.Tensor | None:
    """The same values in channels_last (4-d) or channels_last_3d (5-d) memory."""
    if t.dim() not in (4, 5) or not _dense(t):
        return None
    fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    out = t.contiguous(memory_format=fmt)
    return None if out.is_contiguous() else out  # C == 1 or H*W == 1: the same memory


GRAD_VARIANTS = (
    Variant("transposed", "a transposed grad_output", transposed),
    Variant("sliced", "a sliced grad_output (storage offset 1, stride 2)", sliced),
    Variant("expanded", "an expanded (stride-0) grad_output, as .sum() produces", expanded,
            same_values=False),
    Variant("channels_last", "a channels_last grad_output", channels_last),
)
INPUT_VARIANTS = (
    Variant("transposed", "transposed", transposed),
    Variant("sliced", "sliced (storage offset 1, stride 2)", sliced),
    Variant("channels_last", "channels_last", channels_last),
)


def evaluations(problem: Problem, outs: list[torch.Tensor], grads: list[torch.Tensor],
                 fresh: bool, grad_variants: Sequence[Variant],
                 input_variants: Sequence[Variant], movable: Sequence[int]) -> int:
    """The evaluations compare_layouts makes after its baseline on correct code: a backward
    per grad_output layout that applies (and its contiguous twin's where the layout carries
    values of its own; each on a forward of its own where `fresh`), a forward and a backward
    per input layout that applies."""
    count = 0
    for variant in grad_variants:
        if any(o.requires_grad and variant.make(g, k) is not None
               for k, (g, o) in enumerate(zip(grads, outs))):
            count += (1 + int(fresh)) * (1 + int(not variant.same_values))
    inputs = problem.inputs
    return count + 2 * sum(any(variant.make(inputs[k], k) is not None for k in movable)
                           for variant in input_variants)
