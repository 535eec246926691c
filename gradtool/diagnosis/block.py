"""A Jacobian block as every detector reads it (masks, labels, listings), constant-factor fits,
and the Diagnosis a detector returns: kind, data and words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np

# Deliberately numpy only: the renderer and the CLI import this without paying for torch.

_MAX_LISTED = 5  # elements named in a "few elements wrong" message
MIN_FIT = 2  # nonzero elements a structural fit (factor, transpose, shift) must rest on
_MIN_FREE_FIT = 3  # ...and an arbitrary (not simple) factor: two ratios agreeing once is chance
_MAX_DENOMINATOR = 12  # simplest fractions tried when rounding a factor (0.2000001 -> 1/5)


@dataclass(frozen=True)
class Diagnosis:
    """What a mismatched block shows: `kind` names the mistake (a rule of the check, e.g.
    "factor" for gradient.factor), `data` holds the plain values the sentence is made of;
    logic reads kind and data, renderers show `text`."""

    kind: str
    text: str
    data: dict[str, object] = field(default_factory=dict)

    def words(self, *, other: str = "numerical", actor: str = "backward",
              cotangent: str = "grad_output") -> str:
        """The sentence in another check's words: against a declared surrogate the other side
        is "intended"; said of jvp, the actor is jvp and grad_output the tangent."""
        text = self.text.replace("numerical", other)
        return text.replace("backward", actor).replace("grad_output", cotangent)


def close(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Torch's per-element test |a - n| <= atol + rtol * |n|; NaN never passes."""
    return np.abs(a - n) <= atol + rtol * np.abs(n)


def num(x: float) -> str:
    return f"{x:.4g}"


def index_text(flat: int, shape: tuple[int, ...]) -> str:
    return "(" + ",".join(str(int(i)) for i in np.unravel_index(int(flat), shape)) + ")"


@dataclass
class Block:
    """One (input, output) Jacobian block with the masks every detector needs."""

    a: np.ndarray
    n: np.ndarray
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    atol: float
    rtol: float
    name: str = ""
    x: np.ndarray | None = None
    others: Mapping[str, np.ndarray] = field(default_factory=dict)
    others_analytical: Mapping[str, np.ndarray] = field(default_factory=dict)
    judged: np.ndarray | None = None  # the caller's verdict per element (a measured tolerance)
    # a masked sparse input's columns (its specified elements): where each sits in the tensor
    places: Sequence[Sequence[int]] | None = None
    mis: np.ndarray = field(init=False)
    sig: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mis = (~close(self.a, self.n, self.atol, self.rtol) if self.judged is None
                    else np.asarray(self.judged, dtype=bool))
        # "nonzero" means above atol: finite-difference noise on structural zeros sits far below it.
        self.sig = np.abs(self.n) > self.atol

    def label(self, row: int, col: int) -> str:
        """Element as 'input index -> output index', unravelled with the user's shapes."""
        where = (index_text(col, self.in_shape) if self.places is None
                 else "(" + ",".join(str(int(i)) for i in self.places[col]) + ")")
        return f"{where}->{index_text(row, self.out_shape)}"

    def nonzero(self) -> str:
        return f"{int(self.sig.sum())} nonzero of {self.a.size}"

    def matches(self, candidate: np.ndarray, minimum: int = MIN_FIT) -> bool:
        """Analytical equals `candidate` at every element, on enough nonzero ones to mean it."""
        enough = int((np.abs(candidate) > self.atol).sum()) >= minimum
        return enough and bool(np.all(close(self.a, candidate, self.atol, self.rtol)))


def make_block(analytical: np.ndarray, numerical: np.ndarray, in_shape: tuple[int, ...] | None,
                out_shape: tuple[int, ...] | None, **extra: object) -> Block:
    a = np.asarray(analytical, dtype=np.float64)
    n = np.asarray(numerical, dtype=np.float64)
    if a.ndim != 2 or a.shape != n.shape:
        raise ValueError(f"analytical {a.shape} and numerical {n.shape} must be the same 2-D block")
    in_shape = tuple(in_shape) if in_shape is not None else (a.shape[1],)
    out_shape = tuple(out_shape) if out_shape is not None else (a.shape[0],)
    if (int(np.prod(out_shape)), int(np.prod(in_shape))) != a.shape:
        raise ValueError(f"block {a.shape} does not fit output {out_shape} x input {in_shape}")
    return Block(a, n, in_shape, out_shape, **extra)  # type: ignore[arg-type]


def listing(b: Block, mask: np.ndarray) -> str:
    """The worst few elements of `mask`, shown in index order, then how many were left out."""
    rows, cols = np.nonzero(mask)
    diff = np.abs(b.a - b.n)[rows, cols]
    keep = np.sort(np.argsort(-diff, kind="stable")[:_MAX_LISTED])
    items = [f"{b.label(r, c)} analytical {num(b.a[r, c])} vs numerical {num(b.n[r, c])}"
             for r, c in zip(rows[keep], cols[keep])]
    more = len(rows) - len(keep)
    return "; ".join(items) + (f"; and {more} more" if more else "")


def found(kind: str, text: str | None, **data: object) -> Diagnosis | None:
    return None if text is None else Diagnosis(kind, text, data)


# --- constant factors, shared by blocks, probes and second derivatives -------------------------

def simple_values(k: float) -> Iterator[float]:
    """Simple numbers near k, simplest first: m, 1/m, then p/q."""
    yield float(round(k))
    if round(1 / k):
        yield 1 / round(1 / k)
    for q in range(2, _MAX_DENOMINATOR + 1):
        yield round(k * q) / q


def factor_text(k: float) -> str:
    return f"{k:.8g}" if abs(abs(k) - 1) < 1e-3 else num(k)


def fit_factor(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> float | None:
    """k with a = k * n within tolerance at EVERY element (a simple k if one fits), else None."""
    sig = np.abs(n) > atol
    if int(sig.sum()) < MIN_FIT:
        return None
    k = float(np.vdot(a[sig], n[sig]) / np.vdot(n[sig], n[sig]))
    if not np.isfinite(k) or abs(k) * float(np.abs(n).max()) <= atol:
        return None  # a zero factor is a missing gradient, told apart elsewhere
    candidates = (*simple_values(k), k) if int(sig.sum()) >= _MIN_FREE_FIT else simple_values(k)
    # Most candidates fail at the largest element: tried there first, the whole block after.
    at = int(np.argmax(np.abs(n)))
    a_at, n_at = a.flat[at], n.flat[at]
    for cand in candidates:
        # k near 1 is a tolerance matter, not a factor the user could have written.
        if cand and abs(cand - 1) > rtol and close(a_at, cand * n_at, atol, rtol) \
                and np.all(close(a, cand * n, atol, rtol)):
            return cand
    return None


def factor_phrase(k: float) -> str:
    mag = abs(k)
    if abs(mag - 1) <= 1e-12:
        return "sign flipped"
    if abs(mag - 1) < 1e-3:  # a small relative error everywhere: "1" would hide it
        part = f"{'too large' if mag > 1 else 'too small'} by {abs(mag - 1):.2g} relative"
        return f"every element {part}" if k > 0 else f"sign flipped and {part}"
    part = f"backward misses a factor {num(1 / mag)}" if mag < 1 else f"extra factor {num(mag)}"
    return part if k > 0 else f"sign flipped and {part}"


def size_hint(k: float, numerical: np.ndarray, atol: float) -> str:
    """A factor equal to the broadcast/reduction size usually means mean and sum mixed up:
    said only where the block is one (each input element copied to r outputs, each output
    reading one input: a broadcast; or r inputs summed alike into each output: a reduction),
    not where the sizes merely divide (a matrix product's weight block)."""
    n_out, n_in = numerical.shape
    r, rem = divmod(max(n_out, n_in), min(n_out, n_in))
    if rem or r == 1 or k < 0:
        return ""
    nonzero = np.abs(numerical) > atol
    per_row, per_col = nonzero.sum(1), nonzero.sum(0)
    values = numerical[nonzero]  # a plain sum, mean or copy weighs every element alike
    alike = values.size > 0 and bool(np.all(close(values, values[0], atol, 1e-3)))
    spread = alike and n_out > n_in and bool(np.all(per_row == 1) and np.all(per_col == r))
    reduced = alike and n_out < n_in and bool(np.all(per_col == 1) and np.all(per_row == r))
    if abs(k - 1 / r) <= 1e-9 and spread:
        return f" (= {r}, the broadcast size: mean instead of sum over the broadcast dims?)"
    if abs(k - r) <= 1e-9 * r and reduced:
        return f" (= {r}, the reduction size: a sum's gradient for a mean, missing 1/{r}?)"
    return ""
