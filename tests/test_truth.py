"""Every word of a report is true (issue 33): no failure without evidence from the real run,
re-runs in the engine's calling convention, culprits never innocent, bisected layouts."""

from __future__ import annotations

import pytest
from conftest import load_fixture, result

import gradtool
from gradtool.results import CheckResult, Finding, Outcome, Severity


@pytest.fixture(scope="module")
def fx():
    return load_fixture("truth")


def findings(check: CheckResult) -> dict[str, Finding]:
    return {f.rule: f for f in check.findings}


# --- failures need evidence from the real run ---------------------------------------------------


def test_scaled_adjoint_parameter_keeps_the_contract(fx):
    report = gradtool.check(fx.ScaledAdjointODE, ["2x3"], checks=("contract", "gradient"))
    contract = result(report, "contract")
    assert contract.outcome is Outcome.PASSED, contract.summary
    assert "contract.gradient_count" not in findings(contract)
    assert result(report, "gradient").outcome is Outcome.PASSED


def test_scaled_adjoint_parameter_is_re_run_with_it(fx):
    """The re-run passes the scaled weight on, as the real run did: the Function's own check
    sees the parameter (before, the solver dropped it as needing no gradient)."""
    report = gradtool.check(fx.ScaledAdjointODEFlipped, ["2x3"], checks=("gradient",))
    gradient = result(report, "gradient")
    assert gradient.outcome is Outcome.FAILED
    assert "'weight'" in gradient.summary
    assert not any("could not re-run" in d for d in gradient.details)


def test_a_rule_the_engine_enforced_in_the_real_run_is_a_warning(fx, monkeypatch):
    """An engine-checked rule broken only on gradtool's re-run, while the model's own backward
    ran through the engine, is told as the re-run differing, never a failure."""
    from gradtool.run import inner

    broken = Finding("contract.gradient_count", "_AdjointSolve at m.py:3: backward returned 4 "
                     "gradient(s); forward takes 5 input(s)")
    monkeypatch.setattr(inner, "_contract_of", lambda *_: [broken])
    report = gradtool.check(fx.ScaledAdjointODE, ["2x3"], checks=("contract",))
    contract = result(report, "contract")
    assert contract.outcome is Outcome.PASSED
    told = findings(contract)["contract.rerun_differs"]
    assert told.severity is Severity.WARNING
    assert "backward returned 4 gradient(s)" in told.message
    assert "only when gradtool re-ran it alone" in told.message
    assert "autograd's engine accepted every gradient it returned" in told.message


def test_an_engine_rule_stays_a_failure_when_the_real_backward_did_not_run():
    from gradtool.run.inner import _engine_ran

    raised = CheckResult("contract", Outcome.ERROR, "TypeError raised")
    assert not _engine_ran(raised)
    no_grad = CheckResult("contract", Outcome.FAILED, "no output requires grad", findings=(
        Finding("contract.no_differentiable_output", "no output requires grad"),))
    assert not _engine_ran(no_grad)
    assert _engine_ran(CheckResult("contract", Outcome.PASSED, "ok"))


def test_constant_placeholder_output_may_be_ignored(fx):
    contract = result(gradtool.check(fx.WithPlaceholder, ["3x4"], checks=("contract",)),
                      "contract")
    assert contract.outcome is Outcome.PASSED, contract.summary


def test_ignored_output_that_depends_on_the_input_fails(fx):
    contract = result(gradtool.check(fx.WithIgnoredOutput, ["3x4"], checks=("contract",)),
                      "contract")
    assert contract.outcome is Outcome.FAILED
    assert contract.summary.startswith("backward ignores the gradient of output 1")


# --- re-runs in the engine's calling convention -------------------------------------------------


def test_non_tensor_outputs_get_one_argument_each(fx):
    report = gradtool.check(fx.WithInfo, ["3x4"], checks=("contract", "gradient"))
    contract = result(report, "contract")
    assert contract.outcome is Outcome.PASSED, contract.summary
    assert result(report, "gradient").outcome is Outcome.PASSED


def test_non_tensor_outputs_broken_twin_fails_the_gradient_only(fx):
    report = gradtool.check(fx.WithInfoWrong, ["3x4"], checks=("contract", "gradient"))
    assert result(report, "contract").outcome is Outcome.PASSED
    assert result(report, "gradient").outcome is Outcome.FAILED


def test_apply_alias_is_re_run_and_blamed(fx):
    gradient = result(gradtool.check(fx.AliasModelWrong, ["2x3"], checks=("gradient",)),
                      "gradient")
    assert gradient.outcome is Outcome.FAILED
    text = "\n".join(gradient.details)
    assert "could not be re-run" not in text
    assert "_ScaleByParam (" in text and "is wrong w.r.t. x" in text
    assert "sign flipped" in text


def test_apply_alias_contract_is_checked_and_hook_removed(fx):
    from torch.autograd.function import FunctionMeta

    contract = result(gradtool.check(fx.AliasModel, ["2x3"], checks=("contract",)), "contract")
    assert contract.outcome is Outcome.PASSED
    assert not any(f.rule in ("contract.inner_raised", "contract.inner_unchecked")
                   for f in contract.findings), contract.findings
    assert not any(name in vars(FunctionMeta) for name in ("forward", "backward", "vjp",
                                                           "setup_context"))


# --- culprits never innocent ----------------------------------------------------------------------


def test_tangent_space_functions_make_the_culprit_ambiguous(fx):
    gradient = result(gradtool.check(fx.RotatePointsWrong, ["4x3", "4x3"], checks=("gradient",)),
                      "gradient")
    assert gradient.outcome is Outcome.FAILED
    why = gradient.details[-1]
    assert why.startswith("the culprit is ambiguous: Exp and Act each fail alone")
    assert "stays wrong whichever one's backward is replaced" in why
    assert "tangent space" in why
    # look at: the model's forward, not an innocent Function's backward
    assert gradient.source == f"tests/fixtures/truth.py:{line_of(fx.RotatePoints.forward)}"


def test_tangent_space_composite_passes(fx):
    report = gradtool.check(fx.RotatePoints, ["4x3", "4x3"])
    assert all(c.outcome.value not in ("failed", "error") for _, _, c in report.checks())


def test_substitution_names_the_one_function_that_fixes_the_model(fx):
    gradient = result(gradtool.check(fx.PairThenSine, ["3x4"], checks=("gradient",)), "gradient")
    assert gradient.details[-1] == (
        "of the Functions that fail alone (PairSecondWrong and SineFlipped), SineFlipped is the "
        "one to blame: the model's gradient is right once its backward is replaced by autograd "
        "through its forward, and with no other one's")
    assert gradient.source == f"tests/fixtures/truth.py:{line_of(fx.SineFlipped.backward)}"


def test_two_wrong_functions_are_ambiguous_too(fx):
    gradient = result(gradtool.check(fx.TwoWrong, ["3x4"], checks=("gradient",)), "gradient")
    assert gradient.details[-1].startswith("the culprit is ambiguous: _Negated and SineFlipped "
                                           "each fail alone")
    assert "either more than one of them is wrong" in gradient.details[-1]
    assert gradient.source == f"tests/fixtures/truth.py:{line_of(fx.TwoWrong.forward)}"


def test_double_backward_points_at_the_function_whose_backward_is_not_differentiable(fx):
    db = result(gradtool.check(fx.SineCubeDetached, ["3x4"], checks=("double_backward",)),
                "double_backward")
    assert db.outcome is Outcome.FAILED
    assert db.source == f"tests/fixtures/truth.py:{line_of(fx.DetachedCube.backward)}"
    assert db.details[-1].startswith("DetachedCube at tests/fixtures/truth.py:")
    assert "its backward's derivative is wrong (double backward checked alone" in db.details[-1]
    ok = result(gradtool.check(fx.SineCube, ["3x4"], checks=("double_backward",)),
                "double_backward")
    assert ok.outcome is Outcome.PASSED


def _double_backward_checks(monkeypatch) -> list[str]:
    """The targets check_double_backward runs on (the model's, then each re-check alone)."""
    from gradtool.checks import double_backward

    seen: list[str] = []
    real = double_backward.check_double_backward

    def counted(case, target, config):
        seen.append(target.name)
        return real(case, target, config)

    monkeypatch.setattr(double_backward, "check_double_backward", counted)
    return seen


@pytest.mark.parametrize("model, inputs", [("CubeAlone", ["3x4"]),
                                           ("SineCubeApart", ["3x4", "3x4"])])
def test_the_one_function_on_the_failing_path_is_named_without_a_second_check(
        fx, monkeypatch, model, inputs):
    """Nothing to choose between: the model's only Function, or the only one whose backward
    computes the failing gradients (Sine reaches x alone, y's blocks fail), is named at once;
    no double backward is checked again."""
    seen = _double_backward_checks(monkeypatch)
    db = result(gradtool.check(getattr(fx, f"{model}Detached"), inputs,
                               checks=("double_backward",)), "double_backward")
    assert db.outcome is Outcome.FAILED
    assert len(seen) == 1  # the model's own check, no re-check alone
    assert db.source == f"tests/fixtures/truth.py:{line_of(fx.DetachedCube.backward)}"
    assert db.details[-1].startswith("DetachedCube at tests/fixtures/truth.py:")
    assert "the only custom Function on the failing path" in db.details[-1]
    ok = result(gradtool.check(getattr(fx, model), inputs, checks=("double_backward",)),
                "double_backward")
    assert ok.outcome is Outcome.PASSED


def test_a_backward_without_a_graph_is_named_with_the_way_to_declare_it(fx, monkeypatch):
    """Every gradient of the model runs through one Function whose backward has no graph:
    double backward stops at its first confirmed block, the Function is named without a
    re-check, and the report says how to declare it once differentiable (or leave the check
    out); checked directly too, and in probe mode, where nothing is left unchecked."""
    seen = _double_backward_checks(monkeypatch)
    db = result(gradtool.check(fx.NoGraphCubeAlone, ["3x4"], checks=("double_backward",)),
                "double_backward")
    assert db.outcome is Outcome.FAILED
    assert len(seen) == 1
    assert any("carry no graph" in d for d in db.details)
    assert db.details[-1].startswith("NoGraphCube at tests/fixtures/truth.py:")
    assert any("decorate it with @once_differentiable" in d for d in db.details)
    for direct in (dict(), dict(mode="probe")):
        alone = result(gradtool.check(fx.NoGraphCube, ["3x4"], checks=("double_backward",),
                                      **direct), "double_backward")
        assert alone.outcome is Outcome.FAILED
        assert any("decorate it with @once_differentiable" in d for d in alone.details)
    detached = result(gradtool.check(fx.CubeAloneDetached, ["3x4"],
                                     checks=("double_backward",)), "double_backward")
    assert not any("once_differentiable" in d for d in detached.details)


def test_no_function_on_the_failing_path_is_re_checked_or_blamed(fx, monkeypatch):
    seen = _double_backward_checks(monkeypatch)
    db = result(gradtool.check(fx.SineAndHookedCube, ["3x4", "3x4"],
                               checks=("double_backward",)), "double_backward")
    assert db.outcome is Outcome.FAILED
    assert len(seen) == 1
    assert db.details[-1].startswith("no custom Function's backward computes the failing")
    assert db.source != f"tests/fixtures/truth.py:{line_of(fx.Sine.backward)}"


def test_a_hook_on_the_only_function_keeps_its_re_check(fx, monkeypatch):
    """A hook that may change the gradient is seen: the one Function is checked alone, passes,
    and is not blamed."""
    seen = _double_backward_checks(monkeypatch)
    db = result(gradtool.check(fx.CubeHooked, ["3x4"], checks=("double_backward",)),
                "double_backward")
    assert db.outcome is Outcome.FAILED
    assert len(seen) == 2
    assert db.details[-1].startswith("every custom Function's backward differentiates "
                                     "correctly alone")
    assert db.source != f"tests/fixtures/truth.py:{line_of(fx.Cube.backward)}"


def test_functions_on_one_failing_path_are_each_re_checked_alone(fx, monkeypatch):
    seen = _double_backward_checks(monkeypatch)
    db = result(gradtool.check(fx.SineCubeDetached, ["3x4"], checks=("double_backward",)),
                "double_backward")
    assert db.outcome is Outcome.FAILED
    assert len(seen) == 3  # the model's, then Sine's and DetachedCube's alone


def _alone_checks(monkeypatch) -> list[str]:
    """The Functions the first-order culprit search re-checks alone."""
    from gradtool.run import culprit

    seen: list[str] = []
    real = culprit.check_application

    def counted(app, *args, **kw):
        seen.append(app.cls.__qualname__)
        return real(app, *args, **kw)

    monkeypatch.setattr(culprit, "check_application", counted)
    return seen


def test_a_model_that_is_one_function_names_it_without_checking_it_again(fx, monkeypatch):
    """Its blocks are rows of the Function's Jacobian at the arguments it received: the
    Function is named from them, no gradient check of it alone runs."""
    seen = _alone_checks(monkeypatch)
    report = gradtool.check(fx.SineWholeFlipped, ["3x4"], checks=("gradient",))
    gradient = result(report, "gradient")
    assert gradient.outcome is Outcome.FAILED
    assert seen == []
    assert gradient.source == f"tests/fixtures/truth.py:{line_of(fx.SineFlipped.backward)}"
    assert gradient.details[-2].startswith("SineFlipped at tests/fixtures/truth.py:")
    assert "is wrong w.r.t. x (backward at" in gradient.details[-2]
    assert gradient.details[-1].startswith("not re-checked alone: the model is SineFlipped")
    assert gradtool.check(fx.SineWhole, ["3x4"], checks=("gradient",)).ok()


@pytest.mark.parametrize("model", ["SineFlippedAfterScale", "SineFlippedThenScale"])
def test_code_around_the_one_function_keeps_the_search(fx, monkeypatch, model):
    seen = _alone_checks(monkeypatch)
    gradient = result(gradtool.check(getattr(fx, model), ["3x4"], checks=("gradient",)),
                      "gradient")
    assert gradient.outcome is Outcome.FAILED
    assert seen == ["SineFlipped"]
    assert gradient.source == f"tests/fixtures/truth.py:{line_of(fx.SineFlipped.backward)}"
    assert not any(d.startswith("not re-checked alone") for d in gradient.details)


def marked(text: str) -> int:
    """The line of tests/fixtures/truth.py holding `text`."""
    from conftest import FIXTURES

    lines = (FIXTURES / "truth.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def line_of(fn) -> int:
    from gradtool.targets.load import source_of

    return int(source_of(fn).rsplit(":", 1)[1])


# --- layout findings bisected ---------------------------------------------------------------------

GRU_INPUTS = ["4x3", "4x3", "4x3", "3x3", "3x3"]


def test_layout_names_the_one_input_whose_layout_forward_refuses(fx):
    layout = result(gradtool.check(fx.GRUCellFlat, GRU_INPUTS, checks=("layout",)), "layout")
    assert layout.outcome is Outcome.FAILED
    assert layout.summary.startswith("forward raises on a transposed input 'x': RuntimeError: "
                                     "view size is not compatible")
    assert "fix: use reshape instead of view where it raised, or call .contiguous() on 'x' " \
           "first" in layout.summary
    assert "'h0'" not in layout.summary
    assert [f.rule for f in layout.findings] == ["layout.input_raises"]  # once, not per layout
    assert layout.source.endswith(f"truth.py:{marked('needs x contiguous')}")  # where it raised
    twin = result(gradtool.check(fx.GRUCellStrided, GRU_INPUTS, checks=("layout",)), "layout")
    assert twin.outcome is Outcome.PASSED


def test_a_raise_that_is_no_view_gets_the_contiguous_fix():
    from gradtool.checks.layout import _contiguity_fix

    fix = _contiguity_fix(RuntimeError("input must be contiguous"), "'x'")
    assert fix == "call .contiguous() on 'x' before the line that raised, which needs that layout"


def test_an_input_that_raised_is_not_tried_in_every_layout(fx):
    """One forward for the contiguous baseline, one for the transposed x that raises; the
    sliced layout, raising the same way, is not run again."""
    layout = result(gradtool.check(fx.CumulativeFlat, ["3x4"], checks=("layout",)), "layout")
    assert layout.outcome is Outcome.FAILED
    assert len(layout.findings) == 1
    assert layout.calls["forward"] == 2


# --- inference that exercises layouts ----------------------------------------------------------


def test_inferred_inputs_are_batched_so_a_view_on_grad_output_is_caught(fx):
    report = gradtool.check(fx.RowScale, None, checks=("layout",))
    (_, case, layout), = report.checks()
    assert [i.description for i in case.inputs] == ["2x3x4:float64", "(4,):float64"]
    assert "preferred over (5,), (5,): a batched input exercises layouts" in case.notes
    assert "inference passed over 3x4, 3x4, where backward raised RuntimeError: shape '[3, 4]' " \
           "is invalid for input of size 4 (a shape the target need not support: not a " \
           "failure)" in case.notes
    assert layout.outcome is Outcome.FAILED
    assert layout.summary.startswith("backward raises on a transposed grad_output")
    twin = gradtool.check(fx.RowScaleReshape, None, checks=("layout",))
    assert all(c.outcome is Outcome.PASSED for _, _, c in twin.checks())


def test_a_backward_that_only_takes_scalars_is_reported_not_checked_at_a_scalar(fx):
    """Forward takes 3x4, backward raises on it and runs only at 0-d: inference used to settle
    on the 0-d input, and every check passed. The raising backward is the report now."""
    report = gradtool.check(fx.ScalarGradOutput, None, checks=("gradient",))
    (_, case, gradient), = report.checks()
    assert [i.description for i in case.inputs] == ["3x4:float64"]
    assert gradient.outcome is Outcome.ERROR and not report.ok()
    assert "shape '[]' is invalid for input of size 12" in gradient.summary
    assert "0-d inputs ran forward and backward where these did not; if the target takes only " \
           "scalars, pin them: -i '()'" in case.notes
    # a 0-d argument beside a larger one (a temperature) is still found, not the error
    scaled = gradtool.check(fx.ScaledByScalar, None, checks=("gradient",))
    (_, scaled_case, scaled_gradient), = scaled.checks()
    assert [i.description for i in scaled_case.inputs] == ["3x4:float64", "():float64"]
    assert scaled_gradient.outcome is Outcome.PASSED
    twin = gradtool.check(fx.AnyGradOutput, None, checks=("gradient",))
    (_, twin_case, twin_gradient), = twin.checks()
    assert [i.description for i in twin_case.inputs] == ["3x4:float64"]
    assert twin_gradient.outcome is Outcome.PASSED and not twin_case.notes


def test_inference_keeps_the_first_shape_when_it_has_two_dimensions(fx):
    (_, case, _), = gradtool.check(fx.Sine, None, checks=("gradient",)).checks()
    assert [i.description for i in case.inputs] == ["3x4:float64"]
    assert not case.notes


# --- a backward that raises --------------------------------------------------------------------


def test_a_raising_backward_is_an_error_pointing_at_it(fx):
    report = gradtool.check(fx.RaisingBackward, ["3x4"], checks=("contract", "gradient"))
    raised = "ValueError raised: not enough values to unpack (expected 2, got 1)"
    for name in ("contract", "gradient"):
        check = result(report, name)
        assert check.outcome is Outcome.ERROR
        assert raised in check.summary  # the second time as "the same error as under contract"
        assert check.source.endswith(f"truth.py:{marked('one saved, two unpacked')}")
    twin = gradtool.check(fx.Sine, ["3x4"], checks=("contract", "gradient"))
    assert all(c.outcome is Outcome.PASSED for _, _, c in twin.checks())


# --- a hint to declare a surrogate ---------------------------------------------------------------


def test_straight_through_estimator_gets_a_surrogate_hint(fx):
    gradient = result(gradtool.check(fx.RoundSTE, ["3x4"], checks=("gradient",)), "gradient")
    (block,) = gradient.blocks
    assert block.diagnosis.startswith("analytical is the identity while finite differences see "
                                      "a step (zero derivative at 12 of them): a "
                                      "straight-through estimator?")
    assert "declare it in a spec (surrogate: {kind: identity, inputs: [x]})" in block.diagnosis


def test_clipped_straight_through_gets_the_clipped_hint(fx):
    gradient = result(gradtool.check(fx.BinarizeSTE, ["3x4"], checks=("gradient",)), "gradient")
    (block,) = gradient.blocks
    assert block.diagnosis.startswith("analytical is an identity clipped to 8 of 12 elements "
                                      "(passing where 'x' lies in [")
    assert "surrogate: {kind: clipped_identity, range: [lo, hi], inputs: [x]}" in block.diagnosis


def test_a_wrong_factor_on_a_diagonal_is_no_straight_through():
    import numpy as np

    from gradtool.diagnosis.classify import diagnose_block

    text = diagnose_block(np.eye(4) * 2, np.eye(4), input_name="x", input_shape=(4,),
                          output_shape=(4,))
    assert "straight-through" not in text and "factor 2" in text


# --- permutations named without a dense block ----------------------------------------------------


def test_a_roll_in_a_large_block_is_named_from_probes(fx):
    gradient = result(gradtool.check(fx.MulRolled, ["30x40", "30x40"], checks=("gradient",)),
                      "gradient")
    texts = [b.diagnosis for b in gradient.blocks if b.mismatched]
    assert texts == ["analytical = numerical rolled by +1 along input axis 1 (size 40), wrapping "
                     "round, on all 2 random probes (the block is too large to evaluate whole): "
                     "backward returns the gradient for 'x' shifted along that dimension (a roll "
                     "or an index offset in backward)"]


def test_probes_name_transposes_and_swaps():
    import numpy as np

    from gradtool.diagnosis.structure import permuted_probes
    from gradtool.numerics.permuted import Probes

    rng = np.random.default_rng(0)
    jac = rng.standard_normal((12, 12))  # a (3, 4) -> (3, 4) block
    other = rng.standard_normal((12, 12))
    perm = np.arange(12).reshape(3, 4).swapaxes(0, 1).ravel()
    p = Probes(others={"y": []})
    for _ in range(2):
        v, u = rng.standard_normal(12), rng.standard_normal(12)
        p.cotangents.append(v)
        p.directions.append(u)
        p.grads.append((v @ jac)[perm])          # the returned gradient transposed
        p.jvps.append(jac @ u)
        p.others["y"].append(float(v @ other @ u))
    found = permuted_probes(p, (3, 4), (3, 4), "x", 1e-4)
    assert found.kind == "transposed" and found.data["side"] == "input"
    assert found.text.startswith("analytical = numerical with input indices transposed, axes 0 and 1 "
                           "and laid back into shape (3, 4), on all 2 random probes")
    p.grads = [v @ other for v in p.cotangents]   # y's gradient returned for x
    swapped = permuted_probes(p, (3, 4), (3, 4), "x", 1e-4)
    assert swapped.kind == "swapped" and "gradients swapped?" in swapped.text
    p.grads = [v @ jac * 1.5 for v in p.cotangents]  # a factor: no permutation
    assert permuted_probes(p, (3, 4), (3, 4), "x", 1e-4) is None
