"""How often the diagnosis names a seeded index permutation: rolls, transposes and swapped
gradients seeded into the backwards of real-code-like Functions (linear layers, attention,
convolutions, norms, scans), each checked with gradtool.check.

    python benchmarks/permutations.py [--large] [NAME ...]   # rates per kind, every miss
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd import Function

import gradtool

Mutate = Callable[[list[torch.Tensor]], list[torch.Tensor]]
NAMES = {"roll": ("rolled", "shifted"), "transpose": ("transposed",), "swap": ("swapped",)}


def _attention(q, k, v):
    return torch.softmax(q @ k.mT / 2, -1) @ v


def _gru_gate(x, h, w):
    return torch.sigmoid(x @ w) * torch.tanh(h)


SMALL: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "linear": (lambda x, w, b: x @ w.T + b, [(4, 5), (3, 5), (3,)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(3, 5)]),
    "layer_norm": (lambda x, g, b: F.layer_norm(x, (6,), g, b), [(4, 6), (6,), (6,)]),
    "attention": (_attention, [(2, 3, 4), (2, 5, 4), (2, 5, 4)]),
    "conv1d": (lambda x, w: F.conv1d(x, w), [(2, 3, 7), (4, 3, 3)]),
    "gru_gate": (_gru_gate, [(3, 4), (3, 5), (4, 5)]),
    "cumsum": (lambda x: torch.cumsum(x, 1), [(3, 6)]),
    "mul_add": (lambda x, y, z: x * y + z, [(3, 4), (3, 4), (3, 4)]),
}
# Sizes of real layers: Jacobians too large for full mode, seen through probes.
LARGE: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "linear": (SMALL["linear"][0], [(16, 64), (48, 64), (48,)]),
    "softmax": (SMALL["softmax"][0], [(32, 50)]),
    "layer_norm": (lambda x, g, b: F.layer_norm(x, (64,), g, b), [(32, 64), (64,), (64,)]),
    "attention": (_attention, [(4, 16, 32), (4, 20, 32), (4, 20, 32)]),
    "conv1d": (SMALL["conv1d"][0], [(4, 8, 40), (16, 8, 5)]),
    "gru_gate": (_gru_gate, [(16, 32), (16, 48), (32, 48)]),
    "cumsum": (SMALL["cumsum"][0], [(24, 40)]),
    "mul_add": (SMALL["mul_add"][0], [(30, 40), (30, 40), (30, 40)]),
}


def wrap(fn: Callable[..., Any], mutate: Mutate | None) -> type[Function]:
    """A Function computing fn whose backward is fn's VJP, mutated."""

    class Seeded(Function):
        @staticmethod
        def forward(ctx, *xs):
            ctx.save_for_backward(*xs)
            return fn(*xs).clone()

        @staticmethod
        def backward(ctx, grad):
            xs = ctx.saved_tensors
            with torch.enable_grad():
                inner = [x.detach().requires_grad_(True) for x in xs]
                got = list(torch.autograd.grad(fn(*inner), inner, grad))
            return tuple(mutate(got) if mutate else got)

    return Seeded


def mutations(shapes: Sequence[tuple[int, ...]]) -> list[tuple[str, str, Mutate]]:
    """(kind, label, mutation) for every roll, transpose and swap that fits the shapes."""
    out: list[tuple[str, str, Mutate]] = []
    for k, shape in enumerate(shapes):
        for d, size in enumerate(shape):
            for step in (1, -1, 2):
                if size > abs(step):
                    out.append(("roll", f"input {k} rolled {step:+d} along {d}",
                                _at(k, lambda g, s=step, d=d: g.roll(s, d))))
        if len(shape) >= 2:
            out.append(("transpose", f"input {k} transposed, laid back",
                        _at(k, lambda g: g.transpose(-1, -2).reshape(g.shape))))
        for j in range(k + 1, len(shapes)):
            if shapes[j] == shape:
                out.append(("swap", f"inputs {k} and {j} swapped", _swap(k, j)))
    return out


def _at(k: int, change: Callable[[torch.Tensor], torch.Tensor]) -> Mutate:
    def mutate(got: list[torch.Tensor]) -> list[torch.Tensor]:
        got = list(got)
        got[k] = change(got[k])
        return got
    return mutate


def _swap(k: int, j: int) -> Mutate:
    def mutate(got: list[torch.Tensor]) -> list[torch.Tensor]:
        got = list(got)
        got[k], got[j] = got[j], got[k]
        return got
    return mutate


def main() -> int:
    functions = LARGE if "--large" in sys.argv else SMALL
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    functions = {k: v for k, v in functions.items() if not only or k in only}
    tally: dict[str, list[int]] = {kind: [0, 0] for kind in NAMES}
    misses = []
    for name, (fn, shapes) in functions.items():
        values = [torch.randn(s, dtype=torch.float64, generator=torch.Generator().manual_seed(
            len(s) + k)) for k, s in enumerate(shapes)]
        for kind, label, mutate in mutations(shapes):
            report = gradtool.check(wrap(fn, mutate), values, checks=("gradient",), seed=0)
            (_, _, check), = report.checks()
            if check.outcome.value != "failed":
                continue  # the mutation changed nothing beyond tolerance (a symmetric block)
            tally[kind][1] += 1
            texts = [b.diagnosis or "" for b in check.blocks if b.mismatched]
            if any(word in t for t in texts for word in NAMES[kind]):
                tally[kind][0] += 1
            else:
                misses.append(f"{name}: {label}: {texts[0][:160] if texts else check.summary}")
    for kind, (named, total) in tally.items():
        print(f"{kind}: named {named} of {total} ({100 * named / max(total, 1):.0f} %)")
    print("\n".join(misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
