"""Real models: parameters bound for forward and every backward (checkpointing, reversible
blocks, adjoints), the user's module untouched, once-differentiable Functions skipped by name."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES, load_fixture, result

import gradtool


@pytest.fixture(scope="module")
def models():
    return load_fixture("models")


def line_of(text: str) -> str:
    lines = (FIXTURES / "models.py").read_text().splitlines()
    return f"models.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def checks(report):
    return {check.name: check for _, _, check in report.checks()}


@pytest.mark.parametrize("name, inputs", [
    ("Checkpointed", ["2x3"]), ("CheckpointReentrant", ["2x3"]),
    ("Reversible", ["2x2", "2x2"]), ("AdjointODE", ["2x3"]),
])
def test_recomputing_modules_pass(models, name, inputs):
    found = checks(gradtool.check(getattr(models, name), inputs))
    assert found["contract"].outcome.value == "passed", found["contract"]
    assert found["gradient"].outcome.value == "passed", found["gradient"]
    assert found["double_backward"].outcome.value in ("passed", "skipped")


def test_checkpoint_double_backward_sees_the_perturbed_parameters(models):
    # Non-reentrant checkpointing re-runs forward inside backward: unbound, it saw the module's
    # own parameters and double backward disagreed for every parameter.
    check = result(gradtool.check(models.Checkpointed, ["2x3"]), "double_backward")
    assert check.outcome.value == "passed", check
    assert check.calls["backward"] > 0


@pytest.mark.parametrize("name, phrase", [
    ("CheckpointReentrant", "use_reentrant=True"),
    ("Reversible", "_Reverse.backward is decorated with @once_differentiable"),
    ("AdjointODE", "_Adjoint.backward is decorated with @once_differentiable"),
])
def test_once_differentiable_inside_is_skipped_by_name(models, name, phrase):
    inputs = ["2x2", "2x2"] if name == "Reversible" else ["2x3"]
    check = result(gradtool.check(getattr(models, name), inputs), "double_backward")
    assert check.outcome.value == "skipped", check
    assert phrase in check.summary
    if name == "Reversible":
        assert check.source.endswith(line_of("def backward(ctx, gy1, gy2)"))


@pytest.mark.parametrize("name", ["CheckpointWrong", "CheckpointReentrantWrong"])
def test_wrong_function_inside_checkpoint_is_named_with_its_line(models, name):
    check = result(gradtool.check(getattr(models, name), ["2x3"], checks=("gradient",)),
                   "gradient")
    assert check.outcome.value == "failed"
    text = "\n".join(check.details)
    assert f"{line_of('# scale in checkpoint')} is wrong w.r.t. x" in text
    assert "ScaleWrong at " in text
    assert "CheckpointFunction" not in text  # torch's own Function is not blamed
    wrong = int(line_of("return grad  # wrong").split(":")[1])
    assert check.source.endswith(f"models.py:{wrong - 1}")  # ScaleWrong's `def backward`


def test_users_module_is_exactly_untouched(models):
    torch.manual_seed(0)
    module = models.Checkpointed()
    module.train(False)
    module.b.bias.requires_grad_(False)
    module.a.weight.grad = torch.full_like(module.a.weight, 7.0)
    calls = []
    hook = module.register_forward_hook(lambda mod, *_: calls.append(mod))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    params = dict(module.named_parameters())
    report = gradtool.check(module, ["2x3"])
    assert all(c.outcome.value in ("passed", "skipped") for _, _, c in report.checks())
    assert module.training is False
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(v.dtype == torch.float32 for v in module.state_dict().values())
    assert dict(module.named_parameters()) == params  # the same Parameter objects
    assert torch.equal(module.a.weight.grad, torch.full_like(module.a.weight, 7.0))
    assert module.a.bias.grad is None and module.b.weight.grad is None
    assert module.b.bias.requires_grad is False and module.a.bias.requires_grad is True
    assert calls and all(mod is not module for mod in calls)  # hooks ran on gradtool's copy
    assert list(module._forward_hooks) == [hook.id]


def test_reentrant_fallback_restores_grad_of_leaves(models):
    from gradtool.numerics.problem import vjp

    torch.manual_seed(0)
    block = torch.nn.Linear(3, 2).double()
    x = torch.randn(2, 3, dtype=torch.double, requires_grad=True)
    x.grad = torch.ones_like(x)
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
    (got,) = vjp([out], [x], [torch.ones_like(out)])
    assert torch.allclose(got, torch.ones(2, 2, dtype=torch.double) @ block.weight)
    assert torch.equal(x.grad, torch.ones_like(x))  # the caller's .grad is put back


def test_non_differentiable_outputs_are_left_out_and_named():
    def layer_norm(x):
        return torch.native_layer_norm(x, [3], None, None, 1e-5)

    check = result(gradtool.check(layer_norm, ["4x3"], checks=("gradient",)), "gradient")
    assert check.outcome.value == "passed", check
    assert "output 1, output 2 left out" in check.summary
    assert [b.output for b in check.blocks] == ["output 0"]


def test_a_detached_forward_still_fails():
    check = result(gradtool.check(lambda x: (x * 2).detach(), ["(3,)"], checks=("gradient",)),
                   "gradient")
    assert check.outcome.value == "failed"


def test_contract_of_functions_inside_a_module(models):
    found = checks(gradtool.check(models.InnerBroken, ["2x3"]))
    contract = found["contract"]
    assert contract.outcome.value == "failed"
    assert found["gradient"].outcome.value == "passed"  # the composite's gradient matches
    text = "\n".join(f.message for f in contract.findings)  # each fact once: in findings
    site = line_of("# inner double")
    assert "DoubleInplace at " in text and f"{site} (backward at" in text
    assert "forward modifies input 'x' in place without ctx.mark_dirty(x)" in text
    assert "PairNoneCrash at" in text and "backward fails when output 0 is unused" in text
    from gradtool.targets.load import source_of

    assert contract.source == source_of(models.DoubleInplace.backward)
    assert checks(gradtool.check(models.Inner, ["2x3"]))["contract"].outcome.value == "passed"


def test_a_none_grad_output_under_materialization_off_is_explained(models):
    """The model's backward raises on the None its inner Function gets for an unused output:
    the report says materialization was turned off and names the fix, not the TypeError alone."""
    from gradtool.render.words import check_body

    contract = checks(gradtool.check(models.FirstOfPair, ["2x3"]))["contract"]
    assert contract.outcome.value == "error"
    assert contract.summary.startswith("TypeError raised")
    finding = next(f for f in contract.findings if f.rule == "contract.unused_output_raises")
    assert finding.data["materialized"] is False
    body = "\n".join(check_body(contract))
    assert "PairNoneCrash at " in body
    assert "forward turned materialization off (ctx.set_materialize_grads(False))" in body
    assert "treat a None grad_output as zeros in backward, or keep materialization on" in body
    assert gradtool.check(models.FirstOfPairSafe, ["2x3"]).ok()


def test_no_recording_without_custom_functions(monkeypatch):
    from gradtool.run import culprit

    def refuse(problem):
        raise AssertionError("recorded a model without custom Functions")

    monkeypatch.setattr(culprit, "record", refuse)
    from gradtool.run import inner

    monkeypatch.setattr(inner, "record", refuse)
    report = gradtool.check(torch.nn.Linear(3, 2), ["2x3"], checks=("contract",))
    assert result(report, "contract").outcome.value == "passed"


def test_bare_number_for_a_tensor_hints_the_1d_form_and_errors_once():
    report = gradtool.check(torch.sin, ["3"])
    found = checks(report)
    assert found["contract"].outcome.value == "error"
    assert "for a 1-d tensor of 3 elements write -i '(3,)'" in "\n".join(found["contract"].details)
    assert [c.outcome.value for c in found.values()].count("error") == 1  # once per case
    assert "the same error as under contract" in found["double_backward"].summary
    assert gradtool.check(torch.sin, ["(3,)"]).ok()


def test_stochastic_note_shows_in_the_terminal_on_a_pass():
    from gradtool.render.terminal import render_plain

    def noisy(x):
        return torch.nn.functional.dropout(x, 0.5) * 2

    report = gradtool.check(noisy, ["(6,)"])
    assert report.ok()
    assert "note: forward is stochastic" in render_plain(report)


def test_a_wrong_backward_upstream_of_a_weight_is_named_by_double_backward(models):
    """grad of lin2.weight reads SquareWrong's output: its derivative w.r.t. x runs through
    SquareWrong's (first-order) backward, though neither Function reaches lin2.weight."""
    checked = result(gradtool.check(models.Stacked, checks=("double_backward",)),
                     "double_backward")
    assert checked.outcome.value == "failed"
    assert not any("none reaches" in d for d in checked.details)
    named = [d for d in checked.details if d.startswith("SquareWrong")]
    assert named and "second derivative runs through this first-order backward" in named[0], \
        checked.details
    assert not any(d.startswith("Scale ") or d.startswith("Scale at") for d in checked.details)
