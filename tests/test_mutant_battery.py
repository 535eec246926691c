"""The seeded-bug battery (issue 55): benchmarks/mutants.py's operators on fixtures where -inf,
one-hot rows and one-element normalisations are by design, in every comparison mode. Every
visible mutant fails; every correct twin passes. The quick tier runs a sample (masked attention,
negate and roll, every mode); the rest is `slow` (tests/slow_tests.py)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT, load_fixture

import gradtool

sys.path.insert(0, str(ROOT / "benchmarks"))
import mutants as mu  # noqa: E402

M = load_fixture("masked_attention")


# ------------------------------------------------------------------------------- fixtures

def masked_attention(x, v):
    return M.causal(x).softmax(-1) @ v


def padded_attention(x, v):
    return x.softmax(-1) @ v


def one_hot_softmax(x, v):
    return x.softmax(-1) * v


def norm_over_one(x, w, b):
    """A layer norm over a last dimension of one element: x - mean is 0, so only b's
    gradient is non-zero (w's and x's are exactly zero)."""
    y = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    return y * w + b


def _inputs(name: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if name == "masked_attention":
        return masked_attention, [r(5, 6), r(6, 3)]
    if name == "padded_attention":
        x = r(6, 8)
        x[:, 5:] = float("-inf")
        return padded_attention, [x, r(8, 3)]
    if name == "one_hot_softmax":
        x = r(4, 5)
        x[:2, 0] = 60.0  # two rows one-hot in float64 (and below)
        return one_hot_softmax, [x, r(4, 5)]
    if name == "norm_over_one":
        return norm_over_one, [r(6, 1), r(1), r(1)]
    raise KeyError(name)


FIXTURES = ("masked_attention", "padded_attention", "one_hot_softmax", "norm_over_one")
MODES = ("float64 full", "float64 probe", "float32 vs reference", "float32 vs float64",
         "bfloat16 vs reference", "bfloat16 vs float64", "module", "drop-in fast",
         "drop-in slow")
# A mutant counts as visible in a mode when its VJP moves beyond what that mode can resolve:
# gradcheck's tolerance in float64 (benchmarks/mutants.py:kept); below, this fraction of the
# largest gradient element (x1.01 is 1 % of each element: not resolvable in bfloat16).
VISIBLE = {"float32": 5e-3, "bfloat16": 0.1}


def _dtype(mode: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(mode.split()[0],
                                                                       torch.float64)


def visible(fn, values, kind, position, mode) -> bool:
    """Whether the mutant's first-order VJP (second for DROP) differs visibly in this mode."""
    if kind == mu.FINE and _dtype(mode) != torch.float64:
        return False  # x1.001 is below float32's test threshold and bfloat16's rounding
    if kind == mu.DROP and mode not in ("float64 full", "drop-in slow"):
        return False  # double backward is judged in those modes here
    if _dtype(mode) == torch.float64:
        return mu.kept(fn, values, kind, position)
    if not mu.applicable(values, kind, position):
        return False
    good, bad = mu.wrap(fn, values, None), mu.wrap(fn, values, (kind, position))
    a, b = mu._probe(good, values, False), mu._probe(bad, values, False)
    scale = max(float(t.abs().max()) for t in a)
    return any(float((x - y).abs().max()) > VISIBLE[str(_dtype(mode))[6:]] * scale
               for x, y in zip(a, b))


def verdict(fn, values, mutation, mode) -> bool:
    """Whether gradtool passes the (mutated) Function in this mode."""
    dtype = _dtype(mode)
    cls = mu.wrap(fn, [v.to(dtype) for v in values], mutation)
    assert cls is not None
    low = [v.to(dtype) for v in values]
    checks = ["gradient", "double_backward"] if mutation and mutation[0] == mu.DROP else \
        ["gradient"]
    if mode in ("float64 full", "float64 probe"):
        report = gradtool.check(cls.apply, low, checks=checks, mode=mode.split()[1])
    elif mode.endswith("vs reference"):
        ref = lambda *xs: fn(*[x.double() for x in xs])  # noqa: E731
        report = gradtool.check(cls.apply, low, checks=checks, reference=ref)
    elif mode.endswith("vs float64"):
        report = gradtool.check(cls.apply, low, checks=checks)
    elif mode == "module":
        return _module_passes(cls, values, checks)
    else:
        rg = [v.detach().clone().requires_grad_(True) for v in values]
        ok = gradtool.gradcheck(cls.apply, tuple(rg), fast_mode=mode == "drop-in fast",
                                raise_exception=False)
        if ok and mutation and mutation[0] == mu.DROP:
            ok = gradtool.gradgradcheck(cls.apply, tuple(rg), raise_exception=False)
        return bool(ok)
    return report.ok()


def _module_passes(cls, values, checks) -> bool:
    """The Function inside an nn.Module, its later inputs the module's parameters."""
    first, *rest = values

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterList([torch.nn.Parameter(v.clone()) for v in rest])

        def forward(self, x):
            return cls.apply(x, *self.params)

    return gradtool.check(Layer().double(), (first,), checks=checks).ok()


def _cases():
    """(fixture, kind, position, mode) of the battery; the quick tier's sample first."""
    quick, slow = [], []
    for name in FIXTURES:
        _, values = _inputs(name)
        for kind in mu.BATTERY:
            for position in range(len(values)):
                for mode in MODES:
                    sample = name == "masked_attention" and kind in (mu.NEGATE, mu.SHIFT) \
                        and position == 1
                    case = (name, kind, position, mode)
                    (quick if sample else slow).append(case)
    return quick, slow


QUICK, SLOW = _cases()


def _run(name, kind, position, mode):
    fn, values = _inputs(name)
    if mode == "module" and position == 0 and kind == mu.SWAP:
        pytest.skip("a swap with a parameter: the module's gradient check compares both")
    if not visible(fn, values, kind, position, mode):
        pytest.skip(f"{kind} of input {position} is not visible in {mode}")
    assert not verdict(fn, values, (kind, position), mode), \
        f"{kind} of input {position} of {name} passed in {mode}"


@pytest.mark.parametrize("name,kind,position,mode", QUICK)
def test_a_visible_mutant_fails_sample(name, kind, position, mode):
    _run(name, kind, position, mode)


@pytest.mark.parametrize("name,kind,position,mode", SLOW)
def test_a_visible_mutant_fails(name, kind, position, mode):
    _run(name, kind, position, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", FIXTURES)
def test_the_correct_twin_passes(name, mode):
    fn, values = _inputs(name)
    assert verdict(fn, values, None, mode), f"correct {name} failed in {mode}"
