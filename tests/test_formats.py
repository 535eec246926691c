"""A new report format is one module plus one registry entry: the CLI's option, the
[tool.gradtool] key and the writing all come from the entry (config/registry.py FORMATS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUL = ROOT / "specs" / "examples" / "mul_constant.py"
# Registering the toy format is its one entry; then the ordinary command line runs.
DRIVER = """
import sys
sys.path.insert(0, {fixtures!r})
from gradtool.config import registry
registry.FORMATS["outcomes"] = registry.ReportFormat(
    "outcomes", "--outcomes", "outcomes_file", "toy_format:render_outcomes",
    "one line per check with its outcome")
from gradtool.cli.main import main
main()
"""


def _gradtool(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(fixtures=str(ROOT / "tests" / "fixtures")))
    return subprocess.run([sys.executable, str(driver), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_a_toy_format_gets_its_option_its_key_and_its_file(tmp_path):
    assert "--outcomes FILE" in _gradtool(tmp_path, "check", "--help").stdout
    done = _gradtool(tmp_path, "check", f"{MUL}:MulConstantUnscaled", "-i", "3x3", "-i", "5",
                     "--check", "gradient", "--outcomes", "out/a.txt", "--html", "r.html",
                     "--no-isolate")
    assert done.returncode == 1, done.stderr
    lines = (tmp_path / "out" / "a.txt").read_text().splitlines()
    assert lines == [f"{MUL}:MulConstantUnscaled gradient failed", "html r.html"]
    (tmp_path / "pyproject.toml").write_text('[tool.gradtool]\noutcomes_file = "b.txt"\n')
    done = _gradtool(tmp_path, "check", f"{MUL}:MulConstant", "-i", "3x3", "-i", "5",
                     "--check", "gradient", "--no-isolate")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b.txt").read_text() == f"{MUL}:MulConstant gradient passed\n"
