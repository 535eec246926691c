"""Index permutations of a Jacobian block: transposes (any axis pair, non-square, batched) and
shifts or rolls along any axis; the block is diagnosis/block.py's Block."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .block import Diagnosis


def _close(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    return np.abs(a - n) <= atol + rtol * np.abs(n)


def _axis_pairs(shape: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Pairs of axes a transpose could swap: the last two first (matrices, batched blocks)."""
    pairs = [(i, j) for j in range(len(shape)) for i in range(j)]
    pairs.sort(key=lambda p: (-(p[1] == len(shape) - 1 and p[0] == len(shape) - 2), -p[1], -p[0]))
    for i, j in pairs:
        if shape[i] > 1 and shape[j] > 1:
            yield i, j


def transposed(b: Any) -> str | None:
    """A transpose of the returned gradient (or of grad_output), also of a non-square block
    laid back into the original shape (.t().reshape) and within a batch of blocks."""
    for side, shape in (("input", b.in_shape), ("output", b.out_shape)):
        size = int(np.prod(shape)) if shape else 1
        for i, j in _axis_pairs(shape):
            perm = np.arange(size).reshape(shape).swapaxes(i, j).ravel()
            cand = b.n[:, perm] if side == "input" else b.n[perm, :]
            # one nonzero element moved to its transposed place is evidence enough (a one-hot
            # gradient: max, norm inf); the identity permutation is excluded by mismatching
            if not b.matches(cand, minimum=1):
                continue
            what = "returns the gradient" if side == "input" else "uses grad_output"
            square = shape[i] == shape[j]
            kind = ("" if square else
                    f" and laid back into shape {tuple(shape)} (a .t().reshape?)")
            batch = (f" within each of the {size // (shape[i] * shape[j])} blocks"
                     if len(shape) > 2 else "")
            axes = f"axes {i} and {j}" if len(shape) > 2 else "(i,j) <-> (j,i)"
            return (f"analytical = numerical with {side} indices transposed, {axes}{batch}, for "
                    f"every element ({b.nonzero()}): backward {what} transposed{kind} (a .t() "
                    f"too many or too few?)")
    n_out, n_in = b.n.shape
    if n_out == n_in > 1 and not np.allclose(b.n, b.n.T) and b.matches(b.n.T):
        return (f"analytical = the numerical Jacobian transposed, as a {n_out} x {n_in} matrix, "
                f"for every element ({b.nonzero()}): backward computes J v instead of vᵀJ (a "
                "Jacobian-vector product where the vector-Jacobian product belongs?)")
    return None


def _shift(arr: np.ndarray, step: int, axis: int, wrap: bool) -> np.ndarray:
    """arr moved by `step` along `axis`: rolled round, or with zeros coming in at the edge."""
    out = np.roll(arr, step, axis=axis)
    if not wrap:
        edge = [slice(None)] * arr.ndim
        edge[axis] = slice(0, step) if step > 0 else slice(step, None)
        out[tuple(edge)] = 0.0
    return out


def _shift_views(b: Any) -> Iterator[tuple[str, str, np.ndarray, int]]:
    """(side, where, view of numerical, axis) for each axis an off-by-one index could run along."""
    n_out, n_in = b.n.shape
    multi_in, multi_out = len(b.in_shape) >= 2, len(b.out_shape) >= 2
    yield "input", "the flattened input" if multi_in else "the input", b.n, 1
    if multi_in:
        yield "input", "the last input axis", b.n.reshape(n_out, *b.in_shape), -1
    yield "output", "the flattened output" if multi_out else "the output", b.n, 0
    if multi_out:
        yield "output", "the last output axis", b.n.reshape(*b.out_shape, n_in), -2


def shifted(b: Any) -> str | None:
    for side, where, view, axis in _shift_views(b):
        for step in (1, -1):
            if np.allclose(np.roll(view, step, axis=axis), view, rtol=b.rtol, atol=b.atol):
                continue  # numerical is constant along the axis: every shift of it matches
            for wrap in (False, True):
                if b.matches(_shift(view, step, axis, wrap).reshape(b.n.shape)):
                    rolled, sign = (", wrapping round" if wrap else ""), ("-" if step > 0 else "+")
                    return (f"analytical at {side} index i equals numerical at i{sign}1 along "
                            f"{where}{rolled}, for every element ({b.nonzero()}): shifted by one "
                            f"element, an off-by-one index in backward")
    return _rolled(b)


def _roll_steps(b: Any, view: np.ndarray, axis: int, side: str) -> list[int]:
    """Candidate roll steps along `axis`: where the largest analytical element's value sits in
    numerical along that axis (a handful, not every step)."""
    r, c = np.unravel_index(int(np.argmax(np.abs(b.a))), b.a.shape)
    target = b.a[r, c]
    if not abs(target) > b.atol:
        return []
    full = b.a.reshape(view.shape)
    index = np.unravel_index(int(r * b.a.shape[1] + c), full.shape)
    line = list(index)
    line[axis] = slice(None)
    values = view[tuple(line)]
    near = np.nonzero(_close(np.full_like(values, target), values, b.atol, b.rtol))[0]
    size = view.shape[axis]
    steps = [int((index[axis] - k) % size) for k in near]
    return [s for s in dict.fromkeys(steps) if s not in (0,)][:8]


def _rolled(b: Any) -> str | None:
    """Rolled (wrapping) by any step along any axis of the input or the output."""
    n_out, n_in = b.n.shape
    for side, shape in (("input", b.in_shape), ("output", b.out_shape)):
        for d, size in enumerate(shape):
            if size < 2:
                continue
            view = (b.n.reshape(n_out, *shape) if side == "input"
                    else b.n.reshape(*shape, n_in))
            axis = d + 1 if side == "input" else d
            for step in _roll_steps(b, view, axis, side):
                if b.matches(np.roll(view, step, axis=axis).reshape(b.n.shape), minimum=1):
                    shown = step if step <= size // 2 else step - size
                    return (f"analytical = numerical rolled by {shown:+d} along {side} axis {d} "
                            f"(size {size}), wrapping round, for every element ({b.nonzero()}): "
                            f"backward's gradient is shifted along that dimension (a roll or "
                            f"an index offset in backward)")
    return None


def straight_through(b: Any) -> str | None:
    """Analytical the identity, or an identity clipped to a range, where finite differences
    see a step (zero derivative): a straight-through estimator, a surrogate by design."""
    n_out, n_in = b.a.shape
    if n_out != n_in or n_in < 2 or tuple(b.in_shape) != tuple(b.out_shape):
        return None
    off = ~np.eye(n_in, dtype=bool)
    if np.any(np.abs(b.a[off]) > b.atol):
        return None
    diag, numerical = np.diag(b.a), np.diag(b.n)
    ones, zeros = _close(diag, np.ones_like(diag), b.atol, b.rtol), np.abs(diag) <= b.atol
    flat = ones & (np.abs(numerical) <= b.atol)  # where forward is a step: derivative zero
    # A step agrees with the identity nowhere (a ReLU that forgot its mask agrees where x > 0)
    agreeing = ones & _close(diag, numerical, b.atol, b.rtol)
    if not np.all(ones | zeros) or int(ones.sum()) < 2 or agreeing.any() or \
            2 * int(flat.sum()) < int(ones.sum()):
        return None
    if zeros.any():
        what = (f"an identity clipped to {int(ones.sum())} of {n_in} elements"
                f"{_pass_range(b, ones)}, zero elsewhere,")
        kind = "clipped_identity, range: [lo, hi]"
    else:
        what, kind = "the identity", "identity"
    return (f"analytical is {what} while finite differences see a step (zero "
            f"derivative at {int(flat.sum())} of them): a straight-through estimator? If this "
            f"surrogate gradient is intended, declare it in a spec (surrogate: {{kind: {kind}, "
            f"inputs: [{b.name or 'x'}]}}) and gradtool checks backward against it")


def _pass_range(b: Any, ones: np.ndarray) -> str:
    """' (passing where 'x' lies in [-0.98, 0.97] here)', from the input values when known."""
    if b.x is None or np.size(b.x) != ones.size:
        return ""
    x = np.asarray(b.x, dtype=np.float64).ravel()
    lo, hi = x[ones].min(), x[ones].max()
    if np.any((x[~ones] >= lo) & (x[~ones] <= hi)):
        return ""  # not one interval of the input's values
    return f" (passing where '{b.name}' lies in [{lo:.3g}, {hi:.3g}] here)"


# --- the same permutations, tested on probes of a block too large to evaluate whole -----------

def _permutations(shape: tuple[int, ...]) -> Iterator[tuple[str, np.ndarray]]:
    """(words, perm) with candidate[k] = original[perm[k]] over the flattened shape: rolls by
    every step along every axis, then transposes of every axis pair (laid back into shape)."""
    size = int(np.prod(shape)) if shape else 1
    index = np.arange(size).reshape(shape)
    for d, n in enumerate(shape):
        for step in range(1, n):
            shown = step if step <= n // 2 else step - n
            yield (f"rolled by {shown:+d} along {{side}} axis {d} (size {n}), wrapping round",
                   np.roll(index, step, axis=d).ravel())
    for i, j in _axis_pairs(shape):
        laid = "" if shape[i] == shape[j] else f" and laid back into shape {tuple(shape)}"
        yield (f"with {{side}} indices transposed, axes {i} and {j}{laid}",
               index.swapaxes(i, j).ravel())


def permuted_probes(p: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...], name: str,
                    rtol: float) -> Diagnosis | None:
    """An index permutation (roll, transpose) of the returned gradient or of grad_output, or a
    gradient swapped with another input's, fitting every probe (numerics/permuted.py's: one
    analytical gradient g = vᵀJ and one finite-difference J u per probe, so each candidate is
    a dot product, no evaluation)."""
    probes = list(zip(p.grads, p.directions, p.jvps, p.cotangents))
    analytical = [(float(g @ u), float(np.abs(g * u).sum())) for g, u, _, _ in probes]
    exact = [(float(ju @ v), float(np.abs(ju * v).sum())) for _, _, ju, v in probes]
    if _fits(analytical, exact, rtol):
        return None  # the probes agree: not this kind of mistake
    tail = f"on all {len(probes)} random probes (the block is too large to evaluate whole)"
    for other, values in p.others.items():
        if _fits(analytical, [(x, abs(x)) for x in values], rtol):
            return Diagnosis("swapped", f"analytical matches the numerical gradient of input "
                             f"'{other}' {tail}: looks like the gradient of input '{other}': "
                             "gradients swapped?", {"other": other, "probes": len(probes)})
    for side, shape in (("input", in_shape), ("output", out_shape)):
        for words, perm in _permutations(tuple(shape)):
            if side == "input":  # g[k] = g_true[perm[k]], so g_true·u = g·u[perm]
                moved = [(float(g @ u[perm]), float(np.abs(g * u[perm]).sum()))
                         for g, u, _, _ in probes]
                fits = _fits(moved, exact, rtol)
            else:  # g = Jᵀw with w[perm] = v, so g·u = w·(J u)
                moved = [_dot_placed(v, perm, ju) for _, _, ju, v in probes]
                fits = _fits(analytical, moved, rtol)
            if fits:
                return _permutation_text(words, side, tail, name)
    return None


def _dot_placed(v: np.ndarray, perm: np.ndarray, ju: np.ndarray) -> tuple[float, float]:
    w = np.zeros_like(v)
    w[perm] = v
    return float(w @ ju), float(np.abs(w * ju).sum())


def _fits(a: list[tuple[float, float]], b: list[tuple[float, float]], rtol: float) -> bool:
    """Each (value, scale) pair of a equals b's within rtol of the larger scale."""
    return all(abs(x - y) <= rtol * max(sx, sy) + 1e-300 for (x, sx), (y, sy) in zip(a, b))


def _permutation_text(words: str, side: str, tail: str, name: str) -> Diagnosis:
    rolled = words.startswith("rolled")
    what = "returns the gradient" if side == "input" else "uses grad_output"
    how = ("shifted along that dimension (a roll or an index offset in backward)" if rolled
           else "transposed (a .t() too many or too few?)")
    return Diagnosis("shifted" if rolled else "transposed",
                     f"analytical = numerical {words.format(side=side)}, {tail}: backward "
                     f"{what} for '{name}' {how}",
                     {"side": side, "permutation": words.format(side=side), "from": "probes"})
