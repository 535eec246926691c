"""Turn a Jacobian mismatch into a Diagnosis: the kind of mistake (a rule's name), its data and
the one-line cause in the user's terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from .structure import shifted, transposed

# Deliberately numpy only: the renderer and the CLI import this without paying for torch.

_MAX_LISTED = 5  # elements named in a "few elements wrong" message
_MIN_FIT = 2  # nonzero elements a structural fit (factor, transpose, shift) must rest on
_MIN_FREE_FIT = 3  # ...and an arbitrary (not simple) factor: two ratios agreeing once is chance
_MIN_SIDE = 3  # input elements needed on each side of a sign split
_MIN_SPLITS = 100  # same-size column sets a sign split must be one of: chance match under 1%
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


def _close(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Torch's per-element test |a - n| <= atol + rtol * |n|; NaN never passes."""
    return np.abs(a - n) <= atol + rtol * np.abs(n)


def _num(x: float) -> str:
    return f"{x:.4g}"


def _index(flat: int, shape: tuple[int, ...]) -> str:
    return "(" + ",".join(str(int(i)) for i in np.unravel_index(int(flat), shape)) + ")"


@dataclass
class _Block:
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
    mis: np.ndarray = field(init=False)
    sig: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mis = ~_close(self.a, self.n, self.atol, self.rtol)
        # "nonzero" means above atol: finite-difference noise on structural zeros sits far below it.
        self.sig = np.abs(self.n) > self.atol

    def label(self, row: int, col: int) -> str:
        """Element as 'input index -> output index', unravelled with the user's shapes."""
        return f"{_index(col, self.in_shape)}->{_index(row, self.out_shape)}"

    def nonzero(self) -> str:
        return f"{int(self.sig.sum())} nonzero of {self.a.size}"

    def matches(self, candidate: np.ndarray, minimum: int = _MIN_FIT) -> bool:
        """Analytical equals `candidate` at every element, on enough nonzero ones to mean it."""
        enough = int((np.abs(candidate) > self.atol).sum()) >= minimum
        return enough and bool(np.all(_close(self.a, candidate, self.atol, self.rtol)))


def _make_block(analytical: np.ndarray, numerical: np.ndarray, in_shape: tuple[int, ...] | None,
                out_shape: tuple[int, ...] | None, **extra: object) -> _Block:
    a = np.asarray(analytical, dtype=np.float64)
    n = np.asarray(numerical, dtype=np.float64)
    if a.ndim != 2 or a.shape != n.shape:
        raise ValueError(f"analytical {a.shape} and numerical {n.shape} must be the same 2-D block")
    in_shape = tuple(in_shape) if in_shape is not None else (a.shape[1],)
    out_shape = tuple(out_shape) if out_shape is not None else (a.shape[0],)
    if (int(np.prod(out_shape)), int(np.prod(in_shape))) != a.shape:
        raise ValueError(f"block {a.shape} does not fit output {out_shape} x input {in_shape}")
    return _Block(a, n, in_shape, out_shape, **extra)  # type: ignore[arg-type]


def _listing(b: _Block, mask: np.ndarray) -> str:
    """The worst few elements of `mask`, shown in index order, then how many were left out."""
    rows, cols = np.nonzero(mask)
    diff = np.abs(b.a - b.n)[rows, cols]
    keep = np.sort(np.argsort(-diff, kind="stable")[:_MAX_LISTED])
    items = [f"{b.label(r, c)} analytical {_num(b.a[r, c])} vs numerical {_num(b.n[r, c])}"
             for r, c in zip(rows[keep], cols[keep])]
    more = len(rows) - len(keep)
    return "; ".join(items) + (f"; and {more} more" if more else "")


def _found(kind: str, text: str | None, **data: object) -> Diagnosis | None:
    return None if text is None else Diagnosis(kind, text, data)


# --- constant factors, shared by blocks, probes and second derivatives -------------------------

def _simple_values(k: float) -> Iterator[float]:
    """Simple numbers near k, simplest first: m, 1/m, then p/q."""
    yield float(round(k))
    if round(1 / k):
        yield 1 / round(1 / k)
    for q in range(2, _MAX_DENOMINATOR + 1):
        yield round(k * q) / q


def _factor_text(k: float) -> str:
    return f"{k:.8g}" if abs(abs(k) - 1) < 1e-3 else _num(k)


def _fit_factor(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> float | None:
    """k with a = k * n within tolerance at EVERY element (a simple k if one fits), else None."""
    sig = np.abs(n) > atol
    if int(sig.sum()) < _MIN_FIT:
        return None
    k = float(np.dot(a[sig], n[sig]) / np.dot(n[sig], n[sig]))
    if not np.isfinite(k) or abs(k) * float(np.abs(n).max()) <= atol:
        return None  # a zero factor is a missing gradient, told apart elsewhere
    candidates = (*_simple_values(k), k) if int(sig.sum()) >= _MIN_FREE_FIT else _simple_values(k)
    for cand in candidates:
        # k near 1 is a tolerance matter, not a factor the user could have written.
        if cand and abs(cand - 1) > rtol and np.all(_close(a, cand * n, atol, rtol)):
            return cand
    return None


def _factor_phrase(k: float) -> str:
    mag = abs(k)
    if abs(mag - 1) <= 1e-12:
        return "sign flipped"
    if abs(mag - 1) < 1e-3:  # a small relative error everywhere: "1" would hide it
        part = f"{'too large' if mag > 1 else 'too small'} by {abs(mag - 1):.2g} relative"
        return f"every element {part}" if k > 0 else f"sign flipped and {part}"
    part = f"backward misses a factor {_num(1 / mag)}" if mag < 1 else f"extra factor {_num(mag)}"
    return part if k > 0 else f"sign flipped and {part}"


def _size_hint(k: float, n_out: int, n_in: int) -> str:
    """A factor equal to the broadcast/reduction size usually means mean and sum mixed up."""
    r, rem = divmod(max(n_out, n_in), min(n_out, n_in))
    if rem or r == 1 or k < 0:
        return ""
    if abs(k - 1 / r) <= 1e-9 and n_out > n_in:
        return f" (= {r}, the broadcast size: mean instead of sum over the broadcast dims?)"
    if abs(k - r) <= 1e-9 * r and n_out < n_in:
        return f" (= {r}, the reduction size: a sum's gradient for a mean, missing 1/{r}?)"
    return ""


# --- first-order detectors, tried in order; each returns a message or None ----------------------

_NONFINITE = (("numerical", "the forward is not finite near these inputs (outside its domain?)"),
              ("analytical", "backward produces NaN/inf (division by zero, log or sqrt of 0?)"))
_DD_NONFINITE = (("numerical second derivative", "backward is not finite near these inputs"),
                 ("second derivative", "backward's formula is not differentiable there (sqrt, "
                  "log or division at 0 inside backward?)"))


def _nonfinite(b: _Block, texts: tuple[tuple[str, str], ...] = _NONFINITE) -> Diagnosis | None:
    # Numerical first: when the forward itself is not finite, backward cannot be judged.
    for arr, side, (what, why) in zip((b.n, b.a), ("numerical", "analytical"), texts):
        bad = ~np.isfinite(arr)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            return Diagnosis("nonfinite", f"{what} is NaN/inf at {int(bad.sum())} of {b.a.size} "
                             f"elements, first {b.label(r, c)}: {why}",
                             {"side": side, "count": int(bad.sum()), "elements": int(b.a.size),
                              "first": b.label(r, c)})
    return None


def _missing(b: _Block) -> Diagnosis | None:
    if not np.all(np.abs(b.a) <= b.atol) or not (b.mis & b.sig).any():
        return None
    return Diagnosis("zero", f"analytical is zero for all {b.a.size} elements while numerical is not "
            f"({b.nonzero()}, max |numerical| {_num(np.abs(b.n).max())}): gradient missing, "
            f"backward returns zero or None for '{b.name}'",
                     {"nonzero": int(b.sig.sum()), "elements": int(b.a.size)})


def _swapped(b: _Block) -> Diagnosis | None:
    for other, block in b.others.items():
        block = np.asarray(block, dtype=np.float64)
        if other == b.name or block.shape != b.a.shape:
            continue
        theirs = b.others_analytical.get(other)
        # Too few nonzero elements to rest on one block (a scalar's): both ways round must fit.
        both = theirs is not None and np.shape(theirs) == b.n.shape and bool(
            np.all(_close(b.a, block, b.atol, b.rtol))) and bool(np.all(_close(
                np.asarray(theirs, dtype=np.float64), b.n, b.atol, b.rtol)))
        if b.matches(block) or both:
            return Diagnosis("swapped", f"analytical matches the numerical gradient of input "
                             f"'{other}' at all {b.a.size} elements: looks like the gradient of "
                             f"input '{other}': gradients swapped?", {"other_input": other})
    return None


def _factor(b: _Block, subject: str = "analytical", second_order: bool = False
            ) -> Diagnosis | None:
    k = _fit_factor(b.a, b.n, b.atol, b.rtol)
    if k is None:
        return None
    tail = " in the derivative of backward" if second_order else _size_hint(k, *b.a.shape)
    return Diagnosis(_factor_kind(k), f"{subject} = {_factor_text(k)} × numerical for every "
                     f"element ({b.nonzero()}): {_factor_phrase(k)}{tail}",
                     {"factor": float(k), "nonzero": int(b.sig.sum())})


def _factor_kind(k: float) -> str:
    """A factor of exactly -1 is a flipped sign; any other constant is a factor."""
    return "sign" if abs(k + 1) <= 1e-12 else "factor"


def _ignores_grad_output(b: _Block) -> Diagnosis | None:
    # Row k is the VJP with one-hot e_k; rows that never change mean grad_output is not used.
    if b.a.shape[0] < 2 or not (np.abs(b.a) > b.atol).any():
        return None
    same = [np.all(_close(m, m[:1], b.atol, b.rtol)) for m in (b.a, b.n)]
    if not same[0] or same[1]:
        return None
    return Diagnosis("ignores_grad_output", f"analytical is the same for all {b.a.shape[0]} "
                     "output elements while numerical is not: backward ignores grad_output (or "
                     "uses only its sum); multiply by grad_output", {"outputs": int(b.a.shape[0])})


def _constant_added(b: _Block) -> Diagnosis | None:
    # Each row is a VJP with one-hot e_k: the same offset in every row, whatever k, is a constant
    # term in backward (it shows even when grad_output is zero).
    if b.a.shape[0] < 2:
        return None
    d = b.a - b.n
    cols = b.mis.any(axis=0)
    offset = d[0]
    if not cols.any() or not np.all(_close(d, np.broadcast_to(offset, d.shape), b.atol, 0.0)):
        return None
    if not np.all(np.abs(offset[cols]) > b.atol) or np.any(np.abs(offset[~cols]) > b.atol):
        return None
    values = offset[cols]
    same = np.allclose(values, values[0], atol=b.atol, rtol=b.rtol)
    amount = _num(float(values[0])) if same else f"up to {_num(float(np.abs(values).max()))}"
    return Diagnosis("constant_term", f"backward adds {amount} to {int(cols.sum())} of "
                     f"{b.a.shape[1]} elements of the gradient of '{b.name}' whatever "
                     "grad_output is: a constant term (a gradient is linear in grad_output)",
                     {"amount": float(values[0]) if same else float(np.abs(values).max()),
                      "same": bool(same), "count": int(cols.sum()),
                      "elements": int(b.a.shape[1])})


def _branch(b: _Block) -> Diagnosis | None:
    if b.x is None or np.size(b.x) != b.a.shape[1]:
        return None
    x = np.asarray(b.x, dtype=np.float64).ravel()
    bad_cols = b.mis.any(axis=0)
    for sign, side in (("< 0", x < 0), ("> 0", x > 0)):
        rest, k = ~side, int(side.sum())
        if (not np.array_equal(bad_cols, side) or min(k, x.size - k) < _MIN_SIDE
                or comb(x.size, k) < _MIN_SPLITS or not b.sig[:, rest].any()):
            continue
        f = _fit_factor(b.a[:, side], b.n[:, side], b.atol, b.rtol)
        there = f"; there analytical = {_num(f)} × numerical" if f is not None else ""
        return Diagnosis("branch", f"a branch: wrong only where input '{b.name}' {sign} (all "
                         f"{k} such elements differ, the other {int(rest.sum())} agree{there}): "
                         f"check backward's '{b.name}' {sign} case",
                         {"where": sign, "count": k, "agree": int(rest.sum()),
                          "factor": None if f is None else float(f)})
    return None


def _few(b: _Block) -> Diagnosis | None:
    nm = int(b.mis.sum())
    # "The rest agree" must mean something: at least as many right nonzero elements as wrong ones.
    if nm > max(3, 0.05 * b.a.size) or int((b.sig & ~b.mis).sum()) < nm:
        return None
    rows, cols = np.nonzero(b.mis)
    return Diagnosis("few_elements", f"{nm} of {b.a.size} elements wrong, the rest agree: "
                     f"{_listing(b, b.mis)}",
                     {"count": nm, "elements": int(b.a.size),
                      "wrong": [b.label(r, c) for r, c in zip(rows, cols)]})


def _diagonal_only(b: _Block) -> Diagnosis | None:
    n_out, n_in = b.a.shape
    if n_out != n_in or n_in < 2:
        return None
    off = ~np.eye(n_in, dtype=bool)
    diag_ok = np.all(_close(np.diag(b.a), np.diag(b.n), b.atol, b.rtol))
    missed = b.sig & off
    if not diag_ok or not missed.any() or not np.all(np.abs(b.a[off]) <= b.atol):
        return None
    r, c = np.argwhere(missed)[0]
    return Diagnosis("diagonal_only", f"analytical is diagonal and right on the diagonal, but "
                     f"numerical has {int(missed.sum())} nonzero off-diagonal elements (e.g. "
                     f"{b.label(r, c)} numerical {_num(b.n[r, c])}): backward uses an "
                     "elementwise formula for an op that is not elementwise",
                     {"off_diagonal": int(missed.sum()), "first": b.label(r, c)})


def _broadcast_not_reduced(b: _Block) -> Diagnosis | None:
    n_out, n_in = b.a.shape
    if n_out <= n_in:
        return None
    row_ok = ~b.mis.any(axis=1)
    row_zero = np.all(np.abs(b.a) <= b.atol, axis=1)
    used, dropped = row_ok & b.sig.any(axis=1), ~row_ok
    # Every input element must still get some of its gradient; one that gets none is a few
    # elements wrong, not a reduction over too few broadcast copies.
    fed = (b.sig & used[:, None]).any(axis=0) | ~b.sig.any(axis=0)
    if not np.all(row_ok | row_zero) or not used.any() or not fed.all():
        return None
    first = _index(int(np.argmax(dropped)), b.out_shape)
    return Diagnosis("broadcast_not_reduced", f"analytical matches numerical for "
                     f"{int(used.sum())} of {n_out} output elements and is zero for "
                     f"{int(dropped.sum())} where numerical is not (e.g. output {first}): "
                     "backward uses only part of grad_output; a broadcast not reduced (sum "
                     "every copy)?", {"used": int(used.sum()), "dropped": int(dropped.sum()),
                                      "outputs": int(n_out), "first": first})


def _no_pattern(b: _Block) -> Diagnosis:
    diff = np.where(b.mis, np.nan_to_num(np.abs(b.a - b.n), nan=np.inf), -1.0)
    r, c = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return Diagnosis("no_pattern", f"no simple pattern: {int(b.mis.sum())} of {b.a.size} "
                     f"elements differ; worst at {b.label(r, c)}: analytical {_num(b.a[r, c])}, "
                     f"numerical {_num(b.n[r, c])}",
                     {"count": int(b.mis.sum()), "elements": int(b.a.size),
                      "worst": b.label(r, c)})


def _named(kind: str, detect: Callable[[_Block], str | None]
           ) -> Callable[[_Block], Diagnosis | None]:
    """A detector of structure.py (a sentence or None) as one giving a Diagnosis of `kind`."""
    return lambda b: _found(kind, detect(b))


# Whole-block structural fits first (they rest on every element); then sign splits and short
# lists, which rest on fewer; factor and few are exclusive anyway (a factor leaves no agreeing
# nonzero element, "few" needs as many of those as wrong ones). Diagonal-only comes last: with a
# handful of missed off-diagonal elements the list of those elements says more.
_FIRST_ORDER: tuple[Callable[[_Block], Diagnosis | None], ...] = (
    _nonfinite, _swapped, _missing, _factor, _named("transposed", transposed),
    _named("shifted", shifted), _ignores_grad_output, _constant_added, _broadcast_not_reduced,
    _branch, _few, _diagonal_only,
)
# Every kind a first-order diagnosis can name (the registry declares one rule per kind).
FIRST_ORDER_KINDS = ("nonfinite", "swapped", "zero", "factor", "sign", "transposed", "shifted",
                     "ignores_grad_output", "constant_term", "broadcast_not_reduced", "branch",
                     "few_elements", "diagonal_only", "no_pattern")


def _first_found(b: _Block, detectors: Sequence[Callable[[_Block], Diagnosis | None]]
                 ) -> Diagnosis | None:
    """None when the block agrees, else the first detector's Diagnosis, else no pattern's."""
    if not b.mis.any():
        return None
    for detect in detectors:
        found = detect(b)
        if found:
            return found
    return _no_pattern(b)


def diagnose_block(analytical: np.ndarray, numerical: np.ndarray, *, input_name: str,
                   input_shape: tuple[int, ...], output_shape: tuple[int, ...],
                   input_values: np.ndarray | None = None, atol: float = 1e-5, rtol: float = 1e-3,
                   other_inputs: Mapping[str, np.ndarray] | None = None,
                   other_analytical: Mapping[str, np.ndarray] | None = None) -> str | None:
    """One-line cause of a first-order mismatch in an (n_out, n_in) block, or None if it agrees:
    classify_block's text."""
    return _text(classify_block(analytical, numerical, input_name=input_name,
                                input_shape=input_shape, output_shape=output_shape,
                                input_values=input_values, atol=atol, rtol=rtol,
                                other_inputs=other_inputs, other_analytical=other_analytical))


def classify_block(analytical: np.ndarray, numerical: np.ndarray, *, input_name: str,
                   input_shape: tuple[int, ...], output_shape: tuple[int, ...],
                   input_values: np.ndarray | None = None, atol: float = 1e-5, rtol: float = 1e-3,
                   other_inputs: Mapping[str, np.ndarray] | None = None,
                   other_analytical: Mapping[str, np.ndarray] | None = None) -> Diagnosis | None:
    """The Diagnosis of a first-order mismatch in an (n_out, n_in) block, or None if it agrees.

    Rows are flattened output elements (row k = VJP with one-hot e_k), columns flattened input
    elements. Its kind is "no_pattern" when no pattern fits every element.
    """
    b = _make_block(analytical, numerical, input_shape, output_shape, atol=atol, rtol=rtol,
                    name=input_name, x=input_values, others=dict(other_inputs or {}),
                    others_analytical=dict(other_analytical or {}))
    return _first_found(b, _FIRST_ORDER)


def _text(found: Diagnosis | None) -> str | None:
    return None if found is None else found.text


def constant_term(zero_grad: np.ndarray | None, name: str, atol: float) -> Diagnosis | None:
    """What backward returns for an all-zero grad_output: nonzero is a constant term."""
    if zero_grad is None:
        return None
    z = np.asarray(zero_grad, dtype=np.float64).ravel()
    bad = ~(np.abs(z) <= atol)
    if not bad.any():
        return None
    k = int(np.argmax(np.abs(np.nan_to_num(z, nan=np.inf))))
    return Diagnosis("constant_term", f"backward returns a nonzero gradient for '{name}' (up to "
                     f"{_num(float(z[k]))} at {int(bad.sum())} of {z.size} elements) when "
                     "grad_output is all zero: a constant term (a gradient is linear in "
                     "grad_output)", {"amount": float(z[k]), "same": False,
                                      "count": int(bad.sum()), "elements": int(z.size)})


def diagnose_probe(analytical: Sequence[float] | np.ndarray,
                   numerical: Sequence[float] | np.ndarray, *, atol: float = 1e-5,
                   rtol: float = 1e-3, unit: str = "probes") -> str | None:
    """classify_probe's text."""
    return _text(classify_probe(analytical, numerical, atol=atol, rtol=rtol, unit=unit))


def classify_probe(analytical: Sequence[float] | np.ndarray,
                   numerical: Sequence[float] | np.ndarray, *, atol: float = 1e-5,
                   rtol: float = 1e-3, unit: str = "probes") -> Diagnosis | None:
    """The Diagnosis from probe values v_p^T J u_p (analytical[p] vs numerical[p]), or None.

    Only what a few numbers can show: NaN/inf, a zero gradient, or one ratio shared by every probe
    (two nonzero at least). None otherwise: localise the block and call diagnose_block. `unit`
    names what the values are when they are not probes (a sample of elements, say).
    """
    a = np.asarray(analytical, dtype=np.float64).ravel()
    n = np.asarray(numerical, dtype=np.float64).ravel()
    if a.shape != n.shape:
        raise ValueError(f"{a.size} analytical probe values but {n.size} numerical ones")
    if np.all(_close(a, n, atol, rtol)):
        return None
    bad = ~(np.isfinite(a) & np.isfinite(n))
    if bad.any():
        i = int(np.argmax(bad))
        return Diagnosis("nonfinite", f"NaN/inf on {int(bad.sum())} of {a.size} {unit}, first "
                         f"at {i}: analytical {_num(a[i])}, numerical {_num(n[i])}",
                         {"count": int(bad.sum()), "elements": int(a.size), "first": i})
    if np.all(np.abs(a) <= atol) and (np.abs(n) > atol).any():
        return Diagnosis("zero", f"analytical is zero on all {a.size} {unit} while numerical is "
                         "not: gradient missing", {"elements": int(a.size)})
    k = _fit_factor(a, n, atol, rtol)
    if k is None:
        return None
    return Diagnosis(_factor_kind(k), f"analytical = {_num(k)} × numerical on all {a.size} "
                     f"{unit}: {_factor_phrase(k)}", {"factor": float(k), "elements": int(a.size)})


# --- second order -------------------------------------------------------------------------------

_UNTRACKED = ("backward likely uses a tensor saved on ctx that is neither an input nor an output, "
              "or detaches / uses no_grad")


def _dd_zero(b: _Block) -> Diagnosis | None:
    if not (b.mis & b.sig).any() or not np.all(np.abs(b.a[b.mis]) <= b.atol):
        return None
    if np.all(np.abs(b.a) <= b.atol):
        return Diagnosis("untracked", f"second derivative is zero for all {b.a.size} elements "
                         f"while numerical is not ({b.nonzero()}): {_UNTRACKED}",
                         {"count": int(b.a.size), "elements": int(b.a.size)})
    if not (b.sig & ~b.mis).any():  # nothing right: no evidence of a *partial* loss
        return None
    return Diagnosis("untracked", f"second derivative is zero at {int(b.mis.sum())} of "
                     f"{b.a.size} elements where numerical is not, the rest agree: part of "
                     f"backward is not tracked; {_UNTRACKED}",
                     {"count": int(b.mis.sum()), "elements": int(b.a.size)})


_SECOND_ORDER: tuple[Callable[[_Block], Diagnosis | None], ...] = (
    lambda b: _nonfinite(b, _DD_NONFINITE), _dd_zero, _few,
    lambda b: _factor(b, "second derivative", second_order=True),
)


def diagnose_double_backward(analytical: np.ndarray, numerical: np.ndarray, *, atol: float = 1e-5,
                             rtol: float = 1e-3) -> str | None:
    """classify_double_backward's text."""
    return _text(classify_double_backward(analytical, numerical, atol=atol, rtol=rtol))


# Every kind a second-order diagnosis can name.
SECOND_ORDER_KINDS = ("nonfinite", "untracked", "few_elements", "factor", "sign", "no_pattern")


def classify_double_backward(analytical: np.ndarray, numerical: np.ndarray, *,
                             atol: float = 1e-5, rtol: float = 1e-3) -> Diagnosis | None:
    """One-line cause of a mismatch in a second-order block (the Jacobian of backward), or None."""
    return _first_found(_make_block(analytical, numerical, None, None, atol=atol, rtol=rtol),
                        _SECOND_ORDER)
