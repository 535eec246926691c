"""Custom ops (torch.library) as targets: a correct op passes every check; each broken twin
fails exactly the check that names its mistake, in op terms, pointing at the right line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, ROOT, load_fixture, outcomes, result

import gradtool
from gradtool.errors import TargetError


@pytest.fixture(scope="module")
def ops():
    return load_fixture("custom_ops")


def line_of(text: str) -> str:
    lines = (FIXTURES / "custom_ops.py").read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if text in line)
    return f"tests/fixtures/custom_ops.py:{number}"


def rules(check) -> list[str]:
    return [f.rule for f in check.findings]


def test_correct_op_passes_every_check(ops):
    report = gradtool.check(ops.scale_mul)
    assert report.targets[0].kind == "op"
    assert outcomes(report) == dict.fromkeys(
        ["contract", "gradient", "double_backward", "op_schema", "op_fake", "op_autograd",
         "layout"], "passed")
    # inputs came from the schema: two tensors, and alpha's default
    infos = report.targets[0].cases[0].inputs
    assert [(i.name, i.differentiable) for i in infos] == [("x", True), ("y", True),
                                                          ("alpha", False)]
    assert "2.0" in infos[2].description


def test_op_overload_and_packet_are_targets(ops):
    for obj in (torch.ops.gt_ops_test.scale_mul, torch.ops.gt_ops_test.scale_mul.default):
        report = gradtool.check(obj, ["3x4", "3x4", 2.0], checks=["gradient", "op_schema"])
        assert outcomes(report) == {"gradient": "passed", "op_schema": "passed"}
        # named by its registration file and name: the reproduce command runs as printed
        assert report.targets[0].target == "tests/fixtures/custom_ops.py:gt_ops_test::scale_mul"


def test_wrong_backward_is_found_and_diagnosed(ops):
    report = gradtool.check(ops.scale_mul_bad_grad)
    found = outcomes(report)
    assert found["gradient"] == "failed"
    assert all(found[name] == "passed" for name in ("op_schema", "op_fake", "op_autograd"))
    gradient = result(report, "gradient")
    bad = [b for b in gradient.blocks if b.mismatched]
    assert [b.input for b in bad] == ["y"] and "factor 2" in bad[0].diagnosis


def test_fake_kernel_of_the_wrong_shape(ops):
    check = result(gradtool.check(ops.row_sum_bad_fake, ["3x4"]), "op_fake")
    assert check.outcome.value == "failed"
    assert rules(check) == ["op_fake.shape"]
    assert "shape 3x4, the real kernel 3" in check.summary
    assert check.source == line_of("def _row_sum_fake")


def test_fake_kernel_right_only_at_the_sampled_sizes(ops):
    report = gradtool.check(ops.col_sum_fixed_fake, ["3x4"])
    check = result(report, "op_fake")
    assert check.outcome.value == "failed", check
    assert rules(check) == ["op_fake.dynamic_shape"]
    assert "x 6x8" in check.summary and "the real kernel gives 8" in check.summary
    assert check.source == line_of("def _col_sum_fake")
    # at other sizes too: the static comparison alone passes a square sample
    assert outcomes(gradtool.check(ops.col_sum_fixed_fake, ["4x4"], checks=["op_fake"])) == \
        {"op_fake": "failed"}


def test_fake_that_specialises_on_a_size_is_no_finding(ops):
    check = result(gradtool.check(ops.squeeze_last, ["3x4"], checks=["op_fake"]), "op_fake")
    assert check.outcome.value == "passed", check


def test_undeclared_mutation_is_told_in_op_terms(ops):
    report = gradtool.check(ops.exp_inplace_undeclared, ["3x4"])
    check = result(report, "op_schema")
    assert rules(check) == ["op_schema.undeclared_mutation"]
    assert "mutates_args=('x',)" in check.summary
    assert check.source == line_of('@custom_op("gt_ops_test::exp_inplace_undeclared"')
    text = " ".join(c.summary + " ".join(c.details) for _, _, c in report.checks())
    assert "mark_dirty" not in text  # the advice for a Function does not apply to an op
    assert result(report, "contract").outcome.value == "passed"


def test_declared_mutation_passes(ops):
    report = gradtool.check(ops.halve_)
    assert result(report, "op_schema").outcome.value == "passed"
    assert "declared mutable: x" in result(report, "op_schema").summary
    assert result(report, "op_fake").outcome.value == "passed"


def test_output_aliasing_an_input(ops):
    check = result(gradtool.check(torch.ops.gt_ops_test.flatten_view, ["3x4"]), "op_schema")
    assert rules(check) == ["op_schema.aliasing_output"]
    assert "argument 'x'" in check.summary and "x.clone()" in check.summary
    # custom_op refuses it at every call: one finding, and the rest are not N raw errors
    report = gradtool.check(ops.identity_alias, ["3x4"])
    assert rules(result(report, "op_schema")) == ["op_schema.aliasing_output"]
    errors = [c for _, _, c in report.checks() if c.outcome.value == "error"]
    assert len(errors) <= 1


def test_missing_autograd_is_one_finding(ops):
    report = gradtool.check(ops.sin_no_autograd)
    found = outcomes(report)
    assert found["op_autograd"] == "failed"
    assert rules(result(report, "op_autograd")) == ["op_autograd.missing"]
    assert "sin_no_autograd.register_autograd" in result(report, "op_autograd").summary
    for name in ("contract", "gradient", "double_backward"):
        assert found[name] == "skipped"
        assert "no autograd formula (see op_autograd)" in result(report, name).summary
    assert "error" not in found.values()


def test_missing_fake_kernel(ops):
    check = result(gradtool.check(torch.ops.gt_ops_test.triple_nofake, ["3x4"],
                                  checks=["op_fake"]), "op_fake")
    assert rules(check) == ["op_fake.missing"] and "register_fake" in check.summary


def test_low_precision_against_float64(ops):
    report = gradtool.check(ops.scale_mul, ["3x4", "3x4", 2.0], dtype="float32",
                            checks=["gradient"])
    assert outcomes(report) == {"gradient": "passed"}
    assert "float64" in result(report, "gradient").summary


def test_op_checks_skip_other_targets(ops):
    report = gradtool.check(ops.Gate, ["3x4"], checks=["op_schema", "op_fake"])
    assert {c.summary for _, _, c in report.checks()} == {"not a custom op (torch.library)"}


def test_wrong_op_inside_a_model_is_named(ops):
    report = gradtool.check(ops.GateBadOp, ["3x4"])
    check = result(report, "gradient")
    assert check.outcome.value == "failed"
    site = line_of("return scale_mul_bad_grad(")
    assert any(f"gt_ops_test::scale_mul_bad_grad at {site} is wrong w.r.t. y" in d
               for d in check.details), check.details
    assert check.source == line_of("def _bad_backward")
    assert outcomes(gradtool.check(ops.Gate, ["3x4"]))["gradient"] == "passed"


def test_inner_op_contract_in_a_model(ops):
    check = result(gradtool.check(ops.GateNoFake, ["3x4"]), "contract")
    assert check.outcome.value == "failed"
    assert check.summary.startswith(f"gt_ops_test::row_sum_bad_fake at "
                                    f"{line_of('return row_sum_bad_fake(')}: ")
    assert "fake kernel" in check.summary and check.source == line_of("def _row_sum_fake")
    assert result(gradtool.check(ops.Gate, ["3x4"]), "contract").outcome.value == "passed"


def test_schema_that_says_too_little(ops):
    rejected = gradtool.check(ops.sum_dims).rejected
    assert "(dims: List[int] without a default)" in rejected[0].message
    assert "-i" in rejected[0].message
    report = gradtool.check(ops.sum_dims, ["3x4", [0]], checks=["gradient", "op_fake"])
    assert outcomes(report) == {"gradient": "skipped", "op_fake": "failed"}  # given: it runs
    assert [i.name for i in report.targets[0].cases[0].inputs] == ["x", "dims[0]"]


def test_qualified_names_and_file_discovery(ops):
    path = str(FIXTURES / "custom_ops.py")
    report = gradtool.check(f"{path}:gt_ops_test::scale_mul", checks=["op_schema"])
    assert report.targets[0].target.endswith("custom_ops.py:gt_ops_test::scale_mul")
    with pytest.raises(TargetError, match="no op gt_ops_test::nothere is registered"):
        gradtool.check(f"{path}:gt_ops_test::nothere")
    from gradtool.targets.resolve import resolve

    names = [t.name.split(".py:")[1] for t in resolve(path) if t.kind.op]
    assert {"scale_mul", "halve_", "gt_ops_test::flatten_view"} <= set(names)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradtool", *args], capture_output=True,
                          text=True, cwd=FIXTURES, env={"OMP_NUM_THREADS": "1", "PATH": ""},
                          timeout=300)


def test_cli_import_list_and_no_vmap_notice():
    listed = _cli("list", "--import", "custom_ops.py", "gt_ops_test::scale_mul",
                  "gt_ops_test::missing")
    assert listed.returncode == 2, listed.stderr
    assert "custom_ops.py:gt_ops_test::scale_mul  [op]" in listed.stdout
    assert "checks: contract, gradient, double_backward, op_schema, op_fake, op_autograd" \
        in listed.stdout
    assert "REJECTED gt_ops_test::missing: no op gt_ops_test::missing is registered" \
        in listed.stdout
    ran = _cli("check", "custom_ops.py:scale_mul", "-i", "3x4", "-i", "3x4")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "performance drop" not in ran.stdout + ran.stderr
    assert ROOT.exists()


def test_op_compiled_is_opcheck_in_gradtool_words(ops):
    assert outcomes(gradtool.check(ops.scale_mul, ["3x4", "3x4"], checks=["op_compiled"])) == \
        {"op_compiled": "passed"}
    check = result(gradtool.check(ops.row_sum_bad_fake, ["3x4"], checks=["op_compiled"]),
                   "op_compiled")
    assert check.outcome.value == "failed"
    assert rules(check) == ["op_compiled.fails"]
    assert check.summary.startswith("gt_ops_test::row_sum_bad_fake fails under torch.compile")


def test_list_says_which_op_checks_apply(ops):
    from gradtool.cli.listing import list_lines
    from gradtool.config.settings import CheckConfig
    from gradtool.run.collect import target_jobs

    config = CheckConfig()
    path = str(FIXTURES / "custom_ops.py")
    lines = list(list_lines(target_jobs(f"{path}:sin_no_autograd", config, None)
                            + target_jobs(f"{path}:Gate", config, None), [], config))
    assert "checks: op_schema, op_fake, op_autograd; not applicable: contract, gradient, " \
        "double_backward, layout: not run: gt_ops_test::sin_no_autograd has no autograd " \
        "formula" \
        in lines[2]
    assert "op_" not in lines[5]  # not an op: the op checks are not even mentioned


@pytest.mark.parametrize("text, message", [
    ("op: gt_ops_test::scale_mul\n    import: custom_ops.py", None),
    ("op: scale_mul\n    import: custom_ops.py", "expected an op name ns::name"),
    ("target: custom_ops.py:Gate\n    import: custom_ops.py", "import: goes with op:"),
    ("op: gt_ops_test::scale_mul\n    import: ../custom_ops.py", "outside the spec's folder"),
    ("op: gt_ops_test::scale_mul\n    expr: x", "exactly one of target:"),
])
def test_spec_op_and_import_keys(text, message):
    from gradtool.errors import SpecError
    from gradtool.spec.schema import load_text

    spec = f"version: 1\nspecs:\n  - {text}\n"
    if message is None:
        (loaded,) = load_text(spec, "ops.yaml", FIXTURES)
        assert loaded.target == f"{FIXTURES / 'custom_ops.py'}:gt_ops_test::scale_mul"
        assert loaded.name == "scale_mul"
        return
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        load_text(spec, "ops.yaml", FIXTURES)
