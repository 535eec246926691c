"""Forward and backward evaluations: fixed in probe mode, far below gradcheck's in full mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradtool

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import bugs  # noqa: E402

SIZES = {"elementwise": [["(10,)"], ["(1000,)"], ["(100000,)"]],
         "linear": [["4x4", "4x4", "(4,)"], ["64x64", "64x64", "(64,)"]]}


def calls(cls: type, inputs: list[str], mode: str, check: str = "gradient") -> dict[str, int]:
    report = gradtool.check(cls, inputs, mode=mode, checks=(check,))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == "passed" and result.mode == mode
    return dict(result.calls)


@pytest.mark.parametrize("check", ["gradient", "double_backward"])
def test_probe_mode_makes_the_same_calls_whatever_the_size(check):
    seen = []
    for cls, family in ((bugs.Cube, "elementwise"), (bugs.Linear, "linear")):
        for inputs in SIZES[family]:
            if check == "double_backward" and inputs[0] == "64x64":
                continue
            seen.append(calls(cls, inputs, "probe", check))
    # one forward with a graph, three perturbed forwards, two VJPs: within 8x (forward+backward);
    # the gradient check reuses the probe phase's forward with a graph (made before any check)
    forwards = 3 if check == "gradient" else 4
    assert all(c == {"forward": forwards, "backward": 2} for c in seen), seen


def test_probe_mode_with_more_probes_adds_directions_not_size_dependence():
    for inputs in (["(10,)"], ["(100000,)"]):
        report = gradtool.check(bugs.Cube, inputs, mode="probe", checks=("gradient",), probes=8)
        result = next(c for _, _, c in report.checks())
        assert result.calls == {"forward": 6, "backward": 2}


def test_full_mode_on_an_elementwise_op_needs_a_handful_of_evaluations():
    # gradcheck's slow mode: 2 n_in forwards and n_out backwards (2e5 and 1e5 here)
    for inputs in (["(1000,)"], ["(100000,)"]):
        assert calls(bugs.Cube, inputs, "full") == {"forward": 4, "backward": 4}
        # 9 evaluations of backward's own function; the two along grad_output reuse a forward
        assert calls(bugs.Cube, inputs, "full", "double_backward") == {"forward": 7,
                                                                        "backward": 4}


def test_full_mode_on_linear_64_is_far_below_gradcheck():
    n_in, n_out = 64 * 64 * 2 + 64, 64 * 64
    counted = calls(bugs.Linear, ["64x64", "64x64", "(64,)"], "full")
    assert counted["forward"] <= 2 * n_in // 25      # coloured columns: 129 colours x 4
    assert counted["backward"] <= n_out // 25        # grouped rows: 65 groups x 2


def test_full_mode_at_tiny_sizes_makes_no_more_calls_than_gradcheck_slow():
    n_in, n_out = 4 * 4 * 2 + 4, 16
    counted = calls(bugs.Linear, ["4x4", "4x4", "(4,)"], "full")
    assert counted["forward"] <= 2 * n_in + 2 and counted["backward"] <= n_out


def test_a_failing_full_check_confirms_failures_with_few_extra_calls():
    report = gradtool.check(bugs.CubeOneElement, ["(100000,)"], mode="full",
                            checks=("gradient",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == "failed"
    # + one exact column, + its measured error (f at ±h, ±2h, ±3h), + the kink re-estimate
    # at ±10h
    assert result.calls["forward"] <= 5 + 2 + 6 + 2
    assert result.blocks[0].mismatched == 1


def test_no_sympy_import_during_a_check():
    code = ("import sys; sys.path.insert(0, %r); import gradtool, bugs; "
            "r = gradtool.check(bugs.Cube, ['(10,)']); "
            "assert all(c.outcome.value == 'passed' for _, _, c in r.checks()); "
            "print('sympy' in sys.modules)" % str(FIXTURES))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_probe_is_cheaper_than_one_gradcheck_fast_in_calls():
    from collections import Counter

    from torch.autograd import gradcheck

    counter: Counter = Counter()

    class Counted(bugs.Cube):
        @staticmethod
        def forward(ctx, x):
            counter["forward"] += 1
            return bugs.Cube.forward(ctx, x)

        @staticmethod
        def backward(ctx, grad):
            counter["backward"] += 1
            return bugs.Cube.backward(ctx, grad)

    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    gradcheck(Counted.apply, (x,), fast_mode=True)
    ours = calls(bugs.Cube, ["(1000,)"], "probe")
    assert ours["forward"] + ours["backward"] <= counter["forward"] + counter["backward"]


@pytest.mark.parametrize("bug", ["correct", "factor", "one element", "transposed"])
@pytest.mark.parametrize("family", ["fixed point", "simplex projection"])
def test_non_vmappable_gradient_spends_no_more_forwards_than_gradcheck_slow(family, bug):
    # gradcheck slow: 2 n_in + 1 forwards at the Function (n_in = 12); a failure's dense blocks
    # and kink re-estimates reuse the sweep's evaluations (two new ones at 10 h at most)
    import expensive

    cls = expensive.FAMILIES[family][bug]
    report = gradtool.check(cls, ["(12,)"], mode="full", checks=("gradient",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == ("passed" if bug == "correct" else "failed")
    assert result.calls["forward"] <= 2 * 12 + 1 + (2 if bug in ("one element", "transposed")
                                                     else 0)
    assert result.calls["backward"] <= 12 + 2


@pytest.mark.parametrize("mode", ["full", "auto"])
@pytest.mark.parametrize("family", ["fixed point", "simplex projection"])
def test_a_detached_second_order_costs_no_more_than_gradgradcheck_slow(family, mode):
    # gradgradcheck slow on n = 12: 2 (12 + 12) + 2 evaluations of backward's graph; a failure
    # is confirmed by whole columns (kept for the diagnosis), not bisected then recomputed
    import expensive

    report = gradtool.check(expensive.FAMILIES[family]["detached 2nd order"], ["(12,)"],
                            mode=mode, checks=("double_backward",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == "failed" and result.mode == "full"
    assert "second derivative is zero" in result.blocks[-1].diagnosis
    assert result.calls["forward"] <= 2 * 24 + 2 + 10


def test_a_failing_probe_on_a_small_input_goes_to_full_mode_in_auto_only():
    # full_budget_s=0 makes auto mode choose probe; once the probe fails, 2 n_in columns cost
    # fewer evaluations than bisecting to elements, so auto finishes in full mode
    import expensive

    def run(cls, mode):
        report = gradtool.check(cls, ["(12,)"], mode=mode, checks=("gradient",),
                                full_budget_s=0.0)
        return next(c for _, _, c in report.checks())

    passing = run(expensive.FIXED_POINT["correct"], "auto")
    assert passing.outcome.value == "passed" and passing.mode == "probe"
    failing = run(expensive.FIXED_POINT["factor"], "auto")
    assert failing.outcome.value == "failed" and failing.mode == "full"
    assert "probe failed" in failing.mode_reason
    assert failing.calls["forward"] <= 1 + 3 + 2 * 12 + 2   # prime, probe, columns
    assert "factor 2" in failing.blocks[0].diagnosis
    probe = run(expensive.FIXED_POINT["factor"], "probe")  # asked for: stays probe
    assert probe.outcome.value == "failed" and probe.mode == "probe"


def sorted_values(x):
    """torch.sort's values: a permutation, so its second derivative is zero everywhere."""
    return torch.sort(x).values


def test_double_backward_of_a_permutation_is_coloured_not_swept_column_by_column():
    # backward's Jacobian w.r.t. x is all zero: one colour (4 evaluations), where a column-by-
    # column sweep took 2 x 8000 (the derived problem is evaluated call by call)
    x = torch.randperm(8000, generator=torch.Generator().manual_seed(0)).double()  # no ties
    report = gradtool.check(sorted_values, [x], mode="full", checks=("double_backward",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == "passed", result.summary
    assert result.calls["forward"] <= 9, result.calls


@pytest.mark.parametrize("family", ["fixed point", "simplex projection"])
def test_a_wide_zero_second_order_is_coloured_and_a_detached_one_still_fails(family):
    # n = 100 (>= 64 columns): the correct Function's zero blocks cost 4 evaluations each; its
    # detached twin fails with the diagnosis, for at most 8 evaluations more than the column-
    # by-column sweep's 2 (100 + 100) + 1 (the failing colours are recomputed whole and their
    # columns reused by the diagnosis' dense blocks)
    import expensive

    cols = 2 * (100 + 100) + 1
    correct = gradtool.check(expensive.FAMILIES[family]["correct"], ["(100,)"], mode="full",
                             checks=("double_backward",))
    passed = next(c for _, _, c in correct.checks())
    assert passed.outcome.value == "passed" and passed.calls["forward"] <= cols
    if family == "simplex projection":  # piecewise linear: zero second derivative in x
        assert passed.calls["forward"] <= 64, passed.calls
    report = gradtool.check(expensive.FAMILIES[family]["detached 2nd order"], ["(100,)"],
                            mode="full", checks=("double_backward",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == "failed"
    assert "second derivative is zero" in result.blocks[-1].diagnosis
    assert result.calls["forward"] <= cols + 8, result.calls


# A Function under a functorch transform runs as a higher-order op; torch 2.6 and older import
# torch._dynamo in every higher-order op's __call__, which no caller can avoid.
TRANSFORMED_FUNCTION = """
import sys, torch
from torch._functorch.vmap import vmap_impl
class Square(torch.autograd.Function):
    generate_vmap_rule = True
    @staticmethod
    def forward(x):
        return x * x
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
    @staticmethod
    def backward(ctx, g):
        return 2 * ctx.saved_tensors[0] * g
vmap_impl(Square.apply, 0, 0, "error", None, torch.ones(2, 3))
print("torch._dynamo" in sys.modules)
"""


@pytest.fixture(scope="module")
def torch_imports_dynamo_under_transforms() -> bool:
    out = subprocess.run([sys.executable, "-c", TRANSFORMED_FUNCTION], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


@pytest.mark.parametrize("target,inputs,settings,transformed", [
    ("specs/examples/jvp_vmap_complex.py:Softplus", ["3x4"], {}, True),          # vmap on
    ("specs/examples/jvp_vmap_complex.py:ScaledTanh", ["3x4", "3x4"], {}, True),  # forward_ad on
    ("specs/examples/jvp_vmap_complex.py:RealToComplex", ["3x4"], {}, False),     # complex on
    ("specs/examples/cube.py:MyCube", ["3x4"], {"dtype": "float32"}, False),      # precision
])
def test_no_default_check_imports_dynamo_or_sympy(target, inputs, settings, transformed,
                                                  torch_imports_dynamo_under_transforms):
    # torch.func's VJP reaches compiled autograd through torch._dynamo, and a dispatch mode's
    # __torch_dispatch__ is wrapped in torch._dynamo.disable: ~800 modules, 0.7 s cold
    if transformed and torch_imports_dynamo_under_transforms:
        pytest.skip(f"torch {torch.__version__} imports torch._dynamo for any Function under "
                    "vmap or jvp")
    root = Path(__file__).parent.parent
    code = ("import sys, gradtool; r = gradtool.check(%r, %r, **%r); "
            "assert all(c.outcome.value in ('passed', 'skipped') for _, _, c in r.checks()), "
            "[(c.name, c.summary) for _, _, c in r.checks()]; "
            "print(len(list(r.checks())), sorted(m for m in ('torch._dynamo', 'sympy', "
            "'torch.onnx', 'torch._inductor') if m in sys.modules))" % (target, inputs,
                                                                           settings))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1)[1].strip() == "[]", out.stdout


def test_a_worker_freezes_what_importing_torch_made_and_a_host_with_torch_is_left_alone():
    # a full collection over torch's ~170k import-time objects costs ~70 ms each time: more than
    # a small check's whole work. gradtool's own process imports torch with the collector paused
    # and freezes the result; a process that already has torch keeps its collector as it was.
    code = ("import gc, sys; from gradtool.cli.worker import import_torch; "
            "fresh = 'torch' not in sys.modules; import_torch(); "
            "print(fresh, gc.get_freeze_count(), gc.isenabled(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    fresh, frozen, enabled, loaded = out.stdout.split()
    assert (fresh, enabled, loaded) == ("True", "True", "True"), out.stderr
    assert int(frozen) > 50_000
    import gc

    from gradtool.cli.worker import import_torch

    before = gc.get_freeze_count()
    import_torch()  # this test process has torch: nothing changes
    assert gc.get_freeze_count() == before and gc.isenabled()


class _LoopedSquare(torch.autograd.Function):
    """x ** 2 through a Python loop that reads .item(): vmap refuses it, so double backward
    evaluates backward's function call by call. `forwards` counts the real forward calls."""

    forwards = 0

    @staticmethod
    def forward(ctx, x):
        _LoopedSquare.forwards += 1
        ctx.save_for_backward(x)
        return torch.stack([v * v * (1.0 if v.item() == v.item() else 0.0) for v in x])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _DetachedSquare(_LoopedSquare):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x.detach() * grad  # a zero second derivative


class _BackwardOnce(_LoopedSquare):
    """A correct backward that frees what it saved: it cannot run twice on one graph."""

    @staticmethod
    def forward(ctx, x):
        ctx.x = x.detach()
        return _LoopedSquare.forward(ctx, x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        del ctx.x
        return 2 * x * grad


class _BackwardCounts(_LoopedSquare):
    """Correct on the first backward of each forward, wrong after it (state kept in ctx): a
    backward re-run on one graph must never be taken for a fresh one."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        ctx.runs = getattr(ctx, "runs", 0) + 1
        return 2 * x * grad * ctx.runs


PROBE_FORWARDS = 2  # the probe phase's forwards (purity, its graph): the case's, not G's


@pytest.mark.parametrize("cls,outcome", [(_LoopedSquare, "passed"), (_DetachedSquare, "failed"),
                                         (_BackwardOnce, "passed"), (_BackwardCounts, "passed")])
def test_double_backward_along_grad_output_reuses_a_forward_only_when_it_gives_the_same(
        cls, outcome):
    # G(x, v) = vᵀ∂f/∂x at a fixed x along v: one forward serves every grad_output, once a
    # reuse has matched a fresh evaluation bit for bit
    _LoopedSquare.forwards = 0
    report = gradtool.check(cls, ["(6,)"], mode="full", checks=("double_backward",))
    result = next(c for _, _, c in report.checks())
    assert result.outcome.value == outcome, result.summary
    # G's count holds only the forwards that ran (one more derives G: the case's graph forward)
    assert result.calls["forward"] == _LoopedSquare.forwards - PROBE_FORWARDS - 1
    evaluations = 2 * (6 + 6) + 1  # central differences over x and v, and G's own graph
    if cls in (_LoopedSquare, _DetachedSquare):  # x columns, G's graph, a v column twice
        # a zero block fails on its first weighting: 2 coloured evaluations, then its columns
        failing_path = 2 if outcome == "failed" else 0
        assert result.calls["forward"] == 2 * 6 + 1 + 2 + failing_path, result.calls
    else:  # the reuse is refused: every evaluation runs its own forward
        assert result.calls["forward"] == evaluations, result.calls


def test_a_zero_block_that_fails_its_first_weighting_skips_the_second():
    # an all-zero analytical block is one colour, 2 weighted central differences (4 plain
    # calls); when the first already finds a nonzero, the block's columns are computed whole
    # anyway: the second would only confirm it. Passing, both weightings still run.
    passed = calls(_LoopedSquare, ["(6,)"], "full", "double_backward")
    report = gradtool.check(_DetachedSquare, ["(6,)"], mode="full", checks=("double_backward",))
    failed = next(c for _, _, c in report.checks())
    assert failed.outcome.value == "failed"
    assert "second derivative is zero" in failed.blocks[0].diagnosis
    # the detached one's zero block: 2 weighted evaluations + 12 exact; the correct twin's
    # x block is not zero (2 per column): both 15 + the 2 weighted ones
    assert failed.calls["forward"] == passed["forward"] + 2


def test_double_backward_derives_from_the_gradient_checks_graph_forward():
    # run together, double backward builds G from the graph forward the gradient check primed
    # instead of running one of its own
    def forwards(checks):
        _LoopedSquare.forwards = 0
        gradtool.check(_LoopedSquare, ["(6,)"], mode="full", checks=checks)
        return _LoopedSquare.forwards - PROBE_FORWARDS

    alone = forwards(("gradient",)) + forwards(("double_backward",))
    # and G along x runs backward through the forwards the gradient check's sweep recorded at
    # the same points (2 per element), all but the first, which a fresh forward verifies
    assert forwards(("gradient", "double_backward")) == alone - 1 - (2 * 6 - 1)


@pytest.mark.parametrize("cls", [_LoopedSquare, _DetachedSquare, _BackwardOnce, _BackwardCounts])
def test_double_backward_says_the_same_through_the_gradient_checks_forwards(cls):
    # the recorded forwards change what double backward costs, never what it finds
    def blocks(checks):
        report = gradtool.check(cls, ["(6,)"], mode="full", checks=checks)
        result = next(c for _, _, c in report.checks() if c.name == "double_backward")
        return result.outcome.value, [(b.input, b.output, b.checked, b.mismatched,
                                       b.max_abs_diff, b.worst) for b in result.blocks]

    assert blocks(("gradient", "double_backward")) == blocks(("double_backward",))


def _square_backward():
    """G of _LoopedSquare at x, with nothing recorded; x, and v along which it runs."""
    from gradtool.checks.double_backward import _derive
    from gradtool.config.settings import CheckConfig
    from gradtool.targets.cases import build_case
    from gradtool.targets.inputs import parse_input
    from gradtool.targets.resolve import make_target

    case = build_case(make_target(_LoopedSquare, "square"), [parse_input("(3,)")],
                      CheckConfig(), 0)
    derived, _ = _derive(case.problem, 0)
    return derived.fn, case.problem.inputs[0].detach(), derived.inputs[1]


def _graph_at(x):
    leaf = x.clone().requires_grad_(True)
    return [leaf], [_LoopedSquare.apply(leaf)]


def test_a_recorded_forward_stands_for_a_fresh_one_only_once_one_gave_the_same():
    from collections import Counter

    from gradtool.numerics.problem import graph_key

    g, x, v = _square_backward()
    g.calls = Counter(forward=0)
    points = [x + 0.1 * k for k in range(3)]
    # a graph recorded at another point under this point's key: the fresh forward beside it
    # disagrees, so its value is the fresh one and no recorded forward is trusted again
    g.recorded = {graph_key([points[0]]): _graph_at(2 * x), graph_key([points[1]]):
                  _graph_at(points[1])}
    got = g(points[0], v)
    assert torch.equal(got[0], 2 * points[0] * v) and g.trusted["recorded"] is False
    _LoopedSquare.forwards = 0
    g(points[1], v)  # recorded right, but no longer trusted: a forward of its own
    assert _LoopedSquare.forwards == 1
    # a right one first: trusted once it matched, then each later one saves its forward
    g, x, v = _square_backward()
    g.calls = Counter(forward=0)
    g.recorded = {graph_key([p]): _graph_at(p) for p in points}
    _LoopedSquare.forwards = 0
    results = [g(p, v)[0] for p in points]
    assert g.trusted["recorded"] is True and _LoopedSquare.forwards == 1
    assert all(torch.equal(r, 2 * p * v) for r, p in zip(results, points))


def test_the_last_forward_is_reused_by_its_key_while_graphs_are_recorded():
    from collections import Counter

    from gradtool.numerics.problem import graph_key

    g, x, v = _square_backward()
    g.calls = Counter(forward=0)
    g.recorded = {graph_key([x + 5]): _graph_at(x + 5)}  # elsewhere: the key path is taken
    _LoopedSquare.forwards = 0
    got = [g(x, k * v)[0] for k in (1, 2, 3)]
    # fresh, then fresh beside the first reuse (trusted: the same bits), then reused alone
    assert _LoopedSquare.forwards == 2 and g.trusted["again"] is True
    assert all(torch.allclose(r, 2 * x * k * v, rtol=1e-12, atol=0)
               for r, k in zip(got, (1, 2, 3)))
    g(x + 0.5, v)  # another point: a forward of its own
    assert _LoopedSquare.forwards == 3 and len(g.recorded) == 1


def test_graph_key_is_a_points_bits_whatever_its_layout():
    from gradtool.numerics.problem import graph_key

    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert graph_key([x.t()]) == graph_key([x.t().contiguous()])  # strides do not matter
    assert graph_key([x]) != graph_key([x.reshape(4, 3)])  # the shape does
    assert graph_key([x]) != graph_key([x.float().double()])  # nor rounding, nor dtype
    assert graph_key([x]) != graph_key([x.float()])
    assert graph_key([torch.tensor([0.0])]) != graph_key([torch.tensor([-0.0])])
    b = x.bfloat16()  # no numpy dtype: through uint8
    assert graph_key([b]) == graph_key([b.clone()]) != graph_key([2 * b])


def test_the_gradient_checks_forwards_are_recorded_only_within_a_byte_budget(monkeypatch):
    # each recorded forward of _LoopedSquare at (6,) holds 96 bytes of inputs and outputs:
    # under a 200-byte budget the sweep records 3, and double backward reuses all but the
    # first of them (which a fresh forward verifies)
    from gradtool.numerics import problem

    def forwards(checks):
        _LoopedSquare.forwards = 0
        gradtool.check(_LoopedSquare, ["(6,)"], mode="full", checks=checks)
        return _LoopedSquare.forwards - PROBE_FORWARDS

    alone = forwards(("gradient",)) + forwards(("double_backward",))
    monkeypatch.setattr(problem, "RECORDED_BYTES", 200)
    assert forwards(("gradient", "double_backward")) == alone - 1 - (3 - 1)


def _scaled(by_numpy: bool, counter: dict) -> type:
    """x * 3 with its backward counted per Python call; through numpy (no vmap) or torch."""

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            counter["backward"] = counter.get("backward", 0) + 1
            return torch.from_numpy(g.numpy() * 3) if by_numpy else g * 3

    return Scaled


def test_analytical_rows_are_one_batched_backward_where_backward_allows():
    """Full mode's rows, one per output element: a vmap-friendly backward runs once for a
    batch of them (the engine's is_grads_batched path); one through numpy falls back to a
    backward per row. Both count one evaluation per row. (VJPs detached inside the legacy
    vmap, which has no batching rule for detach, fell back to the loop for every target.)"""
    for by_numpy in (False, True):
        python: dict = {}
        report = gradtool.check(_scaled(by_numpy, python), ["6x4"], mode="full",
                                checks=("gradient",))
        check = next(c for _, _, c in report.checks())
        assert check.outcome.value == "passed"
        assert check.calls["backward"] >= 24  # every row counted, batched or not
        if by_numpy:
            assert python["backward"] >= 24
        else:
            assert python["backward"] <= 4, python  # the rows in one call (a failed try
            # would have made it 1 + 24)
