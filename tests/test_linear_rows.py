"""The contract's linearity test read from the gradient check's rows (checks/linear_rows.py):
two backwards fewer a case, nonlinear backwards still caught, the same verdicts as the
contract's own test, and, on an expensive target whose gradient check failed without rows,
the test cut and said so (--exhaustive keeps it)."""

from __future__ import annotations

import time

import torch
from conftest import load_fixture, result

import gradtool
from gradtool.numerics.ledger import SWITCH


class Double(torch.autograd.Function):
    """y = 2x, correct."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class DoubleGAbsG(Double):
    """backward uses grad_output nonlinearly (2·g·|g|): right at every one-hot grad_output, so
    the gradient check passes; only the linearity test sees it."""

    @staticmethod
    def backward(ctx, g):
        return 2 * g * g.abs()


def _rules(report, name: str) -> set[str]:
    return {f.rule for f in result(report, name).findings}


def test_a_nonlinear_backward_is_caught_from_the_rows_with_two_backwards_fewer(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    shared = gradtool.check(DoubleGAbsG, ["3x4"], mode="full")
    monkeypatch.setenv(SWITCH, "0")
    alone = gradtool.check(DoubleGAbsG, ["3x4"], mode="full")
    for report in (shared, alone):
        assert result(report, "gradient").outcome.value == "passed"
        assert result(report, "contract").outcome.value == "failed"
        assert _rules(report, "contract") == {"contract.nonlinear"}
    contract, paid = result(shared, "contract"), result(alone, "contract")
    assert "gradient check's rows" in contract.summary
    assert contract.calls["backward"] == paid.calls["backward"] - 2
    assert contract.calls["backward read"] == 2
    assert contract.source  # backward's line, as the contract's own test names it


def test_correct_and_constant_term_backwards_keep_their_rules(monkeypatch):
    """A constant term, small (told by the zero test only) or the whole gradient (backward
    ignoring grad_output: nonlinear too), is judged as the contract's own test judged it."""
    fx = load_fixture("contract_cases")
    for cls, shape, rules in ((Double, "3x4", set()),
                              (fx.SquareAddsConstant, "5x5", {"contract.constant_term"}),
                              (fx.SquareIgnoresGradOutput, "3x4",
                               {"contract.constant_term", "contract.nonlinear"})):
        for switch in ("1", "0"):
            monkeypatch.setenv(SWITCH, switch)
            report = gradtool.check(cls, [shape], mode="full")
            assert _rules(report, "contract") == rules, (cls.__name__, switch)


def test_without_rows_the_contract_pays_its_own_test():
    """Probe mode computes no Jacobian: the test runs through the contract's graph then."""
    probed = gradtool.check(DoubleGAbsG, ["3x4"], mode="probe")
    contract = result(probed, "contract")
    assert "contract.nonlinear" in _rules(probed, "contract")
    assert "backward read" not in contract.calls
    assert contract.calls["backward"] == 6  # as before the rows: its two backwards paid


class _SlowWrong(torch.autograd.Function):
    """x * 2 with a 12 ms forward (the probe times it: an expensive target once the cost
    model's threshold is 10 ms, as below), backward 3·g."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(0.012)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return 3 * g


class _SlowRight(_SlowWrong):
    @staticmethod
    def backward(ctx, g):
        return 2 * g


def test_an_expensive_target_whose_gradient_failed_cuts_the_test_and_says_so(monkeypatch):
    monkeypatch.setattr("gradtool.run.runner.EXPENSIVE_S", 0.01)  # 0.1 s: ten times the wait
    cut = gradtool.check(_SlowWrong, ["(3,)"], mode="probe")
    whole = gradtool.check(_SlowWrong, ["(3,)"], mode="probe", exhaustive=True)
    assert result(cut, "gradient").outcome.value == "failed"
    said = [d for d in result(cut, "contract").details if d.startswith("not checked: linearity")]
    assert said and "--exhaustive" in said[0]
    assert result(cut, "contract").calls["backward"] == \
        result(whole, "contract").calls["backward"] - 2
    assert not any(d.startswith("not checked") for d in result(whole, "contract").details)
    # a passing gradient check cuts nothing (the run's exit code may hang on the contract)
    right = gradtool.check(_SlowRight, ["(3,)"], mode="probe")
    assert result(right, "contract").calls["backward"] == \
        result(whole, "contract").calls["backward"]


class _CheapWrong(Double):
    @staticmethod
    def backward(ctx, g):
        return 3 * g


def test_a_cheap_failing_target_is_never_cut():
    report = gradtool.check(_CheapWrong, ["3x4"], mode="probe")
    assert result(report, "gradient").outcome.value == "failed"
    contract = result(report, "contract")
    assert not any(d.startswith("not checked") for d in contract.details)
    assert contract.calls["backward"] == 6


def test_opinfo_samples_keep_the_contract_s_verdicts_with_the_rows(monkeypatch):
    """PyTorch's OpInfo ops (every 40th), each wrapped in a Function whose backward is the op's
    VJP — as is, with a constant added, ×1.01 on one input (benchmarks/mutants.py) —: the
    contract's verdict and rule ids read from the rows are those of its own two backwards.
    (All 1317 such cases: the same, 1138 of them read from the rows; benchmarks/README.md.)"""
    import sys
    from pathlib import Path

    import pytest

    import opinfo_ops as oo

    if oo.unavailable():
        pytest.skip(oo.unavailable())
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from mutants import CONSTANT, SCALE, kept, wrap

    read = 0
    for name in sorted(oo.autograd_ops())[::40]:
        op = oo.autograd_ops()[name]
        if oo.declared(op).gradient != "run":
            continue
        _, fn, values = oo.samples(op)[0]
        if oo.is_sparse(values):
            continue
        for mutation in (None, (CONSTANT, 0), (SCALE, 0)):
            cls = wrap(fn, values, mutation)
            if cls is None or (mutation and not kept(fn, values, *mutation)):
                continue
            seen = []
            for switch in ("1", "0"):
                monkeypatch.setenv(SWITCH, switch)
                report = gradtool.check(cls, [v.detach().requires_grad_(True) for v in values],
                                        checks=("contract", "gradient"))
                contract = result(report, "contract")
                read += switch == "1" and "backward read" in contract.calls
                seen.append((contract.outcome, sorted(f.rule for f in contract.findings)))
            assert seen[0] == seen[1], (name, mutation, seen)
    assert read
