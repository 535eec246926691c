"""The probe phase: a case's facts are learnt once, before any check, and every check reads them."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

import gradtool
from conftest import load_fixture, outcomes
from gradtool.config.settings import CheckConfig
from gradtool.targets.cases import build_case
from gradtool.targets.inputs import parse_input
from gradtool.targets.resolve import make_target
from gradtool.targets.probe import probe


@pytest.fixture
def probe_cases():
    return load_fixture("probe_cases")


def probed(obj, inputs, seed=0):
    config = CheckConfig(seed=seed)
    target = make_target(obj, f"test:{getattr(obj, '__qualname__', 'fn')}")
    case = build_case(target, [parse_input(i) for i in inputs], config, seed)
    facts = probe(case)
    return case, facts


@pytest.mark.parametrize("name, expected", [("InvertedDropout", "passed"),
                                            ("InvertedDropoutNoScale", "failed")])
def test_a_check_run_alone_sees_the_facts_a_full_run_sees(probe_cases, name, expected):
    # The bug: alone, the gradient check never learnt forward is stochastic (the contract
    # check did), so the broken twin was inconclusive and exited 0.
    cls = getattr(probe_cases, name)
    for seed in range(20):
        alone = outcomes(gradtool.check(cls, ["3x4"], checks=("gradient",), seed=seed))
        full = outcomes(gradtool.check(cls, ["3x4"], seed=seed))
        assert alone["gradient"] == full["gradient"] == expected, (seed, alone, full)


def test_stochastic_forward_is_learnt_and_the_rng_frozen(probe_cases):
    case, facts = probed(probe_cases.InvertedDropout, ["3x4"], seed=7)
    assert facts.learnt and facts.stochastic and facts.seed == 7
    first = case.problem.outputs(case.problem.inputs)[0]
    again = case.problem.outputs(case.problem.inputs)[0]
    assert torch.equal(first, again)
    # purity forward (it drew from the RNG), graph forward again under the frozen RNG
    assert case.problem.calls["forward"] == 5


def _coinciding_seed(shape: tuple[int, ...]) -> int:
    """A seed of torch's RNG after which two dropout masks drawn in turn are the same."""
    for seed in range(100_000):
        torch.manual_seed(seed)
        first, second = (torch.rand(shape, dtype=torch.float64) > 0.5 for _ in range(2))
        if torch.equal(first, second):
            return seed
    raise AssertionError("no coinciding seed")


@pytest.mark.parametrize("name, expected", [("InvertedDropout", "passed"),
                                            ("InvertedDropoutNoScale", "failed")])
def test_a_forward_that_draws_is_stochastic_even_when_two_draws_coincide(probe_cases, name,
                                                                       expected):
    # The bug (found as an order-dependent failure of the suite): the probe told randomness
    # only by two forwards' outputs differing; a 3x4 dropout's two masks coincide once in
    # 4096 pairs, and the RNG then stayed unfrozen: the correct dropout was inconclusive and
    # failed double backward. A forward that draws from torch's RNG is stochastic.
    torch.manual_seed(_coinciding_seed((3, 4)))  # the probe's forwards draw first
    report = gradtool.check(getattr(probe_cases, name), ["3x4"], seed=13)
    assert outcomes(report) == {"contract": "passed", "gradient": expected,
                                "double_backward": "passed", "layout": "passed"}
    assert "forward is stochastic" in report.text()


def _mode_kernels(x):
    """Deterministic, but another kernel without a graph than with one (torch's nuclear norm:
    svdvals, then svd): the results differ in the last bit."""
    return 3 * x if torch.is_grad_enabled() else 3 * x * (1 + 2 ** -52)


def test_a_forward_whose_kernels_follow_grad_mode_is_not_stochastic():
    case, facts = probed(_mode_kernels, ["3x4"])
    assert facts.learnt and not facts.stochastic and facts.seed is None
    assert case.problem.calls["forward"] == 3  # one more graph forward told them apart


def test_a_deterministic_forward_costs_the_probe_two_forwards(contract_cases):
    case, facts = probed(contract_cases.Square, ["3x4"])
    assert facts.learnt and not facts.stochastic and not facts.mutates
    assert dict(case.problem.calls) == {"forward": 2}
    assert facts.output_names == ("output",) and facts.output_mask == (True,)
    assert facts.precision == "float64" and facts.complex is False
    assert facts.has_functions  # a Function target: its own node is a custom one


def test_forward_writing_its_input_is_learnt_with_the_rule_it_breaks(contract_cases):
    _, marked = probed(contract_cases.ExpInplace, ["3x4"])
    assert marked.mutates and marked.findings == ()
    _, unmarked = probed(contract_cases.ExpInplaceUndeclared, ["3x4"])
    assert unmarked.mutates
    assert [f.rule for f in unmarked.findings] == ["contract.unmarked_inplace"]


def test_outputs_left_out_and_custom_functions_inside_are_facts(contract_cases, probe_cases):
    _, stat = probed(contract_cases.SquareWithStat, ["3x4"])
    assert stat.output_mask == (True, False) and stat.left_out == ("output 1",)
    _, model = probed(probe_cases.BatchedWeightsModel, ["5x4"])
    assert model.has_functions
    _, plain = probed(lambda x: x.sin(), ["3x4"])
    assert not plain.has_functions


def test_a_custom_ops_generated_function_is_not_the_users_but_a_checkpoint_may_hold_them(
        probe_cases):
    # torch.library's generated autograd Function runs its implementation below autograd: no
    # Function of the user's can sit inside it, so nothing is recorded or re-checked for it
    ops = load_fixture("custom_ops")
    _, op = probed(lambda x, y: ops.scale_mul(x, y), ["3x4", "3x4"])
    assert not op.has_functions
    from torch.utils.checkpoint import checkpoint

    _, inside = probed(lambda x: checkpoint(probe_cases.BatchedWeightsModel(), x,
                                            use_reentrant=True), ["5x4"])
    assert inside.has_functions  # reentrant checkpointing applies the user's in backward


def test_precision_and_complex_are_facts():
    _, low = probed(lambda x: x.float().sin(), ["3x4"])
    assert low.precision == "float32"
    _, cplx = probed(lambda x: torch.polar(x.abs() + 1, x), ["3x4"])
    assert cplx.complex is True


def test_the_facts_are_frozen(contract_cases):
    import dataclasses

    _, facts = probed(contract_cases.Square, ["3x4"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.mutates = True  # type: ignore[misc]


def test_a_forward_that_raises_is_reported_by_the_checks_not_the_probe(contract_cases):
    report = gradtool.check(contract_cases.SquareRaises, ["3x4"])
    assert outcomes(report)["contract"] == "error"


def test_the_contract_check_reuses_the_probe_forwards(contract_cases):
    # contract alone made 4 forwards (purity, two to detect randomness, one with a graph); the
    # probe makes 2 and hands its graph forward to the contract check
    report = gradtool.check(contract_cases.Square, ["3x4"], checks=("contract",))
    check = next(c for _, _, c in report.checks())
    assert check.outcome.value == "passed" and "forward" not in check.calls


@pytest.mark.parametrize("checks", [("gradient",), ("contract", "gradient")])
def test_the_probe_costs_two_forwards_and_its_graph_forward_is_reused(checks):
    # Counted at the Function itself: every forward of the run is the checks' own (as each
    # reports) plus the probe's two, one of which a check reuses instead of running its own.
    from collections import Counter

    bugs = load_fixture("bugs")
    counter: Counter = Counter()

    class Counted(bugs.Cube):
        @staticmethod
        def forward(ctx, x):
            counter["forward"] += 1
            return bugs.Cube.forward(ctx, x)

    report = gradtool.check(Counted, ["(10,)"], checks=checks, mode="probe")
    assert all(c.outcome.value == "passed" for _, _, c in report.checks())
    per_check = sum(c.calls.get("forward", 0) for _, _, c in report.checks())
    assert counter["forward"] == per_check + 2
    first = next(c for _, _, c in report.checks())
    assert first.calls.get("forward", 0) == (0 if first.name == "contract" else 3)


def test_a_forward_writing_its_input_passes_every_check_alone(contract_cases):
    # Before the probe phase, only the contract check learnt that a mark_dirty Function needs
    # copies of its inputs: the gradient check alone raised in forward (an error outcome).
    for check in ("gradient", "double_backward"):
        report = gradtool.check(contract_cases.ExpInplace, ["3x4"], checks=(check,))
        assert outcomes(report) == {check: "passed"}


class _ContiguousOnly(Function):
    """2x, its backward wrong (3x) for a non-contiguous input: a layout bug."""

    @staticmethod
    def forward(ctx, x):
        ctx.contiguous = x.is_contiguous()
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (2 if ctx.contiguous else 3)


def _unused_draw(x):
    torch.rand(1)  # a draw the output does not follow
    return _ContiguousOnly.apply(x)


def _seeds_itself(x):
    torch.manual_seed(0)
    return _ContiguousOnly.apply(x)


@pytest.mark.parametrize("fn", [_unused_draw, _seeds_itself])
def test_a_forward_that_draws_without_following_the_draws_is_not_stochastic(fn):
    # Review of the draw test above: such forwards were taken for stochastic, and the layout
    # check, which tries no input layout on a stochastic forward, passed their layout bug.
    report = gradtool.check(fn, ["4x5"])
    assert outcomes(report)["layout"] == "failed"
    assert "forward is stochastic" not in report.text()
