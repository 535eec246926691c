"""Probe mode: detection over many seeds, no false failures, and localisation to elements."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.autograd import Function

import gradtool
from gradtool.targets.cases import build_case
from gradtool.checks.double_backward import backward_problem
from gradtool.config.settings import CheckConfig
from gradtool.targets.inputs import parse_input
from gradtool.numerics.jacobian import prime
from gradtool.numerics.probe import check_probe, screen
from gradtool.targets.resolve import make_target

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import bugs  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"
SEEDS = range(100)


def _example(file: str, name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"_probe_{file}", EXAMPLES / f"{file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def flagged(target_obj: object, inputs: list[str], seed: int, double: bool = False) -> bool:
    """Whether probe screening (the fixed-cost part of probe mode) fails anywhere."""
    config = CheckConfig(mode="probe", checks=("gradient",), seed=seed)
    target = make_target(target_obj, getattr(target_obj, "__name__", "fn"))
    case = build_case(target, [parse_input(s) for s in inputs], config, seed)
    problem = backward_problem(case.problem, seed) if double else case.problem
    leaves, outs = prime(problem)
    return bool(screen(problem, config, leaves, outs, seed)[1])


@pytest.mark.parametrize("n", [10_000, 100_000])
@pytest.mark.parametrize("cls", [bugs.CubeOneElement, bugs.CubeScaled])
def test_probe_catches_one_wrong_element_and_a_small_scale_in_99_percent_of_seeds(cls, n):
    caught = sum(flagged(cls, [f"({n},)"], seed) for seed in SEEDS)
    assert caught >= 99, f"{cls.__name__} at {n}: caught in {caught} / 100 seeds"


def _builtins() -> list[tuple[str, object, list[str]]]:
    return [
        ("sin", torch.sin, ["(200,)"]),
        ("sin 1e4", torch.sin, ["(10000,)"]),
        ("exp", torch.exp, ["(50,)"]),
        ("log on positive", torch.log, ["(300,):positive"]),
        ("softmax", lambda x: torch.softmax(x, dim=-1), ["8x10"]),
        ("matmul", lambda a, b: a @ b, ["6x5", "5x7"]),
        ("cumsum", lambda x: torch.cumsum(x, 0), ["(60,)"]),
        ("tanh", torch.tanh, ["4x25"]),
        ("sum of squares", lambda x: (x * x).sum(), ["(1000,)"]),
    ]


def _examples() -> list[tuple[str, object, list[str]]]:
    return [
        ("MyCube", _example("cube", "MyCube"), ["(30,)"]),
        ("LegendrePolynomial3", _example("legendre", "LegendrePolynomial3"), ["3x7"]),
        ("LinearFunction", _example("linear", "LinearFunction"), ["5x4", "3x4", "(3,)"]),
        ("LinearFunctionSetup", _example("linear", "LinearFunctionSetup"),
         ["5x4", "3x4", "(3,)"]),
        ("MulConstant", _example("mul_constant", "MulConstant"), ["3x3", "5"]),
        ("F", _example("elementwise", "F"), ["(10,)", "(10,)"]),
        ("Linear 64", bugs.Linear, ["64x64", "64x64", "(64,)"]),
    ]


@pytest.mark.parametrize("name, fn, inputs", _builtins() + _examples(),
                         ids=[t[0] for t in _builtins() + _examples()])
def test_no_false_failure_on_correct_functions_over_100_seeds(name, fn, inputs):
    bad = [seed for seed in SEEDS if flagged(fn, inputs, seed)]
    assert not bad, f"{name}: probe fails on correct gradients for seeds {bad[:10]}"


@pytest.mark.parametrize("name, fn, inputs", [
    ("sin", torch.sin, ["(200,)"]),
    ("MyCube", _example("cube", "MyCube"), ["(30,)"]),
    ("LegendrePolynomial3", _example("legendre", "LegendrePolynomial3"), ["3x7"]),
    ("LinearFunction", _example("linear", "LinearFunction"), ["5x4", "3x4", "(3,)"]),
], ids=["sin", "MyCube", "LegendrePolynomial3", "LinearFunction"])
def test_no_false_failure_of_double_backward_over_100_seeds(name, fn, inputs):
    bad = [seed for seed in SEEDS if flagged(fn, inputs, seed, double=True)]
    assert not bad, f"{name}: double-backward probe fails for seeds {bad[:10]}"


def _probe(cls: type, inputs: list[str], seed: int = 0):
    report = gradtool.check(cls, inputs, mode="probe", checks=("gradient",), seed=seed)
    return next(c for _, _, c in report.checks())


def test_localisation_names_the_single_wrong_element_and_its_values():
    check = _probe(bugs.LinearOneElement, ["20x20", "30x20", "(30,)"])
    assert check.outcome.value == "failed" and check.mode == "probe"
    (block,) = [b for b in check.blocks if b.mismatched]
    config = CheckConfig(checks=("gradient",))
    target = make_target(bugs.LinearOneElement, "bugs:LinearOneElement")
    x = build_case(target, [parse_input(s) for s in ["20x20", "30x20", "(30,)"]], config,
                   0).problem.args[0]
    n, i = divmod(bugs._bad_index(x), 20)
    assert block.input == "weight" and not block.exhaustive
    (element,) = block.worst
    assert (element.input_index, element.output_index) == ((0, i), (n, 0))
    assert element.analytical == pytest.approx(1.01 * float(x[n, i]), rel=1e-9)
    assert element.numerical == pytest.approx(float(x[n, i]), rel=1e-6)


def test_localisation_at_100k_elements_finds_the_index():
    check = _probe(bugs.CubeOneElement, ["(100000,)"], seed=3)
    (block,) = check.blocks
    element = block.worst[0]
    config = CheckConfig(checks=("gradient",))
    target = make_target(bugs.CubeOneElement, "bugs:CubeOneElement")
    x = build_case(target, [parse_input("(100000,)")], config, 3).problem.args[0]
    k = bugs._bad_index(x)
    assert element.input_index == (k,) and element.output_index == (k,)
    assert element.analytical == pytest.approx(1.01 * element.numerical, rel=1e-6)


class TwoByTwo(Function):
    """(x * y, x + y) with one wrong block: d(x * y)/dy is scaled by 1.5."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x + y

    @staticmethod
    def backward(ctx, g_prod, g_sum):
        x, y = ctx.saved_tensors
        return g_prod * y + g_sum, 1.5 * g_prod * x + g_sum


def test_a_probe_failure_is_reported_on_its_own_block_only():
    check = _probe(TwoByTwo, ["(50,)", "(50,)"])
    bad = [(b.input, b.output) for b in check.blocks if b.mismatched]
    assert bad == [("y", "output 0")]
    assert len(check.blocks) == 4


def test_double_backward_probe_catches_a_detached_backward():
    for cls, inputs in ((bugs.CubeDetached, ["(1000,)"]),
                        (bugs.LinearDetached, ["20x20", "30x20", "(30,)"])):
        for seed in range(10):
            report = gradtool.check(cls, inputs, mode="probe", checks=("double_backward",),
                                    seed=seed)
            check = next(c for _, _, c in report.checks())
            assert check.outcome.value == "failed", (cls.__name__, seed)


def test_check_probe_agrees_with_screen_on_a_correct_function():
    config = CheckConfig(mode="probe", checks=("gradient",))
    target = make_target(bugs.Linear, "bugs:Linear")
    case = build_case(target, [parse_input(s) for s in ["7x3", "4x3", "(4,)"]], config, 0)
    leaves, outs = prime(case.problem)
    verdict = check_probe(case.problem, config, leaves, outs, None, "test", 0)
    assert verdict.outcome.value == "passed" and verdict.mode == "probe"
    assert all(b.checked == 2 and not b.exhaustive for b in verdict.blocks)


def test_probe_vectors_are_kept_per_draw_and_handed_out_as_copies():
    """A suite's repeated tiny calls reuse the seeded draw (the same u and v, no generator run),
    and user code writing a v it received as grad_output cannot change the next call's."""
    import types

    from gradtool.numerics import probe

    problem = types.SimpleNamespace(inputs=[torch.zeros(3, 4, dtype=torch.float64),
                                            torch.zeros(5, dtype=torch.float64)])
    outs, config = [torch.zeros(7, dtype=torch.float64)], CheckConfig()
    probe._DRAWN.clear()
    u, v = probe.probe_vectors(problem, outs, config, 5)
    expected_u, expected_v = [t.clone() for t in u[0]], v.clone()
    assert len(probe._DRAWN) == 1
    v.zero_()
    u[0][0].zero_()
    drawn = []
    real = torch.Generator
    try:
        torch.Generator = lambda *a: drawn.append(a) or real(*a)  # counts generator runs
        again_u, again_v = probe.probe_vectors(problem, outs, config, 5)
    finally:
        torch.Generator = real
    assert not drawn and len(probe._DRAWN) == 1
    assert torch.equal(again_v, expected_v)
    assert all(torch.equal(a, b) for a, b in zip(again_u[0], expected_u))
    assert all((t.abs() >= 1).all() and (t.abs() < 2).all() for t in [again_v, *again_u[0]])
    # another seed is another draw
    other_u, _ = probe.probe_vectors(problem, outs, config, 6)
    assert not torch.equal(other_u[0][0], expected_u[0]) and len(probe._DRAWN) == 2


def test_probe_tests_on_cpu_arrays_judge_as_on_tensors():
    """The probe tests read CPU tensors through numpy (cheaper for tiny problems): the same
    verdicts as torch's arithmetic on them, NaN and inf failing, and no numpy warning."""
    import warnings

    import numpy as np

    from gradtool.numerics import localise

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32, torch.float16):
        v, g = (torch.randn(2, 10, generator=gen).to(dtype) for _ in range(2))
        d = torch.randn(2, 1, 10, generator=gen).to(dtype)
        d[1] = d[0] * (1 - 1e-3)  # a measured error, so the tolerance is not all floor
        f0, u = torch.randn(10, generator=gen).to(dtype), torch.randn(1, 10, generator=gen).to(dtype)
        for bad in (None, float("nan"), float("inf")):
            if bad is not None:
                d[:, 0, 3] = bad
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                arrays = localise.Tests(v, d, f0, g, u, 1e-3, 1e-7, 1e-5, (1e-5, 1e-3))
            kept, localise.NUMPY_DTYPES = localise.NUMPY_DTYPES, ()
            try:
                tensors = localise.Tests(v, d, f0, g, u, 1e-3, 1e-7, 1e-5, (1e-5, 1e-3))
            finally:
                localise.NUMPY_DTYPES = kept
            assert (arrays.fails == tensors.fails).all()
            assert (arrays.noisy == tensors.noisy).all()
            assert bad is None or arrays.fails.all()
            np.testing.assert_allclose(arrays.tolerance, tensors.tolerance, rtol=1e-2)
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float64
               for x in (arrays.analytical, arrays.numerical, arrays.tolerance))


def _tanh_backward(x, g):
    """What a float32 tanh kernel's backward computes (float64 in, float32 inside): its values
    carry float32's noise, yet they are no float32 numbers (g is float64)."""
    t = torch.tanh(x.float()).double()
    return g * (1 - t * t)


def _tanh_backward_detached(x, g):
    """The same with tanh detached: its derivative in x is missing (-2 t (1 - t^2) g)."""
    t = torch.tanh(x.float()).double().detach()
    return g * (1 - t * t)


def test_a_probe_whose_measured_error_exceeds_what_it_tests_turns_to_full_mode():
    """The probe's tolerance grows with the finite differences' measured error: beyond the fixed
    tolerance of the directional derivative it tests, it passed a missing second-order term
    (the lean drop-in's and the pipeline's probe alike). Such a probe cannot pass: full mode
    judges, and both functions get full mode's verdicts."""
    gen = torch.Generator().manual_seed(1)
    x, g = (torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(2))
    fixed = {"atol": 1e-5, "rtol": 1e-3, "checks": ("gradient",)}
    verdicts = {}
    for fn in (_tanh_backward, _tanh_backward_detached):
        full, probe = (next(c for _, _, c in gradtool.check(fn, (x, g), mode=mode,
                                                            **fixed).checks())
                       for mode in ("full", "probe"))
        assert probe.mode == "full" and "beyond the fixed tolerance" in probe.mode_reason
        assert probe.outcome == full.outcome
        verdicts[fn] = probe
    wrong = verdicts[_tanh_backward_detached]
    assert wrong.outcome.value == "failed"
    assert "gradient.zero" in {f.rule for f in wrong.findings}
    # the exact twin's finite differences are float32's noise: unreliable, never a failure
    assert verdicts[_tanh_backward].outcome.value == "inconclusive"


def test_a_noisy_probe_over_full_modes_budget_is_inconclusive_never_a_pass():
    """Where auto mode probed because full mode is over budget (here a zero budget), a probe
    that cannot pass is inconclusive, saying how to judge it: never a pass, never full mode's
    unbounded sweep."""
    gen = torch.Generator().manual_seed(1)
    x, g = (torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(2))
    report = gradtool.check(_tanh_backward_detached, (x, g), mode="auto", full_budget_s=0,
                            atol=1e-5, rtol=1e-3, checks=("gradient",))
    check = next(c for _, _, c in report.checks())
    assert check.outcome.value == "inconclusive" and check.mode == "probe"
    assert "too noisy" in check.summary
    assert any("--mode full" in d for d in check.details)


class _NoisyColumn(Function):
    """3x plus a term of one column that oscillates at 1e6 (finite differences there are
    noise), its derivative in backward exact; `bug` added to one element of the gradient."""

    bug = 0.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 3 * x + torch.zeros_like(x).index_fill(1, torch.tensor([0]), 1e-4) * torch.sin(
            x[:, :1] / 1e-6)

    @classmethod
    def backward(cls, ctx, g):
        (x,) = ctx.saved_tensors
        r = 3 * g
        r[:, :1] += g[:, :1] * 1e2 * torch.cos(x[:, :1] / 1e-6)
        r[0, 5] += cls.bug * g[0, 5]
        return r


class _NoisyColumnWrong(_NoisyColumn):
    bug = 1e4


def test_an_unjudgeable_noisy_probe_leaves_the_drop_ins_fast_verdict_to_torchs_test(
        monkeypatch):
    """Over full mode's budget a noisy probe is inconclusive in either twin (its failing tests
    are no sounder than its passing ones: float32 noise can exceed the measured error); the
    drop-in's fast mode returned True on the bug torch's fast gradcheck catches. Torch's own
    fast test decides there now, and the report says gradtool could not judge."""
    from gradtool.dropin.functions import GradcheckFailure
    from gradtool.numerics import probe as probe_module

    monkeypatch.setattr(probe_module, "choose_mode", lambda *a: ("probe", "over budget"))
    x = torch.rand(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                   requires_grad=True)
    for cls in (_NoisyColumn, _NoisyColumnWrong):
        report = gradtool.check(cls, (x,), mode="probe", checks=("gradient",))
        assert next(c for _, _, c in report.checks()).outcome.value == "inconclusive"
    assert gradtool.gradcheck(_NoisyColumn.apply, (x,), fast_mode=True) is True
    with pytest.raises(GradcheckFailure, match="probe could not judge this call"):
        gradtool.gradcheck(_NoisyColumnWrong.apply, (x,), fast_mode=True)


class _NoisyTanh(Function):
    """w tanh(x) with tanh computed in float32 (values with float32's noise, yet no float32
    numbers), its jvp and backward exact to float32."""

    factor = 1.0

    @staticmethod
    def forward(x, w):
        return w * torch.tanh(x.float()).double()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @classmethod
    def _slope(cls, x):
        return cls.factor * (1 - torch.tanh(x.float()).double() ** 2)

    @classmethod
    def backward(cls, ctx, g):
        x, w = ctx.saved_tensors
        return g * w * cls._slope(x), g * torch.tanh(x.float()).double()

    @classmethod
    def jvp(cls, ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx * w * cls._slope(x) + tw * torch.tanh(x.float()).double()


class _NoisyTanhScaled(_NoisyTanh):
    """Its jvp and backward half as large on x, alike (forward and reverse mode agree)."""

    factor = 0.5


def test_a_noisy_forward_mode_probe_gets_full_modes_verdict():
    """The forward-mode probe's per-element tolerance grows with the measured error too: beyond
    the fixed tolerance it passed or failed on noise (a correct jvp failed at these seeds by
    bisecting noise). Every column is compared instead: full mode's verdict, both ways."""
    for cls, expected in ((_NoisyTanh, "inconclusive"), (_NoisyTanhScaled, "failed")):
        for seed in range(3):
            probe, full = (next(c for _, _, c in gradtool.check(
                cls, ["5:float64", "5:float64"], mode=mode, checks=("forward_ad",), seed=seed,
                atol=1e-5, rtol=1e-3).checks()) for mode in ("probe", "full"))
            assert probe.outcome.value == full.outcome.value == expected, (cls, seed)
            assert "it could pass a wrong jvp" in probe.mode_reason
