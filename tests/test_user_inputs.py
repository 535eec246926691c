"""Inputs as users have them: given tensors, nested and keyword arguments, factories, --init."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import FIXTURES, load_fixture

import gradtool
from gradtool.cli.main import main
from gradtool.errors import InputError
from gradtool.targets.inputs import LiteralSpec, TensorSpec, parse_input
from gradtool.targets.values import Keyword, ValueSpec

F = f"{FIXTURES}/user_inputs.py"
SPEC = f"{FIXTURES}/user_inputs.yaml"


@pytest.fixture
def fx():
    return load_fixture("user_inputs")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def failed_inputs(report) -> set[str]:
    """Input names of every mismatched block of a failed gradient check."""
    return {b.input for _, _, k in report.checks() if k.name == "gradient"
            for b in k.blocks if b.mismatched}


def test_given_tensors_decide_pass_or_fail_and_stay_untouched(fx, monkeypatch):
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # outside a test, reproduce: is --inputs-from
    x = torch.rand(3, 4, dtype=torch.float64) + 0.5
    before = x.clone()
    assert gradtool.check(fx.SquareWrongWhenNegative, (x,)).ok()
    negative = -x
    report = gradtool.check(fx.SquareWrongWhenNegative, (negative,))
    assert not report.ok() and failed_inputs(report) == {"x"}
    assert torch.equal(x, before) and torch.equal(negative, -before)
    assert x.grad is None and negative.grad is None and not x.requires_grad
    case = report.targets[0].cases[0]
    assert case.inputs[0].description.startswith("given 3x4:float64 #")
    assert "--inputs-from" in case.reproduce


def test_given_tensor_that_requires_grad_gets_no_grad(fx):
    x = (torch.rand(3, 4, dtype=torch.float64) + 0.5).requires_grad_()
    assert gradtool.check(fx.SquareWrongWhenNegative, x).ok()
    assert x.grad is None and x.is_leaf


def test_gradcheck_convention_picks_the_checked_tensors(fx):
    x = torch.rand(3, 4, dtype=torch.float64).requires_grad_()
    w = torch.randn(3, 4, dtype=torch.float64)
    report = gradtool.check(fx.ScaleByWWrongW, (x, w))  # w.requires_grad False: x only
    assert report.ok()
    infos = {i.name: i.differentiable for i in report.targets[0].cases[0].inputs}
    assert infos == {"x": True, "w": False}
    w.requires_grad_()
    report = gradtool.check(fx.ScaleByWWrongW, (x, w))
    assert not report.ok() and failed_inputs(report) == {"w"}
    # None requires grad: every floating tensor is checked (gradcheck would refuse; we check all)
    plain = gradtool.check(fx.ScaleByWWrongW, (x.detach(), w.detach()))
    assert failed_inputs(plain) == {"w"}
    assert gradtool.check(fx.ScaleByW, (x, w)).ok()


def test_given_float32_values_run_at_float32_tolerances(fx):
    x = torch.rand(3, 4) + 0.5
    report = gradtool.check(fx.SquareWrongWhenNegative, (x,))
    assert report.ok() and report.config["dtype"] == "float32"


def test_nested_argument_through_the_api_names_leaves_by_path(fx):
    t = lambda: torch.randn(2, 4, dtype=torch.float64)  # noqa: E731
    good = gradtool.check(fx.Cell, (t(), (t(), t())))
    assert good.ok()
    names = [i.name for i in good.targets[0].cases[0].inputs]
    assert names == ["x", "state[0]", "state[1]", "linear.weight", "linear.bias"]
    assert all(i.differentiable for i in good.targets[0].cases[0].inputs)
    bad = gradtool.check(fx.CellWrongH, ["2x4", ("2x4", "2x4")])
    assert failed_inputs(bad) == {"state[0]"}


def test_keyword_tensor_through_the_api(fx):
    assert gradtool.check(fx.Masked, ["2x4"], kwargs={"mask": "2x4"}).ok()
    mask = torch.rand(2, 4, dtype=torch.float64)
    report = gradtool.check(fx.MaskedWrongMask, [torch.randn(2, 4, dtype=torch.float64)],
                            kwargs={"mask": mask})
    assert failed_inputs(report) == {"mask"} and mask.grad is None


def test_assert_gradients_takes_values_and_kwargs(fx):
    from gradtool.testing import assert_gradients

    assert_gradients(fx.Masked, [torch.randn(2, 4, dtype=torch.float64)],
                     kwargs={"mask": torch.rand(2, 4, dtype=torch.float64)})
    with pytest.raises(AssertionError, match="'mask'"):
        assert_gradients(fx.MaskedWrongMask, ["2x4"], kwargs={"mask": "2x4"})


def test_cli_nested_and_keyword_inputs(fx):
    ok = run("check", f"{F}:Cell", "-i", "2x4", "-i", "(2x4, 2x4)")
    assert ok.exit_code == 0, ok.output
    bad = run("check", f"{F}:CellWrongH", "-i", "2x4", "-i", "state=(2x4, 2x4)",
              "--format", "json", "--check", "gradient")
    assert bad.exit_code == 1
    data = json.loads(bad.output)
    blocks = data["targets"][0]["cases"][0]["checks"][0]["blocks"]
    assert {b["input"] for b in blocks if b["mismatched"]} == {"state[0]"}
    assert run("check", f"{F}:Masked", "-i", "2x4", "-i", "mask=2x4").exit_code == 0
    wrong = run("check", f"{F}:MaskedWrongMask", "-i", "2x4", "-i", "mask=2x4", "--check",
                "gradient")
    assert wrong.exit_code == 1 and "w.r.t. 'mask'" in wrong.output
    assert "-i mask=2x4" in wrong.output  # the reproduce command keeps the keyword form


def test_junit_names_the_path(tmp_path):
    xml = tmp_path / "j.xml"
    run("check", f"{F}:CellWrongH", "-i", "2x4", "-i", "(2x4, 2x4)", "--junit-xml", str(xml))
    assert "state[0]" in xml.read_text()


def test_cli_bad_nested_or_keyword_input_is_exit_2():
    unclosed = run("check", f"{F}:Cell", "-i", "2x4", "-i", "state=(2x4, 2x4")
    assert unclosed.exit_code == 2 and "state=(2x4, 2x4" in unclosed.output
    typo = run("check", f"{F}:Cell", "-i", "2x4", "-i", "stat=(2x4, 2x4)")
    assert typo.exit_code == 2 and "did you mean 'state'" in typo.output
    assert "NAME=SPEC" in typo.output
    bad_key = run("check", f"{F}:Cell", "-i", "2x4", "-i", "{w 3x4}")
    assert bad_key.exit_code == 2 and "'key: SPEC'" in bad_key.output


def test_parse_nested_keyword_and_unchanged_forms():
    assert parse_input("(3,4)") == TensorSpec((3, 4))
    assert parse_input("=(1,2)") == LiteralSpec((1, 2))
    assert parse_input("[-1, 1]") == LiteralSpec([-1, 1])
    assert parse_input("(2x4, 2x4:nograd)") == (TensorSpec((2, 4)),
                                                 TensorSpec((2, 4), requires_grad=False))
    assert parse_input("[(2,), (3,):[-1,1]]")[1].domain.kind == "range"
    assert parse_input("{'w': 3x4, b: 5}") == {"w": TensorSpec((3, 4)), "b": LiteralSpec(5)}
    assert parse_input("mask=3x4:nograd") == Keyword("mask", TensorSpec((3, 4),
                                                                        requires_grad=False))
    assert parse_input("(2x4,)") == (TensorSpec((2, 4)),)
    with pytest.raises(InputError):
        parse_input("(2x4, bogus:positive)")


def test_spec_nested_keyword_and_factory():
    result = run("check", SPEC, "--format", "json")
    data = json.loads(result.output)
    outcome = {t["target"]: {k["name"]: k["outcome"] for c in t["cases"] for k in c["checks"]}
               for t in data["targets"]}
    assert outcome["Cell"] == outcome["Masked"] == outcome["UnitNormalize"] == {
        "contract": "passed", "gradient": "passed", "double_backward": "passed",
        "layout": "passed"}
    assert outcome["CellWrongH"]["gradient"] == "failed"
    assert outcome["MaskedWrongMask"]["gradient"] == "failed"
    assert outcome["UnitNormalize on random inputs"]["gradient"] == "failed"
    failed = {t["target"]: {b["input"] for c in t["cases"] for k in c["checks"]
                            for b in k["blocks"] if b["mismatched"]} for t in data["targets"]}
    assert failed["CellWrongH"] == {"state[0]"} and failed["MaskedWrongMask"] == {"mask"}


def test_spec_factory_that_raises_is_rejected(tmp_path):
    (tmp_path / "user_inputs.py").write_text((FIXTURES / "user_inputs.py").read_text())
    (tmp_path / "s.yaml").write_text("version: 1\nspecs:\n  - target: user_inputs.py:UnitNormalize"
                                     "\n    inputs_from: user_inputs.py:raising_factory\n")
    result = run("check", str(tmp_path / "s.yaml"))
    assert result.exit_code == 2
    assert "raising_factory" in result.output and "the dataset is missing" in result.output
    (tmp_path / "t.yaml").write_text("version: 1\nspecs:\n  - target: user_inputs.py:Masked\n"
                                     "    inputs: [{x: 2x4}]\n    inputs_from: nowhere.pt\n")
    clash = run("check", str(tmp_path / "t.yaml"))
    assert clash.exit_code == 2 and "not both" in clash.output


def test_inputs_from_factory_passes_where_random_inputs_fail():
    assert run("check", f"{F}:UnitNormalize", "--inputs-from", f"{F}:unit_vectors"
               ).exit_code == 0
    assert run("check", f"{F}:UnitNormalize", "-i", "3x4").exit_code == 1
    named = run("check", f"{F}:UnitNormalize", "--inputs-from", f"{F}:unit_cases")
    assert named.exit_code == 0 and "8 passed" in named.output  # 2 cases x 4 checks


def test_factory_that_raises_or_returns_junk_is_exit_2_and_named():
    raised = run("check", f"{F}:UnitNormalize", "--inputs-from", f"{F}:raising_factory")
    assert raised.exit_code == 2
    assert "raising_factory (" in raised.output and "user_inputs.py:" in raised.output
    assert "RuntimeError: the dataset is missing" in raised.output
    junk = run("check", f"{F}:UnitNormalize", "--inputs-from", f"{F}:junk_factory")
    assert junk.exit_code == 2 and "returned int 42; expected a tuple" in junk.output
    both = run("check", f"{F}:UnitNormalize", "--inputs-from", f"{F}:unit_vectors", "-i", "3x4")
    assert both.exit_code == 2 and "not both" in both.output
    missing = run("check", f"{F}:UnitNormalize", "--inputs-from", "nowhere.pt")
    assert missing.exit_code == 2 and "file not found" in missing.output


def test_save_inputs_replays_the_same_values(tmp_path, fx):
    saved = tmp_path / "in.pt"
    first = run("check", f"{F}:CellWrongH", "-i", "2x4", "-i", "state=(2x4, 2x4)",
                "--save-inputs", str(saved), "--check", "gradient")
    assert first.exit_code == 1
    args, kwargs = torch.load(saved, weights_only=True)
    assert len(args) == 1 and set(kwargs) == {"state"} and len(kwargs["state"]) == 2
    replay = run("check", f"{F}:CellWrongH", "--inputs-from", str(saved), "--check",
                 "gradient")
    assert replay.exit_code == 1 and "w.r.t. 'state[0]'" in replay.output
    assert f"--inputs-from {saved}" in replay.output  # reproduce names the file
    # the same numbers: the worst element reads identically
    line = next(t for t in first.output.splitlines() if "max abs diff" in t)
    assert line in replay.output


def test_init_checks_lstmcell_and_multihead_attention():
    lstm = run("check", "torch.nn:LSTMCell", "--init", "input_size=3", "--init",
               "hidden_size=4", "-i", "2x3", "--check", "gradient")
    assert lstm.exit_code == 0, lstm.output
    nested = run("check", "torch.nn:LSTMCell", "--init", "input_size=3", "--init",
                 "hidden_size=4", "-i", "2x3", "-i", "(2x4, 2x4)", "--format", "json",
                 "--check", "gradient")
    names = [i["name"] for i in json.loads(nested.output)["targets"][0]["cases"][0]["inputs"]]
    assert names[:3] == ["input", "hx[0]", "hx[1]"] and "weight_ih" in names
    mha = run("check", "torch.nn:MultiheadAttention", "--init", "embed_dim=4", "--init",
              "num_heads=2", "--init", "batch_first=True", "-i", "2x3x4", "-i", "2x3x4", "-i",
              "2x3x4", "--check", "gradient")
    assert mha.exit_code == 0, mha.output


def test_init_refuses_non_literals_and_non_module_classes():
    evil = run("check", "torch.nn:LSTMCell", "--init", "input_size=__import__('os')")
    assert evil.exit_code == 2 and "not a Python literal" in evil.output
    shape = run("check", "torch.nn:LSTMCell", "--init", "input_size")
    assert shape.exit_code == 2 and "NAME=VALUE" in shape.output
    function = run("check", f"{F}:ScaleByW", "--init", "a=1", "-i", "3", "-i", "3")
    assert function.exit_code == 2 and "nn.Module class" in function.output


def test_given_values_mix_with_inputs_sampled_explicitly(fx):
    w = torch.randn(3, 4, dtype=torch.float64)
    report = gradtool.check(fx.ScaleByW, [gradtool.sample("3x4"), w])
    infos = report.targets[0].cases[0].inputs
    assert report.ok() and infos[0].description == "3x4:float64"
    assert infos[1].description.startswith("given 3x4:float64 #")
    assert isinstance(ValueSpec(w).describe(), str)


@pytest.mark.parametrize("text", ["3x4", "5", "None", "replicate"])
def test_a_string_beside_a_given_tensor_is_passed_as_is(text):
    seen = []

    def fn(x, mode):
        seen.append(mode)
        return x * 2

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    report = gradtool.check(fn, (x, text), checks=("gradient",))
    assert report.ok(), report
    assert seen and all(m == text for m in seen)
    assert gradtool.gradcheck(fn, (x, text)) is True


def test_readme_input_examples_run(tmp_path, monkeypatch):
    import re
    import shlex

    from conftest import ROOT

    readme = (ROOT / "docs" / "inputs.md").read_text()
    block = re.search(r"## Your own inputs.*?```bash\n(.*?)```", readme, re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith("gradtool")]
    assert len(commands) == 7
    monkeypatch.chdir(ROOT)
    for argv in commands:
        argv = [str(tmp_path / a) if a == "cell.pt" else a for a in argv]
        result = run(*argv[1:], "--check", "gradient")
        assert result.exit_code == 0, (argv, result.output)


def test_inference_tries_a_tuple_where_forward_says_so():
    from conftest import EXAMPLES

    report = gradtool.check(f"{EXAMPLES}/inputs.py:GatedCell")
    case = report.targets[0].cases[0]
    assert report.ok() and case.inferred
    assert [i.name for i in case.inputs][:3] == ["x", "state[0]", "state[1]"]
    assert "-i '(3x4, 3x4)'" in case.pin
    hint = run("check", f"{F}:RejectsEverything")
    assert hint.exit_code == 2 and "-i 3x4 -i '(3x4, 3x4)'" in hint.output


def test_pytest_fixture_takes_tensors_and_kwargs(gradtool_check, fx):
    x, mask = torch.randn(2, 4, dtype=torch.float64), torch.rand(2, 4, dtype=torch.float64)
    assert gradtool_check(fx.Masked, [x], kwargs={"mask": mask}).ok()
    with pytest.raises(pytest.fail.Exception, match="w.r.t. 'mask'"):
        gradtool_check(fx.MaskedWrongMask, [x], kwargs={"mask": mask})
    assert mask.grad is None


def test_a_layout_neither_strided_nor_sparse_is_refused_naming_it():
    mkldnn = torch.ones(2, 3).to_mkldnn()
    with pytest.raises(InputError, match="_mkldnn: gradtool checks strided and sparse") as info:
        gradtool.check(torch.sin, [mkldnn])
    assert "to_dense()" in str(info.value)


def test_a_report_reads_as_the_plain_report_the_command_line_prints(fx):
    """print(report) in a script shows what `gradtool check` prints, not the dataclass."""
    from gradtool.render.terminal import render_plain

    report = gradtool.check(fx.MaskedWrongMask, ["2x4"], kwargs={"mask": "2x4"})
    assert str(report) == render_plain(report) == report.text()
    assert str(report).startswith("PASS") or str(report).startswith("FAIL")
    assert "'mask'" in str(report) and "Report(" not in str(report)
    assert report.text(verbose=True) == render_plain(report, verbose=True)
    assert "time:" in report.text(verbose=True) and "time:" not in str(report)


def test_a_floating_tensor_left_unchecked_by_gradcheck_s_rule_is_said(fx):
    """Forgetting requires_grad on one tensor while another has it leaves it unchecked (as
    gradcheck does): a wrong gradient for it passes, so the report says so."""
    x = torch.randn(2, 4, dtype=torch.float64)
    mask = torch.rand(2, 4, dtype=torch.float64, requires_grad=True)
    report = gradtool.check(fx.Masked, [x], kwargs={"mask": mask})
    (_, case, _), *_ = report.checks()
    assert any(n.startswith("'x' not checked: it does not require grad while another given "
                            "tensor does") for n in case.notes), case.notes
    both = gradtool.check(fx.Masked, [x.requires_grad_(True)], kwargs={"mask": mask})
    (_, case, _), *_ = both.checks()
    assert not any("not checked" in n for n in case.notes)


def test_usage_hints_for_integer_and_sparse_arguments():
    """A forward that wants token ids says how to give integers; a sparse option on --input
    says how to give sparse tensors (both exit 2)."""
    target = f"{FIXTURES}/sparse_functions.py:SparseEmbedding"
    inferred = run("check", target)
    assert inferred.exit_code == 2
    assert "-i 2x5:integer[0,9]" in inferred.output
    assert run("check", target, "-i", "2x5:integer[0,9]").exit_code == 0
    sparse = run("check", target, "-i", "4x4:sparse_coo")
    assert sparse.exit_code == 2
    assert "--input samples strided tensors only, not 'sparse_coo'" in sparse.output
    assert "--inputs-from INPUTS.pt" in sparse.output


class PairModule(torch.nn.Module):
    """A module with a parameter taking a tuple and a literal: several leaves per argument."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4, dtype=torch.float64))

    def forward(self, pair, k=3):
        a, b = pair
        return (a * self.w + b) * k


def test_a_module_takes_nested_arguments_and_literals_beside_its_parameters():
    """Its parameters are bound after the flat leaves (an internal error before: the literal
    4 was bound to the parameter w)."""
    a, b = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for report in (gradtool.check(PairModule(), [(a, b), 4]),
                   gradtool.check(PairModule(), [(a, b)], kwargs={"k": 2})):
        assert report.ok(), report.text()
        blocks = {blk.input for _, _, c in report.checks() if c.name == "gradient"
                  for blk in c.blocks}
        assert blocks == {"pair[0]", "pair[1]", "w"}
