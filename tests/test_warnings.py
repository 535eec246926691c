"""Warnings: legal but worth telling (an engine-summed gradient) passes, is told everywhere, fails
only under --strict, and can be silenced by rule id; broken twins still fail."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import gradtool
from conftest import FIXTURES, load_fixture, outcomes, result
from gradtool.cli.main import main
from gradtool.config.settings import CheckConfig
from gradtool.errors import ConfigError
from gradtool.render.annotations import render_github
from gradtool.render.json import render_json
from gradtool.render.junit import render_junit
from gradtool.render.terminal import render_plain

BROADCAST = "contract.broadcast_gradient"


@pytest.fixture
def probe_cases():
    return load_fixture("probe_cases")


def test_engine_summed_gradient_passes_with_a_warning(probe_cases):
    report = gradtool.check(probe_cases.BatchedWeights, ["5x4", "(4,)"])
    assert set(outcomes(report).values()) == {"passed"}
    contract = result(report, "contract")
    assert [w.rule for w in contract.warnings] == [BROADCAST]
    assert "(5, 4)" in contract.warnings[0].message
    assert report.ok() and not report.ok(strict=True)


def test_broken_broadcast_twin_still_fails(probe_cases):
    report = gradtool.check(probe_cases.BatchedWeightsWrong, ["5x4", "(4,)"])
    assert outcomes(report)["gradient"] == "failed"
    assert [w.rule for w in result(report, "contract").warnings] == [BROADCAST]


def test_broken_contract_rule_beside_a_warning_still_fails(contract_cases):
    check = result(gradtool.check(contract_cases.SquareWrongDtype, ["3x4"],
                                  checks=("contract",)), "contract")
    assert check.outcome.value == "failed"
    assert [f.rule for f in check.findings] == ["contract.gradient_dtype"]


def test_a_warning_inside_a_model_reaches_the_model_contract(probe_cases):
    report = gradtool.check(probe_cases.BatchedWeightsModel, ["5x4"])
    contract = result(report, "contract")
    assert contract.outcome.value == "passed"
    assert [w.rule for w in contract.warnings] == [BROADCAST]
    assert contract.warnings[0].message.startswith("BatchedWeights at ")


def test_a_warning_is_told_in_every_report(probe_cases, tmp_path):
    report = gradtool.check(probe_cases.BatchedWeights, ["5x4", "(4,)"], checks=("contract",))
    text = render_plain(report)
    assert "PASS " in text and f"— 1 warning: gradient for 'w'" in text and BROADCAST in text
    assert "1 passed, 1 warning" in text
    check = json.loads(render_json(report))["targets"][0]["cases"][0]["checks"][0]
    assert check["outcome"] == "passed" and [w["rule"] for w in check["warnings"]] == [BROADCAST]
    junit = render_junit(report)
    assert f'name="finding.warning" value="{BROADCAST}"' in junit and "<failure" not in junit
    github = render_github(report, tmp_path)
    assert github.startswith("::warning ") and BROADCAST in github


def test_strict_fails_on_a_warning(probe_cases, tmp_path):
    report = gradtool.check(probe_cases.BatchedWeights, ["5x4", "(4,)"], checks=("contract",),
                            strict=True)
    assert not report.ok(strict=True)
    assert "<failure" in render_junit(report)
    assert render_github(report, tmp_path).startswith("::error ")
    assert "fail under --strict" in render_plain(report)


def test_a_rule_is_silenced_by_id(probe_cases):
    report = gradtool.check(probe_cases.BatchedWeights, ["5x4", "(4,)"], checks=("contract",),
                            ignore=(BROADCAST,), strict=True)
    assert result(report, "contract").warnings == () and report.ok(strict=True)
    broken = gradtool.check(load_fixture("contract_cases").SquareWrongDtype, ["3x4"],
                            checks=("contract",), ignore=("contract.gradient_dtype",))
    assert outcomes(broken)["contract"] == "passed"


def test_unknown_rule_id_is_a_config_error_with_a_suggestion():
    with pytest.raises(ConfigError) as info:
        CheckConfig(ignore=("contract.broadcast_gradent",))
    assert "did you mean 'contract.broadcast_gradient'" in str(info.value.hint)


def _copy_fixture(tmp_path):
    shutil.copy(FIXTURES / "probe_cases.py", tmp_path / "probe_cases.py")


def test_ignore_in_pyproject_and_in_a_spec(tmp_path, monkeypatch):
    _copy_fixture(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["check", "probe_cases.py:BatchedWeights", "-i", "5x4", "-i", "(4,)", "--check",
            "contract", "--strict"]
    assert CliRunner().invoke(main, args).exit_code == 1
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.gradtool]\nignore = ["{BROADCAST}"]\n')
    assert CliRunner().invoke(main, args).exit_code == 0
    (tmp_path / "pyproject.toml").write_text('[tool.gradtool]\nignore = ["contract.nope"]\n')
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code == 2 and "rule ids" in bad.output
    (tmp_path / "pyproject.toml").unlink()
    spec = ("version: 1\nspecs:\n  - target: probe_cases.py:BatchedWeights\n"
            "    inputs: ['5x4', '(4,)']\n    checks: [contract]\n"
            f"    ignore: [{BROADCAST}]\n")
    (tmp_path / "s.yaml").write_text(spec)
    assert CliRunner().invoke(main, ["check", "s.yaml", "--strict"]).exit_code == 0
    (tmp_path / "s.yaml").write_text(spec.replace(BROADCAST, "contract.broadcast_gradint"))
    typo = CliRunner().invoke(main, ["check", "s.yaml"])
    assert typo.exit_code != 0 and "did you mean 'contract.broadcast_gradient'" in typo.output


def test_gradtool_list_shows_every_rule_with_its_severity():
    from gradtool.config.registry import RULES

    out = CliRunner().invoke(main, ["list", "--rules"])
    assert out.exit_code == 0
    for rule in RULES.values():
        assert rule.id in out.output
    rows = [line.split()[:2] for line in out.output.splitlines()]
    assert [BROADCAST, "warning"] in rows and ["contract.nonlinear", "failure"] in rows


def test_any_checks_rule_is_silenced_by_id_and_the_rest_still_fail():
    """ignore: works for every check's findings (layout, op checks), not only the contract's."""
    layouts = load_fixture("layouts")
    flat = gradtool.check(layouts.RowScaleFlat, ["4x5", "(5,)"], checks=("layout",))
    rules = {f.rule for f in result(flat, "layout").findings}
    assert outcomes(flat)["layout"] == "failed" and "layout.grad_output_strides" in rules
    silenced = gradtool.check(layouts.RowScaleFlat, ["4x5", "(5,)"], checks=("layout",),
                              ignore=tuple(rules))
    check = result(silenced, "layout")
    assert check.outcome.value == "passed" and check.findings == ()
    assert any("ignored by configuration" in d for d in check.details)
    partly = gradtool.check(layouts.RowScaleFlat, ["4x5", "(5,)"], checks=("layout",),
                            ignore=("layout.input_raises",))
    assert outcomes(partly)["layout"] == "failed"  # an unrelated id silences nothing here
    ops = load_fixture("custom_ops")
    fake = gradtool.check(ops.row_sum_bad_fake, ["3x4"], checks=("op_fake",))
    assert outcomes(fake)["op_fake"] == "failed"
    ids = tuple({f.rule for f in result(fake, "op_fake").findings})
    assert all(i.startswith("op_fake.") for i in ids)
    quiet = gradtool.check(ops.row_sum_bad_fake, ["3x4"], checks=("op_fake",), ignore=ids)
    assert outcomes(quiet)["op_fake"] == "passed"


def test_op_rule_ids_are_registered_for_ignore():
    from gradtool.config.registry import RULE_IDS

    assert {"op_fake.shape", "op_schema.undeclared_mutation", "op_autograd.missing",
            "op_compiled.gradients"} <= set(RULE_IDS)
    assert CheckConfig(ignore=("op_fake.shape",)).ignore == ("op_fake.shape",)
