"""Sparse arguments at the engine's edge: checked as dense values, rebuilt sparse for each call.

The engine perturbs and compares strided tensors only. A sparse argument (COO, CSR, CSC, BSR,
BSC) is therefore held as a strided value and rebuilt in its layout, differentiably, before the
target sees it, mirroring torch.autograd.gradcheck's `masked`:
- unmasked (gradcheck's default): the value is the dense tensor, every element is perturbed and
  every element of the gradient compared (an unspecified element is a zero, like any other);
- masked: the value is the specified elements only (the layout's `values()`), the Jacobian's
  columns are those elements, and what backward says of the others is not compared.
Sparse outputs are compared through `to_dense()` and sparse gradients densified (problem.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import InputError
from ..results import Block
from ..tracebacks import calls_user_code

COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
ROW_MAJOR = (torch.sparse_csr, torch.sparse_bsr)
BLOCKED = (torch.sparse_bsr, torch.sparse_bsc)


def is_sparse(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout in (torch.sparse_coo, *COMPRESSED)


@dataclass(frozen=True)
class Encoding:
    """How one sparse argument travels through the engine (its pattern and semantics)."""

    pattern: torch.Tensor   # the given tensor, detached (COO coalesced)
    masked: bool

    @staticmethod
    def of(tensor: torch.Tensor, masked: bool) -> Encoding:
        if tensor.is_complex() and not masked:
            raise InputError("a complex sparse input can only be compared on its specified "
                             "elements: torch cannot differentiate to_sparse of a complex "
                             "tensor, by which every element would be", "pass masked=True "
                             "(--masked), or check the dense function with tensor.to_dense()")
        if tensor.is_complex() and tensor.layout in COMPRESSED:
            layout = str(tensor.layout).removeprefix("torch.")
            raise InputError(f"a complex {layout} input cannot be checked: torch cannot "
                             f"differentiate building a complex {layout} tensor (no autograd "
                             "for sparse_compressed_tensor with complex values), which giving "
                             "the target one that requires grad needs", "check it as COO "
                             "(tensor.to_sparse_coo()) or dense (tensor.to_dense())")
        tensor = tensor.detach()
        if tensor.layout == torch.sparse_coo:
            tensor = tensor.coalesce()
        return Encoding(tensor, masked)

    def value(self) -> torch.Tensor:
        """The strided value the engine perturbs: the specified elements, or the dense tensor."""
        if self.masked:
            return self.pattern.values().clone()
        return self.pattern.to_dense()

    def rebuild(self, value: torch.Tensor) -> torch.Tensor:
        """The argument in its layout, from the engine's value (differentiable in it)."""
        p = self.pattern
        if not self.masked:
            return self._every_element(value)
        if p.layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(p.indices(), value, p.shape, is_coalesced=True,
                                           check_invariants=False, device=value.device)
        compressed, plain = ((p.crow_indices(), p.col_indices()) if p.layout in ROW_MAJOR
                             else (p.ccol_indices(), p.row_indices()))
        return torch.sparse_compressed_tensor(compressed, plain, value, p.shape, layout=p.layout,
                                              check_invariants=False, device=value.device)

    def _every_element(self, value: torch.Tensor) -> torch.Tensor:
        """The given pattern (explicit zeros kept) holding value's elements there, plus every
        element a perturbation made nonzero off it (specified then, as in gradcheck's densified
        input); its gradient is backward's whole gradient, wherever backward put it."""
        p = self.pattern
        coo = p if p.layout == torch.sparse_coo else p.to_sparse_coo().coalesce()
        at = coo.indices()
        kept = torch.sparse_coo_tensor(at, value[tuple(at)], p.shape, is_coalesced=True,
                                       check_invariants=False, device=value.device)
        outside = torch.ones(p.shape[:coo.sparse_dim()], dtype=torch.bool, device=value.device)
        outside[tuple(at)] = False
        off = (value * outside.reshape(*outside.shape, *[1] * coo.dense_dim())).to_sparse(
            sparse_dim=coo.sparse_dim())
        whole = (kept + off).coalesce()  # off empty at x itself, but in the graph: its gradient
        if p.layout == torch.sparse_coo:
            return whole
        blocksize = tuple(p.values().shape[1:3]) if p.layout in BLOCKED else None
        return whole.to_sparse(layout=p.layout, blocksize=blocksize)

    def places(self) -> torch.Tensor:
        """(elements of the value, sparse dims + dense dims): where each element of the masked
        value (values(), in storage order) sits in the sparse tensor."""
        values = self.pattern.values()
        ids = torch.arange(1, values.numel() + 1, dtype=torch.float64, device=values.device)
        dense = self.rebuild(ids.reshape(values.shape)).to_dense()  # each element its number
        at = dense.nonzero()
        places = torch.empty_like(at)
        places[dense[tuple(at.T)].long() - 1] = at
        return places

    def describe(self) -> str:
        elements = "specified elements (masked)" if self.masked else "every element (unmasked)"
        return f"{str(self.pattern.layout).removeprefix('torch.')}, {elements}"


def rebuilding(fn: Callable[..., Any], encodings: dict[int, Encoding]) -> Callable[..., Any]:
    """fn taking the engine's values: the sparse positions rebuilt in their layout first."""
    @calls_user_code
    def call(*args: Any, **kwargs: Any) -> Any:
        work = list(args)
        for position, encoding in encodings.items():
            work[position] = encoding.rebuild(work[position])
        return fn(*work, **kwargs)

    return call


def dense_output(t: torch.Tensor) -> torch.Tensor:
    """A sparse output compared as the dense tensor it stands for; grad_outputs reach backward
    on its specified elements (to_dense's masked_grad)."""
    return t.to_dense() if is_sparse(t) else t


def masked_places(problem: Any) -> dict[str, tuple[list[list[int]], tuple[int, ...]]]:
    """name -> (where each element of its value sits, the tensor's shape) for each masked
    sparse input of a Problem: its elements are named there in reports, not by their number in
    values()."""
    out = {}
    for k, position in enumerate(problem.diff):
        encoding = problem.sparse.get(position)
        if encoding is not None and encoding.masked:
            out[problem.input_names[k]] = (encoding.places().tolist(),
                                           tuple(encoding.pattern.shape))
    return out


def in_place(block: Block, places: list[list[int]], shape: tuple[int, ...],
             value_shape: tuple[int, ...]) -> Block:
    """A masked input's block (`places`, `shape`: masked_places') with its elements named
    where they sit in the sparse tensor (a[2, 1]), not by their number in values() (a[7]); the
    heat map, drawn over values()' order, is dropped."""

    def flat(index: tuple[int, ...]) -> int:
        out = 0
        for i, size in zip(index, value_shape):
            out = out * size + i
        return out

    worst = tuple(replace(e, input_index=tuple(places[flat(e.input_index)]))
                  for e in block.worst)
    return replace(block, input_shape=shape, worst=worst, grid=None)
