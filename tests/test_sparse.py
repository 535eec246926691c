"""Sparse inputs, outputs and gradients: gradcheck's masked semantics, seeded sparse Functions,
models with sparse gradients inside."""

from __future__ import annotations

import pytest
import torch

import gradtool
from conftest import FIXTURES, load_fixture, outcomes, result

LAYOUTS = {"coo": torch.sparse_coo, "csr": torch.sparse_csr}


@pytest.fixture(scope="module")
def fx():
    return load_fixture("sparse_functions")


def rules(report, check: str = "gradient") -> set[str]:
    return {f.rule for f in result(report, check).findings}


@pytest.mark.parametrize("name, layout", [("SparseMatmul", "coo"), ("SparseMatmul", "csr"),
                                          ("SparseSolve", "csr"), ("SparseSolve", "coo")])
def test_correct_sparse_functions_pass_under_masked_semantics(fx, name, layout):
    a, b = fx.operands(LAYOUTS[layout])
    report = gradtool.check(getattr(fx, name), [a, b], masked=True)
    assert outcomes(report)["gradient"] == "passed"
    assert report.ok()
    assert a.grad is None and a.layout == LAYOUTS[layout]  # the user's tensor untouched
    case = report.targets[0].cases[0]
    assert any("specified elements (masked)" in note for note in case.notes)
    layout = result(report, "layout")  # b moved to other strides; a, rebuilt sparse, is not
    assert layout.outcome.value == "passed" and "'b'" in layout.summary
    assert "'a'" not in layout.summary and "'t'" not in layout.summary


@pytest.mark.parametrize("name, kind", [
    ("FactorMatmul", "gradient.factor"), ("TransposedMatmul", "gradient.transposed"),
    ("DroppedMatmul", "gradient.mismatch"), ("FactorSolve", "gradient.factor"),
    ("TransposedSolve", "gradient.transposed"), ("DroppedSolve", "gradient.mismatch")])
def test_seeded_sparse_bugs_fail_under_gradient_with_their_diagnosis(fx, name, kind):
    a, b = fx.operands(torch.sparse_coo if "Matmul" in name else torch.sparse_csr)
    report = gradtool.check(getattr(fx, name), [a, b], masked=True)
    assert outcomes(report)["gradient"] == "failed"
    assert kind in rules(report)
    assert result(report, "contract").outcome.value == "passed"  # backward's algebra is fine


def test_backward_is_not_tried_batched_on_sparse_inputs(fx):
    # vmap batches no sparse tensor: a batched try would cost a backward of the user's and fail
    # every time. One backward per output element, all counted, none wasted.
    seen = []

    class Counted(fx.SparseMatmul):
        @staticmethod
        def backward(ctx, g):
            seen.append(g.shape)
            return fx.SparseMatmul.backward(ctx, g)

    a, b = fx.operands(torch.sparse_coo, n=4)
    report = gradtool.check(Counted, [a, b], masked=True, checks=["gradient"], mode="full")
    assert outcomes(report)["gradient"] == "passed"
    assert result(report, "gradient").calls["backward"] == len(seen) == 4 * 3
    assert set(seen) == {(4, 3)}


def test_dropped_terms_are_found_where_they_were_dropped(fx):
    a, b = fx.operands(torch.sparse_coo)
    matmul = result(gradtool.check(fx.DroppedMatmul, [a, b], masked=True), "gradient")
    assert [blk.input for blk in matmul.blocks if blk.mismatched] == ["b"]  # the skip's term
    a, b = fx.operands(torch.sparse_csr)
    solve = result(gradtool.check(fx.DroppedSolve, [a, b], masked=True), "gradient")
    assert [blk.input for blk in solve.blocks if blk.mismatched] == ["t"]


@pytest.mark.parametrize("masked", [False, True])
def test_verdicts_follow_gradcheck_in_both_semantics(fx, masked):
    for name in ("SparseMatmul", "FactorMatmul"):
        a, b = fx.operands(torch.sparse_coo)
        theirs = torch.autograd.gradcheck(getattr(fx, name).apply, (a, b), masked=masked,
                                          check_undefined_grad=False, raise_exception=False)
        ours = gradtool.check(getattr(fx, name), [a, b], masked=masked)
        assert (result(ours, "gradient").outcome.value == "passed") == theirs, (name, masked)


def test_unmasked_failure_of_a_pattern_gradient_says_how_to_compare_specified_elements(fx):
    a, b = fx.operands(torch.sparse_coo)
    gradient = result(gradtool.check(fx.SparseMatmul, [a, b]), "gradient")
    assert gradient.outcome.value == "failed"
    assert [blk.input for blk in gradient.blocks if blk.mismatched] == ["a"]
    assert any("masked=True" in line for line in gradient.details)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
@pytest.mark.parametrize("masked", [False, True])
def test_every_layout_is_rebuilt_in_kind_and_judged_as_gradcheck_judges_it(layout, masked):
    # to_dense(masked_grad=m) keeps its gradient on the pattern (m) or not. Unmasked, every
    # element counts: only the full gradient is right, for gradcheck and gradtool alike.
    # Masked, the unspecified elements' gradients are ignored (gradcheck's documented meaning;
    # its implementation compares them with zero, so it fails masked_grad=False there).
    dense = torch.arange(1.0, 13.0, dtype=torch.float64).reshape(3, 4)
    dense[0, 1] = dense[2, 2] = 0
    dense[1, :2] = 0  # a whole 1x2 block: unspecified in BSR too
    layouts = {**LAYOUTS, "csc": torch.sparse_csc, "bsr": torch.sparse_bsr}
    given = dense.to_sparse(layout=layouts[layout],
                            blocksize=(1, 2) if layout == "bsr" else None).requires_grad_(True)
    for masked_grad in (False, True):
        seen = []

        def scaled(x, masked_grad=masked_grad, seen=seen):
            seen.append(x.layout)
            return x.to_dense(masked_grad=masked_grad) * 3

        report = gradtool.check(scaled, [given], masked=masked)
        right = masked or not masked_grad
        assert (outcomes(report)["gradient"] == "passed") == right
        assert set(seen) == {layouts[layout]}
        if layout == "coo" and (masked_grad or not masked):
            assert torch.autograd.gradcheck(scaled, (given,), masked=masked,
                                            check_undefined_grad=False,
                                            raise_exception=False) == right
    assert outcomes(report)["double_backward"] == "skipped"
    assert "sparse" in result(report, "double_backward").summary


def test_a_sparse_output_is_compared_as_the_dense_tensor_it_stands_for():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    report = gradtool.check(lambda x: (x * x).to_sparse(), [x])
    assert outcomes(report)["gradient"] == "passed"
    assert report.ok()


def test_a_sparse_gradient_for_a_dense_input_is_legal(fx):
    report = gradtool.check(fx.SparseEmbedding(), [torch.tensor([[1, 2, 1], [3, 3, 0]])])
    assert report.ok(), outcomes(report)
    gradient = result(report, "gradient")
    assert "emb.weight" in {blk.input for blk in gradient.blocks}


def test_torch_sparse_mm_inside_a_module_is_checked_by_parameter_name(fx):
    report = gradtool.check(fx.GraphConv(), ["5x3"])
    assert report.ok(), outcomes(report)
    assert {blk.input for blk in result(report, "gradient").blocks} == {"x", "weight"}


def test_a_wrong_sparse_function_inside_a_model_is_named(fx):
    assert gradtool.check(fx.graph_conv_right(), ["5x3"]).ok()
    gradient = result(gradtool.check(fx.graph_conv_dropped(), ["5x3"]), "gradient")
    assert gradient.outcome.value == "failed"
    assert any("DroppedMatmul" in line and "w.r.t. b" in line for line in gradient.details)


def test_the_command_line_replays_sparse_inputs_masked_or_not(fx, tmp_path):
    from click.testing import CliRunner

    from gradtool.cli.main import main

    a, b = fx.operands(torch.sparse_coo)
    saved = tmp_path / "inputs.pt"
    torch.save(((a.detach(), b.detach()), {}), saved)  # torch.save drops a sparse requires_grad
    target = f"{FIXTURES}/sparse_functions.py:SparseMatmul"
    args = ["check", target, "--inputs-from", str(saved), "--no-isolate", "--check", "gradient"]
    masked = CliRunner().invoke(main, [*args, "--masked"])
    assert masked.exit_code == 0, masked.output
    assert "a: sparse_coo, specified elements (masked) compared" in masked.output
    unmasked = CliRunner().invoke(main, args)
    assert unmasked.exit_code == 1, unmasked.output
    assert "--masked" in unmasked.output


def test_saved_inputs_keep_their_sparse_layout(fx, tmp_path):
    from click.testing import CliRunner

    from gradtool.cli.main import main

    a, b = fx.operands(torch.sparse_csr)
    given = tmp_path / "given.pt"
    torch.save(((a.detach(), b.detach()), {}), given)
    target = f"{FIXTURES}/sparse_functions.py:SparseSolve"
    saved = tmp_path / "saved.pt"
    out = CliRunner().invoke(main, ["check", target, "--inputs-from", str(given), "--masked",
                                    "--save-inputs", str(saved), "--no-isolate"])
    assert out.exit_code == 0, out.output
    (args, _), = [torch.load(saved, weights_only=True)]
    assert args[0].layout == torch.sparse_csr
    assert torch.equal(args[0].to_dense(), a.detach().to_dense())


def _specified_half() -> torch.Tensor:
    dense = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return dense * (dense.abs() > 0.5)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("given", [
    pytest.param(lambda: torch.randn(3, 4, 2, dtype=torch.float64).to_sparse(sparse_dim=2),
                 id="hybrid_coo"),
    pytest.param(lambda: torch.sparse_coo_tensor([[0, 0, 1], [1, 1, 2]], [1.0, 2.0, 3.0], (2, 3),
                                                 dtype=torch.float64), id="uncoalesced_coo"),
    pytest.param(lambda: _specified_half().float().to_sparse_csr(), id="float32_csr"),
    pytest.param(lambda: _specified_half().to_sparse_bsc((1, 2)), id="bsc")])
def test_other_sparse_tensors_are_checked_too(given, masked):
    report = gradtool.check(lambda x: x.to_dense(masked_grad=masked).sin(),
                            [given().requires_grad_(True)], masked=masked)
    assert outcomes(report)["gradient"] == "passed"


def test_a_complex_sparse_input_is_compared_masked_and_refused_unmasked_saying_why():
    z = (_specified_half() * (1 + 1j)).to_sparse().requires_grad_(True)
    masked = gradtool.check(lambda x: x.to_dense() * 2, [z], masked=True)
    assert outcomes(masked)["complex"] == "passed"
    assert outcomes(masked)["double_backward"] == "skipped"
    unmasked = gradtool.check(lambda x: x.to_dense() * 2, [z])
    assert not unmasked.targets and "masked=True" in unmasked.rejected[0].message
    # torch has no autograd for building a complex compressed tensor: refused, saying how
    # (an internal error before), for a model's inner Function too
    for layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr):
        blocks = {"blocksize": (1, 1)} if layout == torch.sparse_bsr else {}
        zc = (_specified_half() * (1 + 1j)).to_sparse(layout=layout, **blocks)
        refused = gradtool.check(lambda x: x.to_dense() * 2, [zc.requires_grad_(True)],
                                 masked=True)
        assert not refused.targets and "to_sparse_coo()" in refused.rejected[0].message


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("masked", [False, True])
def test_the_target_sees_the_given_pattern_explicit_zeros_included(layout, masked):
    indices = torch.tensor([[0, 0, 1], [0, 2, 1]])
    given = torch.sparse_coo_tensor(indices, torch.tensor([1.5, 0.0, -2.0], dtype=torch.float64),
                                    (2, 3)).coalesce()  # (0, 2) specified, and zero
    given = (given if layout == "coo" else given.to_sparse_csr()).requires_grad_(True)
    seen = []

    def pattern_dependent(x):  # unspecified elements count as -inf in a sparse softmax
        seen.append(x._nnz())
        coo = x.to_sparse_coo() if x.layout != torch.sparse_coo else x
        return torch.sparse.softmax(coo, dim=1).to_dense()

    gradtool.check(pattern_dependent, [given], masked=masked, checks=["contract"])
    assert seen and set(seen) == {3}


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_model_passing_its_sparse_input_to_a_function_names_the_wrong_one(fx, layout):
    """The culprit search checks the Function alone on the sparse tensor it received (an
    internal error before: the captured case held it sparse, not as its values)."""
    a, b = fx.operands(LAYOUTS[layout], n=4)
    assert gradtool.check(fx.SparseInputLayer(), [a, b], masked=True).ok()
    report = gradtool.check(fx.SparseInputLayer(fx.FactorMatmul), [a, b], masked=True)
    gradient = result(report, "gradient")
    assert gradient.outcome.value == "failed"
    assert any("FactorMatmul" in line and "is wrong w.r.t. b" in line
               for line in gradient.details), gradient.details


def test_below_float64_sparse_inputs_still_skip_double_backward(fx):
    """The float64 reference of a float32 run keeps the sparse encodings (a false failure of
    double backward before: the reference problem had lost them)."""
    a, b = fx.operands(torch.sparse_coo, n=4)
    a32 = a.detach().float().requires_grad_(True)
    b32 = b.detach().float().requires_grad_(True)
    report = gradtool.check(fx.SparseMatmul, [a32, b32], masked=True)
    assert report.ok(), outcomes(report)
    assert result(report, "double_backward").outcome.value == "skipped"


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_masked_failure_names_elements_where_they_sit_in_the_matrix(fx, layout):
    """Not by their number among the specified values (t[7]): t[2, 0], as the matrix has it,
    in the worst elements, the diagnosis and the JSON report alike."""
    import json

    from gradtool.render.json import render_json

    a, b = fx.operands(LAYOUTS[layout], n=4)
    report = gradtool.check(fx.DroppedSolve, [a, b], masked=True, checks=("gradient",))
    block = next(blk for blk in result(report, "gradient").blocks if blk.input == "t")
    assert block.input_shape == (4, 4) and block.grid is None
    dense = a.detach().to_dense()
    assert block.worst and all(r > c and dense[r, c] != 0  # the dropped off-diagonal terms
                               for r, c in (e.input_index for e in block.worst))
    r, c = block.worst[0].input_index
    assert f"worst at ({r},{c})->" in block.diagnosis
    checks = json.loads(render_json(report))["targets"][0]["cases"][0]["checks"]
    blocks = [blk for blk in checks[0]["blocks"] if blk["input"] == "t"]
    assert blocks[0]["worst"][0]["input_index"] == [r, c]
    assert "FAIL" in report.text(verbose=True)


def test_below_float64_a_masked_failure_is_named_in_the_matrix_too(fx):
    """The low-precision comparison (against the same target in float64) names a masked
    input's gradient elements where they sit, as the gradient check does."""

    class WrongInFloat32(fx.SparseMatmul):
        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            dense = g @ b.T
            if g.dtype == torch.float32:  # wrong only below float64, at a[2, 2]
                dense = dense.clone()
                dense[2, 2] *= 3
            return fx._sparse_grad(dense, a), torch.sparse.mm(a.t(), g) + g

    for layout in LAYOUTS.values():
        a, b = fx.operands(layout, n=4)
        a32, b32 = (t.detach().float().requires_grad_(True) for t in (a, b))
        report = gradtool.check(WrongInFloat32, [a32, b32], masked=True, checks=("gradient",))
        gradient = result(report, "gradient")
        assert gradient.outcome.value == "failed"
        block = next(blk for blk in gradient.blocks if blk.input == "a")
        assert block.input_shape == (4, 4) and block.mismatched == 1
        assert any("gradient of 'a' at (2, 2):" in line for line in gradient.details), \
            gradient.details
