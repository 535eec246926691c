"""The drop-in's lean path (gradtool/dropin/lean.py): taken on a tiny clean pass, with fewer
evaluations than the pipeline; never where the pipeline must judge (a seeded bug, a random or
input-writing forward, a module); and its pass is exactly the pipeline's."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from torch.autograd import Function

import gradtool
from fixtures.bugs import Cube, CubeScaled
from gradtool.dropin import functions, lean
from test_dropin import FIXTURES

GradcheckError = sys.modules["torch.autograd.gradcheck"].GradcheckError
MODES = [pytest.param(True, id="fast"), pytest.param(False, id="full")]


class Counted(Cube):
    """Cube, counting its forwards and backwards."""

    calls = {"forward": 0, "backward": 0}

    @staticmethod
    def forward(ctx, x):
        Counted.calls["forward"] += 1
        return Cube.forward(ctx, x)

    @staticmethod
    def backward(ctx, grad):
        Counted.calls["backward"] += 1
        return Cube.backward(ctx, grad)


class RandomMask(Function):
    """x times a fresh random 0/1 mask (dropout-like); the wrong twin's backward is 1.5x."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @classmethod
    def backward(cls, ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask * cls.factor


class RandomMaskScaled(RandomMask):
    factor = 1.5


def _x(n=6):
    return torch.randn(n, dtype=torch.float64, requires_grad=True)


@pytest.fixture
def pipeline(monkeypatch):
    """The drop-in's calls of the pipeline (gradtool.check), counted."""
    entered = []
    judge = functions._judge

    def counted(*args, **kwargs):
        entered.append(args[0])
        return judge(*args, **kwargs)

    monkeypatch.setattr(functions, "_judge", counted)
    return entered


def _without_lean(monkeypatch, call):
    """call() with the lean path switched off: the pipeline's verdict (True, False, or the
    exception's type)."""
    with monkeypatch.context() as m:
        m.setattr(functions, "lean_pass", lambda *args: None)
        return _outcome(call)


def _outcome(call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the type is the verdict compared
        return type(exc)


@pytest.mark.parametrize("fast", MODES)
def test_a_tiny_clean_pass_skips_the_pipeline_with_few_evaluations(pipeline, fast):
    torch.manual_seed(0)
    x = _x(10)
    Counted.calls.update(forward=0, backward=0)
    assert gradtool.gradcheck(Counted.apply, (x,), fast_mode=fast) is True
    assert pipeline == []
    ours = dict(Counted.calls)
    Counted.calls.update(forward=0, backward=0)
    torch.autograd.gradcheck(Counted.apply, (x,), fast_mode=fast)
    # fast: the call, the purity forward, the probe's 2 forwards (its central difference agrees
    # with backward within atol: no third point), torch's undefined-grad test's; the probe's 2
    # VJPs, reentrancy's second, torch's 2 tests (undefined grad, multiplication by
    # grad_output). Torch's fast mode: 4 and 4. full: the Jacobian's 10 rows and its columns
    # (the diagonal pattern in few evaluations), far below torch's slow mode's 22/22.
    assert ours == ({"forward": 5, "backward": 5} if fast else {"forward": 7, "backward": 14})
    theirs = Counted.calls
    if fast:
        assert ours["forward"] <= theirs["forward"] + 1
        assert ours["backward"] <= theirs["backward"] + 1
    else:
        assert ours["forward"] < theirs["forward"] and ours["backward"] < theirs["backward"]


def test_the_batched_gradient_test_batches_the_probes_backwards(pipeline):
    # check_batched_grad (PyTorch's OpInfo tests ask it): vmap over backward at the probe's two
    # cotangents against the two backwards the probe made, where torch makes two more at its
    # own draws: 5 forwards and 6 backwards (the vmapped one counted once) against torch's 4
    # and 7
    torch.manual_seed(0)
    x = _x(10)
    counts = []
    for check in (gradtool.gradcheck, torch.autograd.gradcheck):
        Counted.calls.update(forward=0, backward=0)
        assert check(Counted.apply, (x,), check_batched_grad=True, check_grad_dtypes=True,
                     fast_mode=True) is True
        counts.append(dict(Counted.calls))
    assert pipeline == []
    assert counts == [{"forward": 5, "backward": 6}, {"forward": 4, "backward": 7}]


class SteepSine(Function):
    """sin(300 x), exact: its central difference's truncation error (~h^2 300^3 / 6 an element)
    is beyond the probe's atol allowance, well within its measured tolerance."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        SteepSine.calls += 1
        ctx.save_for_backward(x)
        return torch.sin(300 * x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 300 * torch.cos(300 * x)


class SteepSineScaled(SteepSine):
    """The same, its backward 1% too large."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 303 * torch.cos(300 * x)


def test_the_probes_third_point_runs_where_the_central_difference_alone_is_not_enough(
        pipeline):
    """The probe skips its third point (x + 2h u) only where the central difference at h agrees
    with backward within atol alone; otherwise it measures the error and judges as before."""
    torch.manual_seed(0)
    x = _x(10)
    SteepSine.calls = 0
    assert gradtool.gradcheck(SteepSine.apply, (x,), fast_mode=True) is True
    assert pipeline == [] and SteepSine.calls == 6  # the call, purity, 3 probe points, torch's
    with pytest.raises(GradcheckError):
        gradtool.gradcheck(SteepSineScaled.apply, (x,), fast_mode=True)
    assert len(pipeline) == 1


def test_with_several_probe_directions_each_is_judged_whole():
    """The two-point pass stands for the one direction it tests: with two (probes=8), both run
    all three points, the first direction's two reused."""
    torch.manual_seed(0)
    x = _x(6)
    settings = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3, "nondet_tol": 0.0, "masked": False,
                "mode": "probe", "module_parameters": False}
    for probes, forwards in ((4, 3), (8, 7)):  # purity, then 2 (or 2 + 1 + 3) probe points
        out = Counted.apply(x)
        Counted.calls.update(forward=0, backward=0)
        assert lean.passes(Counted.apply, (x,), out, {**settings, "probes": probes})
        assert Counted.calls["forward"] == forwards


@pytest.mark.parametrize("fast", MODES)
def test_a_seeded_bug_falls_back_to_the_pipelines_report(pipeline, fast):
    torch.manual_seed(0)
    with pytest.raises(GradcheckError) as caught:
        gradtool.gradcheck(CubeScaled.apply, (_x(),), fast_mode=fast)
    assert len(pipeline) == 1
    assert caught.value.report is not None and not caught.value.report.ok()
    assert "look at:" in str(caught.value) and "reproduce:" in str(caught.value)


@pytest.mark.parametrize("fast", MODES)
def test_a_random_forward_is_judged_by_the_pipeline_under_a_frozen_rng(pipeline, monkeypatch,
                                                                        fast):
    # The probe's tolerance comes from its own finite differences: a forward that changes
    # from call to call would widen it until the 1.5x backward passed.
    torch.manual_seed(0)
    x = _x()
    with pytest.raises(GradcheckError) as caught:
        gradtool.gradcheck(RandomMaskScaled.apply, (x,), fast_mode=fast)
    assert caught.value.report is not None and len(pipeline) == 1
    right = _outcome(lambda: gradtool.gradcheck(RandomMask.apply, (x,), fast_mode=fast))
    assert len(pipeline) == 2
    assert right == _without_lean(
        monkeypatch, lambda: gradtool.gradcheck(RandomMask.apply, (x,), fast_mode=fast))


def test_a_forward_that_draws_is_not_pure_even_when_two_draws_coincide():
    # Two 6-element masks coincide once in 64 pairs of calls: the draw itself is the fact.
    x = _x()
    for seed in range(10_000):
        torch.manual_seed(seed)
        if torch.equal(torch.rand_like(x) > 0.5, torch.rand_like(x) > 0.5):
            break
    torch.manual_seed(seed)
    out = RandomMask.apply(x)
    assert not lean._pure(RandomMask.apply, (x,), [out])
    assert lean._pure(Cube.apply, (x,), [Cube.apply(x)])


@pytest.mark.parametrize("fast", MODES)
def test_an_input_writing_forward_is_judged_by_the_pipeline(pipeline, monkeypatch, fast):
    def scaled_into(x, out):
        out.copy_(x * 3)  # writes its second argument
        return x * out

    torch.manual_seed(0)
    x = _x()

    def call():  # each call a fresh second argument, as the first call wrote the last one
        return gradtool.gradcheck(scaled_into, (x, torch.zeros(6, dtype=torch.float64)),
                                  fast_mode=fast)

    got = _outcome(call)
    assert len(pipeline) == 1
    assert got == _without_lean(monkeypatch, call)


class WritesItsWeight(torch.nn.Linear):
    """A linear layer whose forward nudges its own weight: no call is like the last."""

    def forward(self, x):
        with torch.no_grad():
            self.weight.mul_(1.001)
        return x @ self.weight.detach().t() + self.bias


class ScaledIdentity(Cube):
    """x, with a backward 1.5x too large."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.5


@pytest.mark.parametrize("fast", MODES)
def test_a_small_module_without_buffers_is_judged_lean(pipeline, fast):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()).double()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    assert gradtool.gradcheck(module, (_x(6).view(2, 3),), fast_mode=fast) is True
    assert pipeline == []
    assert all(torch.equal(v, state[k]) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())


@pytest.mark.parametrize("fast", MODES)
def test_modules_the_lean_path_cannot_vouch_for_go_to_the_pipeline(monkeypatch, pipeline, fast):
    torch.manual_seed(0)
    wrong = torch.nn.Sequential(torch.nn.Linear(3, 3).double(), _Applied(ScaledIdentity))
    batch_norm = torch.nn.BatchNorm1d(3).double()  # buffers: running statistics
    writes = WritesItsWeight(3, 2).double()
    for module in (wrong, batch_norm, writes):
        x = _x(6).view(2, 3)
        call = functools.partial(gradtool.gradcheck, module, (x,), fast_mode=fast,
                                 raise_exception=False)
        before = len(pipeline)
        got = _outcome(call)
        assert len(pipeline) > before, module
        assert got == _without_lean(monkeypatch, call)
    assert _outcome(functools.partial(gradtool.gradcheck, wrong, (_x(6).view(2, 3),),
                                      fast_mode=fast, raise_exception=False)) is False


class TiedWriter(torch.nn.Module):
    """Two layers sharing one weight; the second reaches it to nudge it (the first reads it)."""

    def __init__(self, writes):
        super().__init__()
        self.first = torch.nn.Linear(3, 3, bias=False)
        self.second = torch.nn.Linear(3, 3, bias=False)
        self.second.weight = self.first.weight
        self.writes = writes

    def forward(self, x):
        if self.writes:
            with torch.no_grad():
                self.second.weight.mul_(1.001)
        return self.first(x).tanh()


@pytest.mark.parametrize("fast", MODES)
def test_a_tied_weight_is_one_clone_in_the_purity_forward(pipeline, fast):
    """The purity forward swaps each parameter for a clone wherever it sits: a write through
    either name is seen, and the user's weight is never written by it."""
    torch.manual_seed(0)
    clean, writer = TiedWriter(False).double(), TiedWriter(True).double()
    weight = clean.first.weight.detach().clone()
    assert gradtool.gradcheck(clean, (_x(6).view(2, 3),), fast_mode=fast) is True
    assert pipeline == [] and torch.equal(clean.first.weight, weight)
    assert clean.first.weight is clean.second.weight
    weight = writer.first.weight.detach().clone()
    clones, _ = lean._on_clones(writer, (_x(6).view(2, 3),))
    assert len(clones) == 1 and not torch.equal(*clones[0])  # written: the clone, not the weight
    assert torch.equal(writer.first.weight, weight)
    assert writer.first.weight is writer.second.weight


class _Applied(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function.apply(x)


@pytest.mark.parametrize("fast", MODES)
@pytest.mark.parametrize("name", list(FIXTURES))
def test_the_lean_verdict_is_the_pipelines(name, fast):
    """Wherever the lean path judges a fixture, correct or seeded, it passes exactly what the
    pipeline's gradient check (with the drop-in's settings) passes."""
    func, make, _ = FIXTURES[name]
    torch.manual_seed(0)
    args = make()
    settings = functions._settings(args, 1e-6, 1e-5, 1e-3, 0.0, fast, None)
    out = func(*args)
    passed = lean.passes(func, args, out, settings)
    report = gradtool.check(func, args, checks=("gradient",), **settings)
    if not lean._plain_callable(func) or not all(
            t.dtype == torch.float64 for t in args if isinstance(t, torch.Tensor)):
        assert passed is None  # not the lean path's to judge
    else:
        assert (passed is not None) == report.ok(), report


def test_a_check_added_to_the_drop_ins_run_turns_the_lean_path_off(monkeypatch):
    torch.manual_seed(0)
    x = _x()
    settings = functions._settings((x,), 1e-6, 1e-5, 1e-3, 0.0, True, None)
    assert lean.passes(Cube.apply, (x,), Cube.apply(x), settings) is not None
    monkeypatch.setattr(lean, "GRADCHECK_BACKWARD", ("gradient", "contract"))
    lean._alone.cache_clear()
    try:
        assert lean.passes(Cube.apply, (x,), Cube.apply(x), settings) is None
    finally:
        monkeypatch.undo()
        lean._alone.cache_clear()


def _odd_calls():
    """(name, func, inputs maker): outputs that alias inputs or each other, views, scalars,
    non-contiguous, non-leaf and 0-d inputs, a forward computing in float32, a detached term."""
    def x():
        return torch.randn(3, 4, dtype=torch.float64, requires_grad=True)

    def twice(a):
        r = a * 2
        return r, r

    return [
        ("identity", lambda a: a, lambda: (x(),)),
        ("view", lambda a: a.view(12) * 2, lambda: (x(),)),
        ("transpose", lambda a: a.t(), lambda: (x(),)),
        ("one output twice", twice, lambda: (x(),)),
        ("0-d output", lambda a: (a ** 2).sum(), lambda: (x(),)),
        ("int argument", lambda a, k: a.pow(k), lambda: (x(), 3)),
        ("non-contiguous input", lambda a: a.exp(),
         lambda: (x().detach().t().requires_grad_(),)),
        ("non-leaf input", lambda a: a.sin(), lambda: (x() * 2,)),
        ("0-d input", lambda a: a * 3,
         lambda: (torch.tensor(2.0, dtype=torch.float64, requires_grad=True),)),
        ("float32 inside", lambda a: (a.float() ** 2).double(), lambda: (x(),)),
        ("detached term", lambda a: a.detach() * 2 + a, lambda: (x(),)),
        ("an index output beside", lambda a: (a.sin(), a.argmax()), lambda: (x(),)),
        ("an index output first", lambda a: (a.max(0)[1], a.max(0)[0]), lambda: (x(),)),
        ("empty input", lambda a: a.exp(),
         lambda: (torch.randn(0, 3, dtype=torch.float64, requires_grad=True),)),
        ("an empty output beside", lambda a: (a.sin(), a[:0] * 2), lambda: (x(),)),
        ("a float output not differentiated beside", lambda a: (a.sin(), a.detach().mean()),
         lambda: (x(),)),
        ("an empty input beside", lambda a, b: a.sin() + b.sum(),
         lambda: (x(), torch.randn(0, dtype=torch.float64, requires_grad=True))),
        ("integer values out", lambda a: a.floor() + a * 0, lambda: (x() * 4,)),
        ("halves out, float32 inside", lambda a: ((a * 2).float().round() / 2).double() + 0 * a,
         lambda: (x() * 4,)),
    ]


@pytest.mark.parametrize("fast", MODES)
@pytest.mark.parametrize("name, func, make", _odd_calls(), ids=[c[0] for c in _odd_calls()])
def test_odd_calls_get_the_pipelines_verdict(monkeypatch, name, func, make, fast):
    torch.manual_seed(0)
    args = make()

    def call():
        return gradtool.gradcheck(func, args, fast_mode=fast)

    assert _outcome(call) == _without_lean(monkeypatch, call)


@pytest.mark.parametrize("fast", MODES)
@pytest.mark.parametrize("name, func, make", _odd_calls(), ids=[c[0] for c in _odd_calls()])
def test_odd_calls_in_forward_mode_get_the_pipelines_verdict(monkeypatch, name, func, make,
                                                             fast):
    torch.manual_seed(0)
    args = make()

    def call():
        return gradtool.gradcheck(func, args, fast_mode=fast, check_forward_ad=True,
                                  check_backward_ad=False)

    with monkeypatch.context() as m:
        m.setattr(functions, "forward_passes", lambda *args: False)
        theirs = _outcome(call)
    assert _outcome(call) == theirs


class CountedJvp(Cube):
    """Cube with its jvp, counting forwards (dual ones included), backwards and jvps; the
    wrong twin's jvp is 1.5x."""

    calls = {"forward": 0, "backward": 0, "jvp": 0}
    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        CountedJvp.calls["forward"] += 1
        ctx.save_for_forward(x)
        return Cube.forward(ctx, x)

    @staticmethod
    def backward(ctx, grad):
        CountedJvp.calls["backward"] += 1
        return Cube.backward(ctx, grad)

    @classmethod
    def jvp(cls, ctx, dx):
        CountedJvp.calls["jvp"] += 1
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * dx * cls.factor


class CountedJvpScaled(CountedJvp):
    factor = 1.5


@pytest.mark.parametrize("fast", MODES)
def test_forward_mode_clean_pass_skips_the_pipeline(pipeline, fast):
    torch.manual_seed(0)
    x = _x(10)
    CountedJvp.calls.update(forward=0, backward=0, jvp=0)
    assert gradtool.gradcheck(CountedJvp.apply, (x,), fast_mode=fast, check_forward_ad=True,
                              check_backward_ad=False) is True
    assert pipeline == []
    ours = dict(CountedJvp.calls)
    # fast: the call, the purity forward, the screen's jvp (a dual forward) and its 2 points
    # (x + h u, x - h u: the third only where these disagree beyond atol), torch's
    # undefined-tangent test's 2 forwards (a zero tangent: a jvp, and none), forward against
    # backward's one VJP; torch's fast mode: 6 forwards, 2 jvps. Full: a jvp per column and the
    # columns' differences, as torch's slow mode (34 / 11 against 33 / 11)
    assert ours == ({"forward": 7, "backward": 1, "jvp": 2} if fast else
                    {"forward": 34, "backward": 1, "jvp": 11})


def test_the_batched_forward_test_batches_the_screens_jvp(pipeline):
    # check_batched_forward_grad (PyTorch's forward-mode tests ask it): vmap over jvp at the
    # screen's tangent and one drawn, against the screen's jvp and one more: 9 forwards and 4
    # jvps (one backward: forward against reverse mode) against torch's 9 and 5
    torch.manual_seed(0)
    x = _x(10)
    counts = []
    for check in (gradtool.gradcheck, torch.autograd.gradcheck):
        CountedJvp.calls.update(forward=0, backward=0, jvp=0)
        assert check(CountedJvp.apply, (x,), fast_mode=True, check_forward_ad=True,
                     check_backward_ad=False, check_batched_forward_grad=True) is True
        counts.append(dict(CountedJvp.calls))
    assert pipeline == []
    assert counts == [{"forward": 9, "backward": 1, "jvp": 4},
                      {"forward": 9, "backward": 0, "jvp": 5}]


def test_forward_modes_screen_hands_a_steep_call_to_the_engine(pipeline, monkeypatch):
    # sin(300 x): the central difference at h is beyond atol of the jvp, so the screen does
    # not pass it; forward_ad's engine (its third point, Richardson) does, without the pipeline
    from gradtool.numerics import forward

    torch.manual_seed(0)
    x = _x(6)
    engine = []
    judged = forward.forward_mode

    def counted(*args, **kwargs):
        engine.append(1)
        return judged(*args, **kwargs)

    monkeypatch.setattr(forward, "forward_mode", counted)
    steep = lambda a: (300 * a).sin()  # noqa: E731
    assert gradtool.gradcheck(steep, (x,), fast_mode=True, check_forward_ad=True,
                              check_backward_ad=False) is True
    assert engine == [1] and pipeline == []
    assert gradtool.gradcheck(lambda a: a.sin(), (x,), fast_mode=True, check_forward_ad=True,
                              check_backward_ad=False) is True
    assert engine == [1]  # a gentle call: the screen alone


@pytest.mark.parametrize("fast", MODES)
def test_a_wrong_jvp_falls_back_to_the_pipelines_report(pipeline, fast):
    torch.manual_seed(0)
    with pytest.raises(GradcheckError) as caught:
        gradtool.gradcheck(CountedJvpScaled.apply, (_x(),), fast_mode=fast,
                           check_forward_ad=True, check_backward_ad=False)
    assert len(pipeline) == 1
    assert caught.value.report is not None and not caught.value.report.ok()
    assert "jvp" in str(caught.value)


@pytest.mark.parametrize("fast", MODES)
def test_an_index_output_and_an_empty_call_are_judged_lean(pipeline, fast):
    torch.manual_seed(0)
    empty = torch.randn(0, 3, dtype=torch.float64, requires_grad=True)
    for func, args in ((lambda a: (a.sin(), a.argmax()), (_x(),)), (lambda a: a.exp(), (empty,))):
        assert gradtool.gradcheck(func, args, fast_mode=fast) is True
        assert gradtool.gradcheck(func, args, fast_mode=fast, check_forward_ad=True) is True
    assert pipeline == []


PASSING_CALLS = """
import sys, torch, gradtool
x = torch.randn(10, dtype=torch.float64, requires_grad=True)
f = lambda a: (a * a.sin()).cumsum(0)
keywords = dict(check_batched_grad=True, check_grad_dtypes=True, fast_mode=True)
assert gradtool.gradcheck(f, (x,), **keywords)
assert gradtool.gradgradcheck(f, (x,), **keywords)
assert gradtool.gradcheck(f, (x,), fast_mode=True, check_forward_ad=True, check_backward_ad=False,
                          check_batched_forward_grad=True)
print(" ".join(sorted(m for m in sys.modules if m.startswith("gradtool."))))
"""


def test_passing_calls_import_neither_the_engines_nor_the_pipeline():
    # A process's first call pays gradtool's imports (PyTorch's OpInfo harness has torch's own
    # warm): a passing fast call needs the lean path's modules alone
    import subprocess

    out = subprocess.run([sys.executable, "-c", PASSING_CALLS], capture_output=True, text=True,
                         check=True).stdout.split()
    for heavy in ("gradtool.numerics.jacobian", "gradtool.numerics.localise",
                  "gradtool.numerics.probe", "gradtool.numerics.forward", "gradtool.api",
                  "gradtool.run.runner", "gradtool.run.reproduce", "gradtool.targets.cases",
                  "gradtool.targets.probe", "gradtool.checks.gradient", "gradtool.dropin.saved"):
        assert heavy not in out, heavy
    assert "gradtool.dropin.lean" in out and "gradtool.numerics.draws" in out


def test_forward_modes_kept_draws_are_forward_ads_own_and_copies():
    from gradtool.dropin import lean_forward
    from gradtool.numerics.draws import direction

    x, out = _x(5), _x(3)
    lean_forward._DRAWN.clear()
    first = lean_forward._vectors(0, [x], [out])
    again = lean_forward._vectors(0, [x], [out])
    gen = torch.Generator().manual_seed(0 + lean_forward.DIRECTION_SEED)
    drawn = [direction(x, gen)], [direction(out, gen)]  # numerics/forward.py's order: u, then v
    for a, b, c in zip(first, again, drawn):
        assert torch.equal(a[0], c[0]) and torch.equal(b[0], c[0])
        a[0].zero_()  # the user's jvp may write its tangent: the kept draw stays
    assert torch.equal(lean_forward._vectors(0, [x], [out])[0][0], drawn[0][0])
    assert len(lean_forward._DRAWN) == 1


class _Registers(torch.nn.Module):
    """Built inside the checked function from its arguments: registers those given as
    nn.Parameters (xitorch's test modules), else keeps them as plain attributes."""

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        # a module reading its own parameters(): what torch's gradcheck shows it
        scale = sum(p.sum() for p in self.parameters()) if len(list(self.parameters())) else 1.0
        return self.a * x + self.b * scale


@pytest.mark.parametrize("fast", MODES)
def test_arguments_given_as_parameters_are_judged_lean_as_given(monkeypatch, pipeline, fast):
    """An nn.Parameter argument reaches the function as one in every evaluation (given.py),
    so the lean path judges the call (xitorch's suites pass their tensors so): the same
    verdict as the pipeline's, a wrong one still fails."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.rand(3, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    x = _x(3)

    seen = set()

    def fn(a, b, x):
        seen.update((type(a), type(b)))
        return _Registers(a, b)(x)

    assert gradtool.gradcheck(fn, (a, b, x), fast_mode=fast) is True
    assert pipeline == [] and seen == {torch.nn.Parameter}
    assert gradtool.gradgradcheck(fn, (a, b, x), fast_mode=fast) is True
    assert pipeline == []
    call = functools.partial(gradtool.gradcheck, lambda a, b, x: _Applied(ScaledIdentity)(
        fn(a, b, x)), (a, b, x), fast_mode=fast, raise_exception=False)
    assert _outcome(call) is False and len(pipeline) == 1
    assert _without_lean(monkeypatch, call) is False
    assert torch.autograd.gradcheck(fn, (a, b, x), fast_mode=fast)
