"""Turn a Jacobian mismatch into a Diagnosis: the kind of mistake (a rule's name), its data and
the one-line cause in the user's terms."""

from __future__ import annotations

from math import comb
from typing import Callable, Mapping, Sequence

import numpy as np

from .block import (Block, Diagnosis, close, factor_phrase, factor_text, fit_factor, found,
                    index_text, listing, make_block, num, size_hint)
from .structure import shifted, straight_through, transposed

# Deliberately numpy only: the renderer and the CLI import this without paying for torch.

_MIN_SIDE = 3  # input elements needed on each side of a sign split
_MIN_SPLITS = 100  # same-size column sets a sign split must be one of: chance match under 1%


# --- first-order detectors, tried in order; each returns a message or None ----------------------

_NONFINITE = (("numerical", "the forward is not finite near these inputs (outside its domain?)"),
              ("analytical", "backward produces NaN/inf (division by zero, log or sqrt of 0?)"))
_DD_NONFINITE = (("numerical second derivative", "backward is not finite near these inputs"),
                 ("second derivative", "backward's formula is not differentiable there (sqrt, "
                  "log or division at 0 inside backward?)"))


def _nonfinite(b: Block, texts: tuple[tuple[str, str], ...] = _NONFINITE) -> Diagnosis | None:
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


def _missing(b: Block) -> Diagnosis | None:
    if not np.all(np.abs(b.a) <= b.atol) or not (b.mis & b.sig).any():
        return None
    return Diagnosis("zero", f"analytical is zero for all {b.a.size} elements while numerical is not "
            f"({b.nonzero()}, max |numerical| {num(np.abs(b.n).max())}): gradient missing, "
            f"backward returns zero or None for '{b.name}'",
                     {"nonzero": int(b.sig.sum()), "elements": int(b.a.size)})


def _swapped(b: Block) -> Diagnosis | None:
    for other, block in b.others.items():
        block = np.asarray(block, dtype=np.float64)
        if other == b.name or block.shape != b.a.shape:
            continue
        theirs = b.others_analytical.get(other)
        # Too few nonzero elements to rest on one block (a scalar's): both ways round must fit.
        both = theirs is not None and np.shape(theirs) == b.n.shape and bool(
            np.all(close(b.a, block, b.atol, b.rtol))) and bool(np.all(close(
                np.asarray(theirs, dtype=np.float64), b.n, b.atol, b.rtol)))
        if b.matches(block) or both:
            return Diagnosis("swapped", f"analytical matches the numerical gradient of input "
                             f"'{other}' at all {b.a.size} elements: looks like the gradient of "
                             f"input '{other}': gradients swapped?", {"other_input": other})
    return None


def _factor(b: Block, subject: str = "analytical", second_order: bool = False
            ) -> Diagnosis | None:
    k = fit_factor(b.a, b.n, b.atol, b.rtol)
    if k is None:
        return None
    tail = " in the derivative of backward" if second_order else size_hint(k, b.n, b.atol)
    return Diagnosis(_factor_kind(k), f"{subject} = {factor_text(k)} × numerical for every "
                     f"element ({b.nonzero()}): {factor_phrase(k)}{tail}",
                     {"factor": float(k), "nonzero": int(b.sig.sum())})


def _factor_kind(k: float) -> str:
    """A factor of exactly -1 is a flipped sign; any other constant is a factor."""
    return "sign" if abs(k + 1) <= 1e-12 else "factor"


def _ignores_grad_output(b: Block) -> Diagnosis | None:
    # Row k is the VJP with one-hot e_k; rows that never change mean grad_output is not used.
    if b.a.shape[0] < 2 or not (np.abs(b.a) > b.atol).any():
        return None
    same = [np.all(close(m, m[:1], b.atol, b.rtol)) for m in (b.a, b.n)]
    if not same[0] or same[1]:
        return None
    return Diagnosis("ignores_grad_output", f"analytical is the same for all {b.a.shape[0]} "
                     "output elements while numerical is not: backward ignores grad_output (or "
                     "uses only its sum); multiply by grad_output", {"outputs": int(b.a.shape[0])})


def _constant_added(b: Block) -> Diagnosis | None:
    # Each row is a VJP with one-hot e_k: the same offset in every row, whatever k, is a constant
    # term in backward (it shows even when grad_output is zero).
    if b.a.shape[0] < 2:
        return None
    d = b.a - b.n
    cols = b.mis.any(axis=0)
    offset = d[0]
    if not cols.any() or not np.all(close(d, np.broadcast_to(offset, d.shape), b.atol, 0.0)):
        return None
    if not np.all(np.abs(offset[cols]) > b.atol) or np.any(np.abs(offset[~cols]) > b.atol):
        return None
    values = offset[cols]
    same = np.allclose(values, values[0], atol=b.atol, rtol=b.rtol)
    amount = num(float(values[0])) if same else f"up to {num(float(np.abs(values).max()))}"
    return Diagnosis("constant_term", f"backward adds {amount} to {int(cols.sum())} of "
                     f"{b.a.shape[1]} elements of the gradient of '{b.name}' whatever "
                     "grad_output is: a constant term (a gradient is linear in grad_output)",
                     {"amount": float(values[0]) if same else float(np.abs(values).max()),
                      "same": bool(same), "count": int(cols.sum()),
                      "elements": int(b.a.shape[1])})


def _branch(b: Block) -> Diagnosis | None:
    if b.x is None or np.size(b.x) != b.a.shape[1]:
        return None
    x = np.asarray(b.x, dtype=np.float64).ravel()
    bad_cols = b.mis.any(axis=0)
    for sign, side in (("< 0", x < 0), ("> 0", x > 0)):
        rest, k = ~side, int(side.sum())
        if (not np.array_equal(bad_cols, side) or min(k, x.size - k) < _MIN_SIDE
                or comb(x.size, k) < _MIN_SPLITS or not b.sig[:, rest].any()):
            continue
        f = fit_factor(b.a[:, side], b.n[:, side], b.atol, b.rtol)
        there = f"; there analytical = {num(f)} × numerical" if f is not None else ""
        return Diagnosis("branch", f"a branch: wrong only where input '{b.name}' {sign} (all "
                         f"{k} such elements differ, the other {int(rest.sum())} agree{there}): "
                         f"check backward's '{b.name}' {sign} case",
                         {"where": sign, "count": k, "agree": int(rest.sum()),
                          "factor": None if f is None else float(f)})
    return None


def _few(b: Block) -> Diagnosis | None:
    nm = int(b.mis.sum())
    # "The rest agree" must mean something: at least as many right nonzero elements as wrong ones.
    if nm > max(3, 0.05 * b.a.size) or int((b.sig & ~b.mis).sum()) < nm:
        return None
    rows, cols = np.nonzero(b.mis)
    return Diagnosis("few_elements", f"{nm} of {b.a.size} elements wrong, the rest agree: "
                     f"{listing(b, b.mis)}",
                     {"count": nm, "elements": int(b.a.size),
                      "wrong": [b.label(r, c) for r, c in zip(rows, cols)]})


_MAX_EXCHANGED = 64  # wrong input elements the exchange test pairs (a quadratic search)


def _exchanged(b: Block) -> Diagnosis | None:
    # The wrong input elements' gradients are one another's (each wrong column of analytical is
    # another wrong column of numerical): an index mix-up in backward, two elements swapped.
    cols = np.flatnonzero(b.mis.any(axis=0))
    if not 2 <= len(cols) <= _MAX_EXCHANGED or not (b.sig & ~b.mis).any():
        return None
    pairs = []
    for c in cols:
        match = [d for d in cols if d != c and b.sig[:, d].any()
                 and np.all(close(b.a[:, c], b.n[:, d], b.atol, b.rtol))]
        if not match:
            return None
        pairs.append((c, match[0]))
    names = [f"{_input_text(b, c)} <-> {_input_text(b, d)}" for c, d in pairs if c < d]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return Diagnosis("exchanged", f"the gradients of {len(cols)} input elements of '{b.name}' "
                     f"are one another's ({shown}), the rest agree: an index mix-up in "
                     "backward", {"elements": len(cols), "pairs": names})


def _input_text(b: Block, col: int) -> str:
    return index_text(int(col), b.in_shape) if b.places is None else \
        "(" + ",".join(str(int(i)) for i in b.places[col]) + ")"


def _part_factor(b: Block) -> Diagnosis | None:
    # More than a few wrong, all by one factor, the rest right (sparsemax's row 0 x1.001): a
    # factor on part of the gradient; where it sits is said when it fills whole input columns
    # or output rows (one input element's gradient, one output's).
    agree, nm = int((b.sig & ~b.mis).sum()), int(b.mis.sum())
    # "the rest agree" must mean something, as in _few: as many right nonzero elements as wrong
    k = fit_factor(b.a[b.mis], b.n[b.mis], b.atol, b.rtol) if agree >= nm else None
    if k is None:
        return None
    return Diagnosis("part_factor", f"analytical = {factor_text(k)} × numerical at all {nm} "
                     f"wrong elements, the other {agree} nonzero agree: "
                     f"{factor_phrase(k).removeprefix('every element ')} "
                     f"{_part_where(b)}", {"factor": float(k), "count": nm, "agree": agree})


def _part_where(b: Block) -> str:
    """'in the gradient of input element(s) ...' / 'for output element(s) ...' where the wrong
    elements fill whole columns / rows (every nonzero one there wrong), else 'in part'."""
    right = b.sig & ~b.mis
    columns, rows = b.mis.any(axis=0), b.mis.any(axis=1)
    sides = [(rows, right[rows].any(), b.out_shape, "for output element(s)")]
    if b.places is None:  # placed inputs (a sparse tensor's values): no index of the shape
        sides.insert(0, (columns, right[:, columns].any(), b.in_shape,
                         "in the gradient of input element(s)"))
    for hit, mixed, shape, what in sides:
        if not mixed and hit.sum() < hit.size:
            picked = np.flatnonzero(hit)
            shown = ", ".join(index_text(int(i), shape) for i in picked[:4])
            more = f" and {len(picked) - 4} more" if len(picked) > 4 else ""
            return f"{what} {shown}{more} ({len(picked)} of {hit.size}), the others right"
    return "on part of the gradient"


def _diagonal_only(b: Block) -> Diagnosis | None:
    n_out, n_in = b.a.shape
    if n_out != n_in or n_in < 2:
        return None
    off = ~np.eye(n_in, dtype=bool)
    diag_ok = np.all(close(np.diag(b.a), np.diag(b.n), b.atol, b.rtol))
    missed = b.sig & off
    if not diag_ok or not missed.any() or not np.all(np.abs(b.a[off]) <= b.atol):
        return None
    r, c = np.argwhere(missed)[0]
    return Diagnosis("diagonal_only", f"analytical is diagonal and right on the diagonal, but "
                     f"numerical has {int(missed.sum())} nonzero off-diagonal elements (e.g. "
                     f"{b.label(r, c)} numerical {num(b.n[r, c])}): backward uses an "
                     "elementwise formula for an op that is not elementwise",
                     {"off_diagonal": int(missed.sum()), "first": b.label(r, c)})


def _broadcast_not_reduced(b: Block) -> Diagnosis | None:
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
    first = index_text(int(np.argmax(dropped)), b.out_shape)
    return Diagnosis("broadcast_not_reduced", f"analytical matches numerical for "
                     f"{int(used.sum())} of {n_out} output elements and is zero for "
                     f"{int(dropped.sum())} where numerical is not (e.g. output {first}): "
                     "backward uses only part of grad_output; a broadcast not reduced (sum "
                     "every copy)?", {"used": int(used.sum()), "dropped": int(dropped.sum()),
                                      "outputs": int(n_out), "first": first})


def _no_pattern(b: Block) -> Diagnosis:
    diff = np.where(b.mis, np.nan_to_num(np.abs(b.a - b.n), nan=np.inf), -1.0)
    r, c = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return Diagnosis("no_pattern", f"no simple pattern: {int(b.mis.sum())} of {b.a.size} "
                     f"elements differ; worst at {b.label(r, c)}: analytical {num(b.a[r, c])}, "
                     f"numerical {num(b.n[r, c])}",
                     {"count": int(b.mis.sum()), "elements": int(b.a.size),
                      "worst": b.label(r, c)})


def _named(kind: str, detect: Callable[[Block], str | None]
           ) -> Callable[[Block], Diagnosis | None]:
    """A detector of structure.py (a sentence or None) as one giving a Diagnosis of `kind`."""
    return lambda b: found(kind, detect(b))


# Whole-block structural fits first (they rest on every element); then sign splits and short
# lists, which rest on fewer; factor and few are exclusive anyway (a factor leaves no agreeing
# nonzero element, "few" needs as many of those as wrong ones). Diagonal-only comes last: with a
# handful of missed off-diagonal elements the list of those elements says more.
_FIRST_ORDER: tuple[Callable[[Block], Diagnosis | None], ...] = (
    _nonfinite, _swapped, _missing, _factor, _named("transposed", transposed),
    _named("shifted", shifted), _ignores_grad_output, _constant_added, _broadcast_not_reduced,
    _named("straight_through", straight_through), _branch, _exchanged, _few, _part_factor,
    _diagonal_only,
)
# Every kind a first-order diagnosis can name (the registry declares one rule per kind).
FIRST_ORDER_KINDS = ("nonfinite", "swapped", "zero", "factor", "sign", "transposed", "shifted",
                     "ignores_grad_output", "constant_term", "broadcast_not_reduced",
                     "straight_through", "branch",
                     "exchanged", "few_elements", "part_factor", "diagonal_only", "no_pattern")


def _first_found(b: Block, detectors: Sequence[Callable[[Block], Diagnosis | None]]
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
                   other_analytical: Mapping[str, np.ndarray] | None = None,
                   mismatched: np.ndarray | None = None,
                   input_places: Sequence[Sequence[int]] | None = None) -> Diagnosis | None:
    """The Diagnosis of a first-order mismatch in an (n_out, n_in) block, or None if it agrees.

    Rows are flattened output elements (row k = VJP with one-hot e_k), columns flattened input
    elements. Its kind is "no_pattern" when no pattern fits every element. `mismatched`: which
    elements the verdict judged wrong (else |a - n| > atol + rtol |n|). `input_places`: where
    each column sits in a masked sparse input (its elements named there).
    """
    b = make_block(analytical, numerical, input_shape, output_shape, atol=atol, rtol=rtol,
                    name=input_name, x=input_values, others=dict(other_inputs or {}),
                    others_analytical=dict(other_analytical or {}), judged=mismatched,
                    places=input_places)
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
                     f"{num(float(z[k]))} at {int(bad.sum())} of {z.size} elements) when "
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
    if np.all(close(a, n, atol, rtol)):
        return None
    bad = ~(np.isfinite(a) & np.isfinite(n))
    if bad.any():
        i = int(np.argmax(bad))
        return Diagnosis("nonfinite", f"NaN/inf on {int(bad.sum())} of {a.size} {unit}, first "
                         f"at {i}: analytical {num(a[i])}, numerical {num(n[i])}",
                         {"count": int(bad.sum()), "elements": int(a.size), "first": i})
    if np.all(np.abs(a) <= atol) and (np.abs(n) > atol).any():
        return Diagnosis("zero", f"analytical is zero on all {a.size} {unit} while numerical is "
                         "not: gradient missing", {"elements": int(a.size)})
    k = fit_factor(a, n, atol, rtol)
    if k is None:
        return None
    return Diagnosis(_factor_kind(k), f"analytical = {num(k)} × numerical on all {a.size} "
                     f"{unit}: {factor_phrase(k)}", {"factor": float(k), "elements": int(a.size)})


# --- second order -------------------------------------------------------------------------------

_UNTRACKED = ("backward likely uses a tensor saved on ctx that is neither an input nor an output, "
              "or detaches / uses no_grad")


def _dd_zero(b: Block) -> Diagnosis | None:
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


_SECOND_ORDER: tuple[Callable[[Block], Diagnosis | None], ...] = (
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
                             atol: float = 1e-5, rtol: float = 1e-3,
                             shapes: tuple[Sequence[int], Sequence[int]] = ((), ())
                             ) -> Diagnosis | None:
    """One-line cause of a mismatch in a second-order block (the Jacobian of backward), or None;
    elements named in the (input, output) shapes given where they fit the block (as the
    report's element lines name them; a block compared in part keeps flat indices)."""
    fit = [tuple(s) if s and int(np.prod(s)) == n else None
           for s, n in zip(shapes, (analytical.shape[1], analytical.shape[0]))]
    return _first_found(make_block(analytical, numerical, *fit, atol=atol, rtol=rtol),
                        _SECOND_ORDER)
