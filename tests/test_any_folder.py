"""The suite passes from any folder name (issue 57): a clone made from a URL that ends in
gradtool sits in a folder named gradtool/, which a test must not read as gradtool's own frames."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import ROOT


def test_the_newcomer_tests_pass_from_a_clone_whose_path_holds_gradtool(tmp_path):
    clone = tmp_path / "src" / "gradtool"
    for part in ("gradtool", "tests", "specs"):
        shutil.copytree(ROOT / part, clone / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    assert "gradtool/" in f"{clone}/tests"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/test_newuser.py"],
        cwd=clone, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(clone)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
