"""The seeded-bug battery (issue 55): benchmarks/mutants.py's operators on fixtures where -inf,
one-hot rows and one-element normalisations are by design, in every comparison mode: float64
full and probe, float32/bfloat16 against a reference and against float64, a module, the drop-in
fast and slow, a sparse input (masked) and complex values (library and drop-in), a size sweep
and a trace of a script.
Every visible mutant fails; every correct twin passes. The quick tier runs a sample (masked
attention, negate and roll, every mode); the rest is `slow` (tests/slow_tests.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
from conftest import ROOT, load_fixture

import gradtool

sys.path.insert(0, str(ROOT / "benchmarks"))
import mutants as mu  # noqa: E402

M = load_fixture("masked_attention")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, loaded machine


# ------------------------------------------------------------------------------- fixtures

def masked_attention(x, v):
    return M.causal(x).softmax(-1).to(v.dtype) @ v  # v complex in the complex mode


def padded_attention(x, v):
    return x.softmax(-1).to(v.dtype) @ v


def one_hot_softmax(x, v):
    return x.softmax(-1) * v


def norm_over_one(x, w, b):
    """A layer norm over a last dimension of one element: x - mean is 0, so only b's
    gradient is non-zero (w's and x's are exactly zero)."""
    y = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    return y * w + b


def _inputs(name: str, seed: int = 0, size: int | None = None):
    """The fixture's function and float64 values; `size`: the swept one (the sweep mode's)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if name == "masked_attention":
        return masked_attention, [r(5, size or 6), r(size or 6, 3)]
    if name == "padded_attention":
        x = r(6, 8)
        x[:, 5:] = float("-inf")
        return padded_attention, [x, r(8, 3)]
    if name == "one_hot_softmax":
        x = r(4, 5)
        x[:2, 0] = 60.0  # two rows one-hot in float64 (and below)
        return one_hot_softmax, [x, r(4, 5)]
    if name == "norm_over_one":
        return norm_over_one, [r(size or 6, 1), r(1), r(1)]
    raise KeyError(name)


# ------------------------------------------------------------------ the modes' own inputs

# The sparse mode's sparse input (COO, compared on its specified elements: gradcheck's masked):
# v, or the bias of the one-element normalisation (x's and w's gradients are exactly zero there).
SPARSE_AT = {"masked_attention": 1, "padded_attention": 1, "one_hot_softmax": 1,
             "norm_over_one": 2}
# The sweep mode's shapes (size D swept over two values, the battery's own size among them);
# padding and one-hot rows are given values, which a sweep's drawn inputs do not hold.
SWEPT = {"masked_attention": (("5xD", "Dx3"), (4, 6)),
         "norm_over_one": (("Dx1", "(1,)", "(1,)"), (3, 6))}


def pattern(value: torch.Tensor) -> torch.Tensor:
    """The sparse mode's pattern: every other element specified (the first always)."""
    keep = torch.zeros(value.numel(), dtype=torch.bool)
    keep[::2] = True
    return keep.view(value.shape)


def densified(fn: Callable) -> Callable:
    """fn taking a sparse argument: it computes on the dense tensor (as a sparse layer would)."""

    def dense(*xs):
        return fn(*[x.to_dense() if x.layout != torch.strided else x for x in xs])

    dense.__name__ = fn.__name__
    return dense


def mode_inputs(name: str, mode: str, size: int | None = None):
    """(fn, values, masks) for the mode: the sparse mode's input made sparse (masks: per input,
    the elements its gradient is compared at), the complex mode's later inputs complex."""
    fn, values = _inputs(name, size=size)
    masks: list = [None] * len(values)
    if mode.startswith("sparse"):
        at = SPARSE_AT[name]
        masks[at] = pattern(values[at])
        values[at] = (values[at] * masks[at]).to_sparse()
        return densified(fn), values, masks
    if mode.startswith("complex"):  # -inf masks and softmax rows stay real, the values not
        g = torch.Generator().manual_seed(1)
        values = values[:1] + [torch.complex(v, torch.randn(v.shape, generator=g,
                                                               dtype=torch.float64))
                               for v in values[1:]]
    return fn, values, masks


FIXTURES = ("masked_attention", "padded_attention", "one_hot_softmax", "norm_over_one")
MODES = ("float64 full", "float64 probe", "float32 vs reference", "float32 vs float64",
         "bfloat16 vs reference", "bfloat16 vs float64", "module", "drop-in fast",
         "drop-in slow", "sparse", "sparse drop-in", "complex", "complex drop-in", "sweep",
         "trace")
# A mutant counts as visible in a mode when its VJP moves beyond what that mode can resolve:
# gradcheck's tolerance in float64 (benchmarks/mutants.py:kept); below, this fraction of the
# largest gradient element (x1.01 is 1 % of each element: not resolvable in bfloat16).
VISIBLE = {"float32": 5e-3, "bfloat16": 0.1}


def _dtype(mode: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(mode.split()[0],
                                                                       torch.float64)


def unseen(name: str, kind: str, position: int, mode: str) -> str | None:
    """Why a mode cannot see this mutant whatever the values (None: it may)."""
    if mode == "module" and position == 0 and kind == mu.SWAP:
        return "a swap with a parameter: the module's gradient check compares both"
    if kind == mu.DROP and mode not in ("float64 full", "drop-in slow"):
        return "double backward is judged in float64 full and drop-in slow here"
    if mode == "sweep" and name not in SWEPT:
        return "its -inf padding and one-hot rows are given values; a sweep draws its inputs"
    return None


def visible(fn, values, kind, position, mode, masks=()) -> bool:
    """Whether the mutant's first-order VJP (second for DROP) differs visibly in this mode."""
    if kind == mu.FINE and _dtype(mode) != torch.float64:
        return False  # x1.001 is below float32's test threshold and bfloat16's rounding
    if kind == mu.DROP and mode not in ("float64 full", "drop-in slow"):
        return False  # double backward is judged in those modes here
    if mode.startswith("sparse"):  # the dense function's VJP, compared where the mode does
        dense = [v.to_dense() if v.layout != torch.strided else v for v in values]
        return mu.kept(fn, dense, kind, position, masks)
    if _dtype(mode) == torch.float64:
        return mu.kept(fn, values, kind, position)
    if not mu.applicable(values, kind, position):
        return False
    good, bad = mu.wrap(fn, values, None), mu.wrap(fn, values, (kind, position))
    a, b = mu._probe(good, values, False), mu._probe(bad, values, False)
    scale = max(float(t.abs().max()) for t in a)
    return any(float((x - y).abs().max()) > VISIBLE[str(_dtype(mode))[6:]] * scale
               for x, y in zip(a, b))


def verdict(fn, values, mutation, mode, name: str = "") -> bool:
    """Whether gradtool passes the (mutated) Function in this mode."""
    if mode in NEW_MODES:
        return NEW_MODES[mode](fn, values, mutation, name)
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


def _checks(mutation) -> list[str]:
    return ["gradient", "double_backward"] if mutation and mutation[0] == mu.DROP else \
        ["gradient"]


def _ran(report) -> bool:
    """report.ok(), after asserting every check ran: a skipped check would read as a pass."""
    outcomes = [check.outcome.value for _, _, check in report.checks()]
    assert outcomes and "skipped" not in outcomes, str(report)
    return report.ok()


def _sparse_passes(fn, values, mutation, name) -> bool:
    """gradtool.check on the sparse input's specified elements (gradcheck's masked=True)."""
    cls = mu.wrap(fn, values, mutation)
    return _ran(gradtool.check(cls.apply, values, checks=_checks(mutation), masked=True))


def _complex_passes(fn, values, mutation, name) -> bool:
    """The complex check: the real map's Jacobian (real and imaginary parts) against finite
    differences (gradcheck's Wirtinger comparison)."""
    cls = mu.wrap(fn, values, mutation)
    return _ran(gradtool.check(cls.apply, values, checks=["complex"]))


def _sweep_passes(fn, values, mutation, name) -> bool:
    """`--sweep D=a,b` over symbolic shapes: one case per size, gradtool drawing the inputs."""
    from gradtool.api import _config
    from gradtool.run.collect import Run, Sources

    shapes, sizes = SWEPT[name]
    cls = mu.wrap(fn, values, mutation)
    sources = Sources(inputs=shapes, sweeps=(f"D={','.join(map(str, sizes))}",))
    report = Run((cls,), _config({"checks": _checks(mutation)}), sources).report()
    assert len(list(report.checks())) == len(sizes)  # a case per size, each checked
    return _ran(report)


def _trace_passes(fn, values, mutation, name) -> bool:
    """A script's training step calling the Function, recorded and checked as the pytest
    plugin's gradtool_trace fixture does (the call's own inputs: -inf padding included)."""
    import tempfile

    from gradtool.pytest_plugin import Tracer

    cls = mu.wrap(fn, values, mutation)
    with tempfile.TemporaryDirectory() as folder:
        tracer = Tracer(folder, {"checks": tuple(_checks(mutation))})
        try:
            out = cls.apply(*[v.detach().clone().requires_grad_(True) for v in values])
            out.abs().square().sum().backward()
        finally:
            tracer.stop()
        assert len(tracer.calls) == 1, tracer.calls
        try:
            return _ran(tracer.check())
        except pytest.fail.Exception:
            return False


def _dropin_passes(fn, values, mutation, name, masked=False) -> bool:
    """gradtool.gradcheck (slow mode, gradcheck's default) on the sparse or complex inputs."""
    cls = mu.wrap(fn, values, mutation)
    rg = tuple(v.detach().clone().requires_grad_(True) for v in values)
    return bool(gradtool.gradcheck(cls.apply, rg, masked=masked, raise_exception=False))


NEW_MODES = {"sparse": _sparse_passes, "complex": _complex_passes, "sweep": _sweep_passes,
             "trace": _trace_passes,
             "sparse drop-in": lambda *a: _dropin_passes(*a, masked=True),
             "complex drop-in": _dropin_passes}


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


def seen(name, kind, position, mode) -> tuple[bool, str]:
    """(whether the mutant is visible in the mode, why not): the sweep's at every size."""
    why = unseen(name, kind, position, mode)
    if why:
        return False, why
    for size in SWEPT[name][1] if mode == "sweep" else (None,):
        fn, values, masks = mode_inputs(name, mode, size)
        if not visible(fn, values, kind, position, mode, masks):
            return False, f"{kind} of input {position} is not visible in {mode}" + \
                (f" at D={size}" if size else "")
    return True, ""


def _run(name, kind, position, mode):
    shown, why = seen(name, kind, position, mode)
    if not shown:
        pytest.skip(why)
    fn, values, _ = mode_inputs(name, mode)
    assert not verdict(fn, values, (kind, position), mode, name), \
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
    if mode == "sweep" and name not in SWEPT:
        pytest.skip(unseen(name, mu.NEGATE, 1, mode))
    fn, values, _ = mode_inputs(name, mode)
    assert verdict(fn, values, None, mode, name), f"correct {name} failed in {mode}"
