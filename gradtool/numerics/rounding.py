"""Per-element rounding bounds: a float64 run with every operation's rounding simulated."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .kernels import Measured, kernel_error, on_values

# Unit roundoff u = 2^-p of each floating dtype (p significand bits, round to nearest).
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
                 "bfloat16": 2.0 ** -8}
# Absolute rounding error below the normal range: half the spacing of the subnormals, so
# fl(x) = x (1 + d) + e with |d| <= u, |e| <= eta (float16's subnormals start at 6e-5).
ETA = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "float16": 2.0 ** -25,
       "bfloat16": 2.0 ** -134}
# Finest first: the precisions offered when a dtype cannot resolve a difference.
FINEST_FIRST = ("float64", "float32", "float16", "bfloat16")
# grad_output scaled by this (exact in bfloat16 and up): backward's results scale with it
# exactly but for rounding, so the difference measures the rounding of every element (the
# contract's low-precision tests and the low-precision check's zero-reference gradients).
FOLLOW_SCALE = 1 + 2.0 ** -7

# Reductions whose accumulation error scales with the sum of |terms|, not with |result|:
# the same operation on absolute values gives that sum (they are multilinear in their inputs).
_SUMS = ("sum", "mean", "cumsum", "_softmax", "_log_softmax", "linalg_vector_norm")
# Products summed in sequence (GEMM, convolution): the error grows further with sqrt(k), k the
# number of terms, estimated per element as (sum |t|)^2 / sum t^2 from the op on squares.
_PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "convolution",
             "einsum", "matmul", "tensordot")

# A reference whose algorithm is not the kernel's (a chunked or fused kernel checked against a
# plain one): rounding simulated on the reference cannot bound the kernel's own, so each
# tensor's bound also allows this many times the largest error of the reference itself run in
# the low dtype (the kernel libraries' rule, theirs 2x to 5x). Measured on a chunked scan, a
# tiled matmul and a fused attention (10 seeds, every dtype): at most 5.7.
REFERENCE_FACTOR = 10.0
# Samples of simulated rounding: a first round, doubled up to MAX_SAMPLES while any element
# lies beyond its bound (a spread from few samples is sometimes underestimated by chance).
SAMPLES = 3
MAX_SAMPLES = 12
# Tolerance = SAFETY x the root-mean-square simulated deviation. Measured on correct GELU and
# matmul kernels in every dtype (30 seeds x 8192 elements, 12 samples): the real error never
# exceeded 2.9 RMS beyond one rounding of the result; 6 leaves a factor 2.
SAFETY = 6.0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def unit_roundoff(dtype: str) -> float:
    return UNIT_ROUNDOFF[dtype]


def accumulation_roundoff(dtype: str) -> float:
    """torch accumulates float16/bfloat16 sums and products in float32 (its 'opmath' type)."""
    return UNIT_ROUNDOFF["float32"] if dtype in ("float16", "bfloat16") else UNIT_ROUNDOFF[dtype]


# A low-precision backward compared with a combination of its own results (the contract's
# linearity and determinism tests): see combination_bound. Measured on torch's linear, bmm,
# conv2d, attention, cumsum, layer_norm, ... backwards (20 seeds each, and at k up to 32768),
# the largest difference was 3.4 of these units in float16 and bfloat16, 16 in float32 where
# 8 (1 + sqrt k) allow 1400; a backward that squares or clamps grad_output is off by a large
# fraction of its values.
COMBINATION_SLACK = 8.0
NOISE_UNITS = 8.0  # a tensor this close to rounding of its backward's scale cancels whole


def combination_bound(terms: Sequence[tuple[float, torch.Tensor]], dtype: str, summed: int,
                      rounded_input: bool = True, shared: float = 0.0) -> torch.Tensor:
    """Per element: how far sum c·t over low-precision results t may be from zero by rounding
    alone, where the exact results would cancel (2·B(g1) + 3·B(g2) - B(2·g1 + 3·g2) = 0).

    Each result is rounded once (u|c t| per term). Each element sums at most `summed` terms
    (every grad_output element) in the accumulation dtype, whose error grows as sqrt(summed)
    u_acc (float32's own sums; float16/bfloat16 accumulate in float32), at the scale of the
    terms, not of the element's result where they cancel: a floor from the tensor's
    root-mean-square scale, as the kernel libraries' tests floor theirs with the output's.
    `rounded_input`: the grad_output was rounded too (2·g1 + 3·g2 in the low dtype), an error
    the backward's sums carry to every element at that same scale, u of the floor. `shared`:
    the scale of the other gradients of the same backward, the floor of a tensor that cancels
    whole (a convolution's bias before batch norm: every element rounding noise of its terms'
    size), told by a scale of its own within NOISE_UNITS of rounding of `shared` (a linear
    layer's bias under a layer norm's mean reached 6); a small but real gradient keeps its own
    floor. Such a tensor's terms may also be summed in another order each call (atomic adds),
    in the dtype itself: u of the floor then, whatever the grad_outputs."""
    scale = sum(abs(c) * t.detach().double().abs() for c, t in terms)
    floor = rms(scale) if scale.numel() else scale.new_zeros(())
    u, u_sums = unit_roundoff(dtype), math.sqrt(summed) * accumulation_roundoff(dtype)
    cancels = float(floor) <= NOISE_UNITS * (u + u_sums) * shared
    if cancels:
        floor = torch.clamp(floor, min=shared)
    return COMBINATION_SLACK * (u * (scale + floor * (rounded_input or cancels))
                                + u_sums * (scale + floor)) + ETA[dtype]


def rms(t: torch.Tensor) -> torch.Tensor:
    """The root-mean-square of a tensor's values (0-d)."""
    return t.pow(2).mean().sqrt()


# What simulated rounding is made of, each re-run alone to say where a bound came from: the
# rounding of every op's result (u|result|), each op's own kernel error measured in the low
# dtype, and the accumulation error of sums and products over their terms.
SOURCES = {"result": "rounding of each op's result",
           "kernel": "each op's own kernel error, measured in the low dtype",
           "sums": "accumulation over the terms of sums and products"}


class SimulatedRounding(TorchDispatchMode):
    """Every floating result t becomes t + (u t + eta) z: a float64 run rounded like `dtype`.

    z is standard normal (seeded); every op also gets k z', k its own kernel's error in `dtype`
    on the same operands against float64; reductions and products also u_acc z'' × (the op on
    |inputs|), their accumulation error. Views and exact operations are left alone; in-place
    ones are rounded in place.
    """

    def __init__(self, dtype: str, pool: _Pool, round_operands: bool = False,
                 sources: frozenset[str] = frozenset(SOURCES)) -> None:
        super().__init__()
        self.low = getattr(torch, dtype)
        self.u = unit_roundoff(dtype) if "result" in sources else 0.0
        self.eta = ETA[dtype] if "result" in sources else 0.0
        self.u_acc = accumulation_roundoff(dtype)
        self.pool = pool
        self.round_operands = round_operands  # autocast casts a product's operands down
        self.sources = sources  # a report's attribution re-runs one source at a time

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._dynamo.disable at class creation,
        # whose first call imports torch._dynamo (~800 modules, sympy among them, 0.7 s). That
        # only matters when something compiles under the mode, which needs dynamo loaded.
        return "torch._dynamo" in sys.modules

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        kind = _kind(func)
        if kind == "product" and self.round_operands:
            args, kwargs = tree_map(self._operand, (args, kwargs))
        out = func(*args, **kwargs)
        if kind == "exact" or (kind == "sum" and _selects(func, args, kwargs)):
            return out
        if kind == "inplace":
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() \
                    and out.layout == torch.strided:
                out.copy_(_finite_only(torch.addcmul(out, out * self.u + self.eta,
                                                     self.pool.draw(out)), out))
            return out
        # Every op's own kernel error in the low dtype, reductions and products too (their
        # algorithm is not float64's: blocked sums, reduced-precision or TF32 products on a
        # GPU); a reduction also its accumulation over the sum of |terms|, where terms cancel.
        # A sparse operand (a sparse input rebuilt inside fn): its op's result is rounded, but
        # not re-run in the low dtype (sparse kernels lack most ops a measurement needs).
        strided = _strided(args, kwargs, out)
        spreads = [kernel_error(func, args, kwargs, out, self.low)
                   if "kernel" in self.sources and strided else None]
        if kind in ("sum", "product") and "sums" in self.sources and strided:
            spreads.append(_accumulated(func, args, kwargs, kind == "product"))
        if isinstance(out, torch.Tensor):
            return self._jitter(out, spreads)
        if isinstance(out, (tuple, list)):
            per_output = [[s[k] if isinstance(s, (tuple, list)) else s for s in spreads]
                          for k in range(len(out))]
            return type(out)(self._jitter(o, s) if isinstance(o, torch.Tensor) else o
                             for o, s in zip(out, per_output))
        return out

    def _operand(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() and \
                x.layout == torch.strided:
            return _finite_only(torch.addcmul(x, x * self.u + self.eta, self.pool.draw(x)), x)
        return x

    def _jitter(self, t: torch.Tensor, spreads: list[Any]) -> torch.Tensor:
        if t.is_complex() and t.numel() and not t._is_zerotensor() and \
                t.layout == torch.strided:
            return self._jitter_complex(t, spreads)
        if not t.is_floating_point() or t.numel() == 0 or t._is_zerotensor() or \
                t.layout != torch.strided:
            return t  # a storage-less zero (torch's efficient zeros) is exact; a sparse one, kept
        # t + (u t + eta) z: z is symmetric, so this is t ± (u|t| + eta) z in distribution.
        noisy = torch.addcmul(t, t * self.u + self.eta, self.pool.draw(t))
        for spread in spreads:
            if isinstance(spread, torch.Tensor) and spread.shape == t.shape:
                noisy.addcmul_(spread, self.pool.draw(t), value=self.u_acc)
            elif isinstance(spread, Measured) and spread.error.shape == t.shape:
                noisy.addcmul_(spread.error, self.pool.draw(t))
        return _finite_only(noisy, t)


    def _jitter_complex(self, t: torch.Tensor, spreads: list[Any]) -> torch.Tensor:
        """A complex result (an FFT's) rounded part by part, each part by the result's own
        kernel error and accumulation (measured on the complex magnitude of the difference)."""
        parts = torch.view_as_real(t.resolve_conj())
        per_part = [Measured(s.error.unsqueeze(-1).expand(parts.shape))
                    if isinstance(s, Measured) and s.error.shape == t.shape else
                    s.unsqueeze(-1).expand(parts.shape)
                    if isinstance(s, torch.Tensor) and s.shape == t.shape and not s.is_complex()
                    else None
                    for s in spreads]
        return torch.view_as_complex(self._jitter(parts, per_part).contiguous())


def _strided(*trees: Any) -> bool:
    """Whether every tensor in them (operands, results) is strided (dense)."""
    from torch.utils._pytree import tree_leaves

    return all(t.layout == torch.strided for t in tree_leaves(trees)
               if isinstance(t, torch.Tensor))


def _finite_only(noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """An infinite value stays itself: -inf + inf z would be NaN (an online softmax starts its
    running maximum at -inf)."""
    return torch.where(t.isfinite(), noisy, t)


class _Pool:
    """Standard normal draws, sliced at random offsets: a fresh randn per operation would cost
    more than the operation. Gaussian, not ±1: equal terms of random opposite sign would cancel
    exactly half the time."""

    def __init__(self, seed: int) -> None:
        import random

        self.offsets = random.Random(seed)  # one stream for every sample: fresh offsets each
        self.seed = seed
        self.values: dict[Any, torch.Tensor] = {}  # per (dtype, device)

    def draw(self, t: torch.Tensor) -> torch.Tensor:
        n, key = t.numel(), (t.dtype, t.device)
        values = self.values.get(key)
        if values is None or values.numel() < 4 * n:
            generator = torch.Generator().manual_seed(self.seed)
            values = torch.randn(4 * n, generator=generator, dtype=torch.float64, device="cpu")
            values = values.to(dtype=t.dtype, device=t.device)
            self.values[key] = values
        start = self.offsets.randrange(values.numel() - n + 1)
        return values.narrow(0, start, n).view(t.shape)


# Results that are exact in any precision: copies, sign changes, selections, constants.
_EXACT = ("clone", "_to_copy", "copy", "neg", "abs", "sign", "where", "cat", "stack", "relu",
          "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "index_select", "gather",
          "masked_fill", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
          "new_full", "new_empty", "empty_like", "scalar_tensor", "lift_fresh", "constant_pad_nd",
          "threshold_backward", "max", "min", "amax", "amin", "sort", "topk", "flip", "roll",
          "repeat", "fill", "zeros", "ones", "full", "tril", "triu", "diag_embed", "index",
          "select_backward", "slice_backward", "expand_copy", "scatter", "index_put",
          "median", "nanmedian", "kthvalue", "mode", "aminmax", "msort", "cummax", "cummin")
_KINDS: dict[Any, str] = {}


def _kind(func: Any) -> str:
    """exact (views and exact ops), inplace, sum, product or plain; cached per overload."""
    if func not in _KINDS:
        schema, name = func._schema, func.__name__.split(".")[0]
        if name.rstrip("_") in _EXACT or (not schema.is_mutable and any(
                r.alias_info is not None for r in schema.returns)):
            kind = "exact"
        elif schema.is_mutable and (name.endswith("_") or any(
                a.is_out for a in schema.arguments)):
            kind = "inplace" if name.endswith("_") else "exact"  # out= variants: rare here
        elif schema.is_mutable:  # computes, and updates state (batch norm's running stats):
            kind = "plain"       # its results are rounded; measuring it writes only copies
        else:
            kind = "sum" if name in _SUMS else "product" if name in _PRODUCTS else "plain"
        _KINDS[func] = kind
    return _KINDS[func]


def _selects(func: Any, args: Any, kwargs: Any) -> bool:
    """A norm of order ±inf picks one |element|: exact, as max is (its backward finds the
    element by comparing with it, which a rounded copy would never equal)."""
    if func.__name__.split(".")[0] != "linalg_vector_norm":
        return False
    order = kwargs.get("ord", args[1] if len(args) > 1 else 2)
    return isinstance(order, (int, float)) and math.isinf(order)


def _accumulated(func: Any, args: Any, kwargs: Any, products: bool) -> Any:
    """Per result element: sum |t| over its terms t, times sqrt(k) for products."""
    try:
        total = on_values(func, args, kwargs, _finite_abs)
        if not products or not isinstance(total, torch.Tensor):
            return total
        squares = on_values(func, args, kwargs, lambda x: _finite_abs(x) * _finite_abs(x))
        return torch.where(squares > 0, total * total / squares.sqrt(), total)
    except Exception:  # an overload that refuses |x| (e.g. a signed index): result-only model
        return None


def _finite_abs(x: Any) -> Any:
    """|x|, a -inf or NaN term (a mask, padding) counted as 0: it reaches no finite result (a
    softmax of |-inf| = inf was NaN, and every bound downstream of it inf)."""
    if isinstance(x, torch.Tensor):
        a = x.abs()
        return torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    return abs(x) if math.isfinite(abs(x)) else 0.0


@dataclass
class Bound:
    """Per-element rounding bound of each tensor of a run, and where it came from."""

    run: Callable[[], Sequence[torch.Tensor]]
    exact: list[torch.Tensor]
    dtype: str
    pool: _Pool
    squares: list[torch.Tensor]
    samples: int = 0
    round_operands: bool = False
    floors: list[float] | None = None   # per tensor: the reference's own low-dtype error
    parts: dict[str, list[torch.Tensor]] | None = None  # per source: squared deviations

    @property
    def sigmas(self) -> list[torch.Tensor]:
        """Per element: the RMS simulated deviation, floored at one rounding of the value."""
        u, eta = unit_roundoff(self.dtype), ETA[self.dtype]
        return [(acc / self.samples).sqrt() + u * e.abs() + eta + floor / SAFETY
                for acc, e, floor in zip(self.squares, self.exact, self._floors)]

    @property
    def tolerances(self) -> list[torch.Tensor]:
        # Floor: the result itself is rounded once more when it is stored in the low dtype.
        u, eta = unit_roundoff(self.dtype), ETA[self.dtype]
        return [SAFETY * (acc / self.samples).sqrt() + 2 * (u * e.abs() + eta) + floor
                for acc, e, floor in zip(self.squares, self.exact, self._floors)]

    @property
    def _floors(self) -> list[float]:
        return self.floors or [0.0] * len(self.exact)

    def attribute(self) -> dict[str, list[torch.Tensor]]:
        """Per source of rounding (SOURCES), one re-run with that source alone: its squared
        deviation per element, to say where a bound came from. Run once, on a failure."""
        if self.parts is None:
            self.parts = {}
            for source in SOURCES:
                with SimulatedRounding(self.dtype, self.pool, self.round_operands,
                                       frozenset({source})):
                    noisy = self.run()
                self.parts[source] = [(n.detach().double() - e) ** 2
                                      for n, e in zip(noisy, self.exact)]
        return self.parts

    def explain(self, tensor: int, flat: int) -> str:
        """Where one element's bound came from: the share of each source, and the floor."""
        parts = {k: float(v[tensor].reshape(-1)[flat]) for k, v in self.attribute().items()}
        total = sum(parts.values())
        shares = [f"{SOURCES[k]} {100 * v / total:.0f} %" for k, v in
                  sorted(parts.items(), key=lambda kv: -kv[1]) if total and v >= 0.05 * total]
        floor = self._floors[tensor]
        words = ", ".join(shares) if shares else "one rounding of the result"
        return words + (f"; plus {floor:.3g} from the reference's own {self.dtype} error "
                        f"({REFERENCE_FACTOR:g} x its largest)" if floor else "")

    def sample(self, count: int) -> Bound:
        """`count` more re-runs under simulated rounding, their squared deviations added."""
        for _ in range(count):
            with SimulatedRounding(self.dtype, self.pool, self.round_operands):
                noisy = self.run()
            for acc, n, e in zip(self.squares, noisy, self.exact):
                deviation = (n.detach().double() - e) ** 2
                # NaN where rounding at this dtype leaves the op's domain (1 - x² < 0 under
                # asin's square root, x within u of 1): this dtype cannot resolve the element.
                acc += torch.where(deviation.isnan() & e.isfinite(), math.inf, deviation)
        self.samples += count
        return self

    def describe(self) -> str:
        floor = (f"; plus {REFERENCE_FACTOR:g} x the largest error of the reference itself run "
                 f"in {self.dtype}, per tensor" if any(self._floors) else "")
        return (f"per element: {SAFETY:g} x RMS deviation (+ 2 (u|value| + eta)) of {self.samples} "
                f"float64 re-runs with every operation rounded at {self.dtype}'s unit roundoff "
                f"u = 2^{round(math.log2(unit_roundoff(self.dtype)))} (each result's rounding, "
                f"each op's measured kernel error, sums' accumulation over their terms){floor}")


def measure_bound(run: Callable[[], Sequence[torch.Tensor]], exact: Sequence[torch.Tensor],
                  dtype: str, seed: int, samples: int = SAMPLES,
                  round_operands: bool = False) -> Bound:
    """Re-run `run` (a float64 computation) under simulated rounding; the spread per element.

    round_operands: also round the operands of matrix products (what autocast does)."""
    exact64 = [e.detach().double() for e in exact]
    squares = [torch.zeros_like(e) for e in exact64]
    return Bound(run, exact64, dtype, _Pool(seed), squares,
                 round_operands=round_operands).sample(samples)


def scale_error(low: torch.Tensor, exact: torch.Tensor, sigma: torch.Tensor
                ) -> tuple[float, float]:
    """(s, its standard error): low = (1 + s) exact fitted over every element, each weighted by
    its rounding spread. A scale error hides below every element's bound but not in the sum."""
    weight = (exact / sigma.clamp_min(1e-300)) ** 2
    weight = torch.where(sigma > 0, weight, torch.zeros_like(weight))
    total = float(weight.sum())
    if total <= 0:
        return 0.0, math.inf
    ratio = torch.where(exact != 0, (low.double() - exact) / exact, torch.zeros_like(exact))
    return float((weight * ratio).sum()) / total, total ** -0.5


def finest_resolving(dtype: str, ratio: float) -> str | None:
    """The coarsest precision finer than `dtype` whose bound (scaled by u) is below `ratio`."""
    u = unit_roundoff(dtype)
    for name in reversed(FINEST_FIRST):
        if UNIT_ROUNDOFF[name] < u and UNIT_ROUNDOFF[name] / u * ratio < 0.5:
            return name
    return None
