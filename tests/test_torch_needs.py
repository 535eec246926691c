"""A torch feature missing from the installed torch is a usage error naming the torch it needs."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from gradtool.cli.main import main
from gradtool.targets.needs import torch_needed


def test_a_missing_torch_library_name_says_which_torch_has_it():
    exc = ImportError("cannot import name 'triton_op' from 'torch.library' (/x/torch/library.py)")
    assert torch_needed(exc) == (f"torch.library.triton_op is in torch 2.6 and later, not in this "
                                 f"torch {torch.__version__}: upgrade torch")
    exc = AttributeError("module 'torch.library' has no attribute 'custom_op'")
    assert "torch.library.custom_op is in torch 2.4 and later" in torch_needed(exc)


def test_other_import_errors_get_no_torch_hint():
    assert torch_needed(ImportError("cannot import name 'nothing' from 'torch.library'")) is None
    assert torch_needed(ImportError("cannot import name 'x' from 'numpy'")) is None
    assert torch_needed(ValueError("cannot import name 'triton_op' from 'torch.library'")) is None


def test_the_cli_says_it_in_one_hint_with_exit_code_2(tmp_path):
    # What torch 2.4 raises for a file using triton_op (torch.library has it from 2.6).
    (tmp_path / "old_torch.py").write_text(
        "raise ImportError(\"cannot import name 'triton_op' from 'torch.library' (library.py)\")\n")
    result = CliRunner().invoke(main, ["check", str(tmp_path / "old_torch.py"), "--no-isolate"])
    assert result.exit_code == 2
    assert "hint: torch.library.triton_op is in torch 2.6 and later" in result.output
    assert "Traceback" not in result.output
