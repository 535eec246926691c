"""Symbolic sizes (-i NxD) and sweeps (--sweep, sweep: in specs): one case per size."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from gradtool.cli.main import main
from gradtool.errors import InputError
from gradtool.spec.schema import load_text
from gradtool.targets.inputs import TensorSpec, parse_input
from gradtool.targets.sizes import (AWKWARD, MAX_CASES, Sweep, combinations, parse_sweep,
                                    sweep_cases)

TAIL = f"{FIXTURES}/layouts.py:RowSumTail"
TWIN = f"{FIXTURES}/layouts.py:RowSum"


def run(*args):
    return CliRunner().invoke(main, ["check", *args, "--no-isolate"])


def test_shapes_take_upper_case_size_symbols():
    assert parse_input("4xD") == TensorSpec((4, "D"))
    assert parse_input("NxD:float32").shape == ("N", "D")
    assert parse_input("(N, 3, D)").shape == ("N", 3, "D")
    assert parse_input("D:positive").shape == ("D",)
    assert parse_input("SEQ_LENx8").shape == ("SEQ_LEN", 8)
    assert parse_input("3x4").shape == (3, 4)


def test_sweep_values_parse_and_refuse_bad_ones():
    assert parse_sweep("D=15,16,17") == Sweep("D", (15, 16, 17))
    assert parse_sweep("D=awkward") == Sweep("D", AWKWARD, True)
    for bad in ("D", "D=", "d=3", "D=0", "D=1.5", "D=x"):
        with pytest.raises(InputError):
            parse_sweep(bad)


def test_several_sweeps_give_their_product_and_awkward_sets_keep_within_the_budget():
    combos = combinations(["N", "D"], [Sweep("N", (1, 3)), Sweep("D", (15, 16, 17))])
    assert len(combos) == 6 and combos[0] == {"N": 1, "D": 15}
    one = combinations(["D"], [Sweep("D", AWKWARD, True)])
    assert [c["D"] for c in one] == [1, 2, 3, 15, 16, 17, 31, 33]
    two = combinations(["N", "D"], [Sweep("N", AWKWARD, True), Sweep("D", AWKWARD, True)])
    assert len(two) <= MAX_CASES and {17, 16}.issubset({c["D"] for c in two})


def test_a_size_without_values_and_a_sweep_without_a_size_are_errors():
    with pytest.raises(InputError, match="size D in shape 4xD has no value"):
        sweep_cases([parse_input("4xD")], [])
    with pytest.raises(InputError, match="no input uses the size K"):
        sweep_cases([parse_input("4xD")], [Sweep("D", (3,)), Sweep("K", (3,))])
    assert sweep_cases([parse_input("3x4")], []) == []


def test_the_cli_names_the_sizes_that_fail_and_those_that_pass():
    result = run(TAIL, "-i", "4xD", "--sweep", "D=awkward", "-q")
    assert result.exit_code == 1
    line = next(x for x in result.output.splitlines() if x.startswith("SWEEP"))
    failed, passed = line.split(" — passed at ")
    assert "D=17" in failed and "D=33" in failed and "D=15" in failed
    assert passed == "D=16"
    assert "reproduce: gradtool check" in result.output and "-i 4x17" in result.output


def test_the_twin_passes_at_every_awkward_size_in_float32_too():
    result = run(TWIN, "-i", "NxD", "--sweep", "D=awkward", "--sweep", "N=1,2",
                 "--dtype", "float32", "-q")
    assert result.exit_code == 0, result.output
    assert "failed" not in result.output and "SWEEP" not in result.output


def test_a_sweep_with_a_reference_judges_the_low_precision_kernel_at_each_size():
    result = run(TAIL, "-i", "4xD", "--sweep", "D=16,17", "--dtype", "float32",
                 "--reference", f"{FIXTURES}/layouts.py:row_sum_reference")
    assert result.exit_code == 1
    assert "failed at D=17 — passed at D=16" in result.output
    assert "disagrees with the reference callable" in result.output


@pytest.mark.parametrize("args, message", [
    (["-i", "4xD"], "size D in shape 4xD has no value"),
    (["-i", "4xD", "--sweep", "D=3", "--sweep", "K=2"], "no input uses the size K"),
    (["-i", "4x5", "--sweep", "D=3"], "no shape uses a size name"),
    (["-i", "4xD", "--sweep", "D=0"], "'0' is not a positive integer size"),
    (["-i", "4xD", "--sweep", "D=3", "--sweep", "D=4"], "D is given twice"),
])
def test_bad_sweeps_exit_2_naming_the_fix(args, message):
    result = run(TWIN, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "hint:" in result.output


def test_a_spec_sweeps_its_sizes():
    result = run(f"{FIXTURES}/tail_block.yaml", "-q")
    assert result.exit_code == 1
    assert "SWEEP RowSumTail: failed at D=17; D=33 — passed at D=16" in result.output
    assert "SWEEP RowSum:" not in result.output


def test_spec_sweep_errors_name_the_file_and_line():
    text = ("version: 1\nspecs:\n  - target: layouts.py:RowSum\n"
            "    inputs: [{name: x, shape: [4, D]}]\n"
            "  - target: layouts.py:RowSumTail\n    inputs: [{name: x, shape: [4, N]}]\n"
            "    sweep: {N: [2], K: [1], D: 'many'}\n")
    with pytest.raises(Exception) as info:
        load_text(text, "s.yaml", FIXTURES)
    shown = str(info.value)
    assert "s.yaml:4: specs[0].sweep: size D in shape 4xD has no value" in shown
    assert "s.yaml:7: specs[1].sweep.D: sweep D: 'many' is not a positive integer" in shown
    specs = load_text("version: 1\nspecs:\n  - target: layouts.py:RowSum\n"
                      "    inputs: [{x: 'NxD'}]\n    sweep: {N: [2, 3], D: [16]}\n",
                      "s.yaml", FIXTURES)
    assert [c.label for c in specs[0].cases] == ["N=2, D=16", "N=3, D=16"]
    assert specs[0].cases[1].inputs[0].shape == (3, 16)


def test_a_sweep_given_for_a_spec_file_is_refused():
    result = run(f"{FIXTURES}/tail_block.yaml", "--sweep", "D=3")
    assert result.exit_code == 2 and "sweep:" in result.output
