"""The ledger (numerics/ledger.py): evaluations shared between checks change no verdict, and
each share is paid once (counts below those of the same run with GRADTOOL_LEDGER=0)."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import load_fixture

import gradtool
from gradtool.numerics.ledger import SWITCH
from gradtool.results import Outcome

QUICK = ("layouts", "contract_cases")
SLOW = ("truth", "expensive", "bugs", "layout_ops", "wolf")


def targets(fixture: str, functions_only: bool = False) -> list[tuple[str, object]]:
    """Every custom Function, module class and function the fixture defines (sorted by name;
    `functions_only`: the custom Functions, small inferred inputs: the quick tier's)."""
    module = load_fixture(fixture)
    found = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if (inspect.isclass(obj) and issubclass(obj, (torch.autograd.Function, torch.nn.Module))
                and obj not in (torch.autograd.Function, torch.nn.Module)) or \
                inspect.isfunction(obj):
            found.append((name, obj))
    if functions_only:
        found = [(n, o) for n, o in found
                 if inspect.isclass(o) and issubclass(o, torch.autograd.Function)]
    return found


def verdicts(obj: object) -> tuple:
    """Each check's outcome and its findings' rule ids and severities (or the error raised)."""
    try:
        report = gradtool.check(obj, seed=0)
    except Exception as exc:  # noqa: BLE001 - an input that cannot be inferred, alike both ways
        return ("raised", type(exc).__name__)
    return tuple((c.name, c.outcome.value, tuple(sorted((f.rule, f.severity.value)
                                                        for f in c.findings)))
                 for _, _, c in report.checks())


# A backward that adds fresh noise from torch's RNG at every call: its verdicts (double
# backward's failed or inconclusive) vary run to run whatever the ledger, and a third run alike
# the second by chance failed the comparison below (1 run in a few).
NOISY = ("SquareNoisyBackward",)


def both_ways(fixture: str, monkeypatch, functions_only: bool = False) -> None:
    for name, obj in targets(fixture, functions_only):
        if name in NOISY:
            continue
        monkeypatch.setenv(SWITCH, "1")
        shared = verdicts(obj)
        monkeypatch.setenv(SWITCH, "0")
        alone = verdicts(obj)
        if shared != alone and verdicts(obj) != alone:
            continue  # its verdicts vary run to run without the ledger (a noisy backward)
        assert shared == alone, f"{fixture}.{name}: {shared} != {alone}"


@pytest.mark.parametrize("fixture", QUICK)
def test_the_same_verdicts_with_and_without_the_ledger(fixture, monkeypatch):
    both_ways(fixture, monkeypatch, functions_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", SLOW)
def test_the_same_verdicts_with_and_without_the_ledger_everywhere(fixture, monkeypatch):
    both_ways(fixture, monkeypatch)


# --- what is read, and what is still paid ------------------------------------------------------


def calls(report, name: str) -> dict[str, int]:
    return next(c.calls for _, _, c in report.checks() if c.name == name)


def test_the_layout_baseline_is_the_contract_s_evaluation(monkeypatch):
    """The layout check's contiguous baseline (one forward, one backward at a random
    grad_output) is read from the contract's, paid once: one forward and one backward fewer
    than without the ledger; the contract's linearity test reads the gradient check's rows (two
    backwards fewer; its determinism test still calls backward a second time), and the
    layout's variants each call backward anew."""
    fx = load_fixture("layouts")
    monkeypatch.setenv(SWITCH, "0")
    alone = gradtool.check(fx.RowScale, ["3x4", "(4,)"], seed=0)
    monkeypatch.setenv(SWITCH, "1")
    shared = gradtool.check(fx.RowScale, ["3x4", "(4,)"], seed=0)
    layout, before = calls(shared, "layout"), calls(alone, "layout")
    assert layout["forward read"] == layout["backward read"] == 1
    assert layout["forward"] == before["forward"] - 1
    assert layout["backward"] == before["backward"] - 1
    # the contract's linearity test reads the gradient check's rows (checks/linear_rows.py)
    contract, paid = calls(shared, "contract"), calls(alone, "contract")
    assert contract["backward"] == paid["backward"] - 2 and contract["backward read"] == 2


def test_a_wrong_layout_still_fails_reading_the_baseline():
    """A backward reading grad_output flat fails the layout check on the shared baseline."""
    fx = load_fixture("layouts")
    report = gradtool.check(fx.RowScaleFlat, ["3x4", "(4,)"], seed=0)
    layout = next(c for _, _, c in report.checks() if c.name == "layout")
    assert layout.outcome is Outcome.FAILED
    assert layout.calls["backward read"] == 1
    assert "layout.grad_output_strides" in {f.rule for f in layout.findings}


def test_a_graph_whose_outputs_changed_is_not_read():
    """A recorded graph is read only while its leaves and outputs hold their values: a
    backward that wrote what forward returned made it another graph."""
    from gradtool.numerics.ledger import Graph, Ledger

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = x * 2
    ledger = Ledger()
    ledger.record_graph([x.detach()], Graph([x], [y], [torch.ones(3)], [torch.ones(3)], "t"))
    with torch.no_grad():
        y.add_(1)
    assert ledger.graph([x.detach()]) is None
    assert not ledger.read


def test_a_recorded_backward_is_read_at_its_point_and_cotangent_only():
    from gradtool.numerics.ledger import ZERO, Ledger

    x = torch.randn(3, dtype=torch.float64)
    ledger = Ledger()
    ledger.record_backward([x], ZERO, [torch.zeros(3)])
    assert ledger.backward([x + 1], ZERO) is None
    assert ledger.backward([x], [torch.zeros(3)]) is None  # a tensor key is not ZERO's
    assert ledger.backward([x], ZERO)[0].equal(torch.zeros(3))
    assert ledger.read == {"backward": 1}


def test_the_switch_turns_reading_off(monkeypatch):
    from gradtool.numerics.ledger import ZERO, Ledger

    monkeypatch.setenv(SWITCH, "0")
    ledger = Ledger()
    ledger.record_backward([torch.ones(2)], ZERO, [torch.zeros(2)])
    assert ledger.backward([torch.ones(2)], ZERO) is None


def test_a_large_point_is_keyed_without_copies_and_its_graph_fingerprinted(monkeypatch):
    """Past EXACT_BYTES (a model's parameters are inputs) a point is its own tensors unchanged
    since, and a graph read only while its fingerprints stand: a write shows."""
    from gradtool.numerics import ledger as L

    monkeypatch.setattr(L, "EXACT_BYTES", 8)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = x * 2
    point, other = x.detach().clone(), x.detach().clone()  # the case's inputs, and a copy
    book = L.Ledger()
    book.record_graph([point], L.Graph([x], [y], [torch.ones(4)], [torch.ones(4)], "t"))
    assert book.graph([point], last=False) is not None  # the same tensor: read
    assert book.graph([other], last=False) is None  # another tensor: paid
    with torch.no_grad():
        y.mul_(3)
    assert book.graph([point]) is None
