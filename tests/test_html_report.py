"""--html: a self-contained page with one heat map per failing block (issue 27)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import gradtool
from gradtool.numerics.grid import error_grid
from gradtool.render.html import level, render_html
from gradtool.results import Outcome

ROOT = Path(__file__).resolve().parent.parent
BUGS = "tests/fixtures/report_bugs.py"
CASES = {  # broken Function, correct twin, inputs, the diagnosis's words
    "transposed": ("TransposeNotTransposed", "Transpose", ["5x5"], "transposed"),
    "scaled": ("ScaleTwice", "Scale", ["6x40"], "extra factor 3"),
    "tail": ("SquareTailDropped", "Square", ["6x42"], "elements wrong, the rest agree"),
}


class Page(HTMLParser):
    """What a test needs from the page: heat-map figures, svg count, links, scripts, text."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict[str, str]] = []
        self.svgs = self.links = self.script_src = self.circles = 0
        self.urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and "heatmap" in (a.get("class") or ""):
            self.figures.append({k: v or "" for k, v in a.items()})
        self.svgs += tag == "svg"
        self.circles += tag == "circle"
        self.links += tag == "link"
        self.script_src += tag == "script" and "src" in a
        self.urls += [v for v in a.values() if v and ("http://" in v or "https://" in v)]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    return parser


def failing_blocks(report) -> list:
    return [b for _, _, k in report.checks() for b in k.blocks
            if b.mismatched and k.outcome is not Outcome.PASSED]


@pytest.mark.parametrize("bug", sorted(CASES))
def test_page_has_one_heat_map_per_failing_block(bug):
    broken, _, inputs, words = CASES[bug]
    report = gradtool.check(f"{BUGS}:{broken}", inputs, checks=["gradient"])
    blocks = failing_blocks(report)
    assert len(blocks) == 1 and blocks[0].grid is not None
    page = render_html(report)
    parsed = parse(page)
    assert len(parsed.figures) == len(blocks)
    assert parsed.svgs == 2 * len(blocks)  # |a - n| and the relative error
    assert parsed.circles == 2 * len(blocks[0].worst)  # the worst elements, on both maps
    text = " ".join(parsed.text)
    assert broken in text and words in text  # the target's name, the diagnosis beside it
    assert "http://" not in page and "https://" not in page
    assert parsed.urls == [] and parsed.links == 0 and parsed.script_src == 0


def test_grid_pictures_the_bug():
    """The transposed bug is the anti-diagonal pattern of a 25 x 25 block (one cell each)."""
    report = gradtool.check(f"{BUGS}:TransposeNotTransposed", ["5x5"], checks=["gradient"])
    grid = failing_blocks(report)[0].grid
    assert (grid.n_rows, grid.n_cols, grid.row_tile, grid.col_tile) == (25, 25, 1, 1)
    wrong = {(r, c) for r in range(25) for c in range(25) if grid.mismatched[r][c]}
    # x.T's gradient is grad.T: output (i,j) pairs with input (j,i); backward used (i,j)
    expected = {(5 * i + j, 5 * j + i) for i in range(5) for j in range(5) if i != j}
    expected |= {(5 * i + j, 5 * i + j) for i in range(5) for j in range(5) if i != j}
    assert wrong == expected


def test_tail_block_is_a_stripe_at_the_end():
    report = gradtool.check(f"{BUGS}:SquareTailDropped", ["6x42"], checks=["gradient"])
    grid = failing_blocks(report)[0].grid
    assert grid.row_tile == grid.col_tile == 4 and len(grid.abs_diff) == 63  # 252 / 4
    wrong_cols = {c for row in grid.mismatched for c, n in enumerate(row) if n}
    # elements 40, 41 of each 42-row: flat 42 r + 40, 42 r + 41, in column tiles of 4
    assert wrong_cols == {(42 * r + k) // 4 for r in range(6) for k in (40, 41)}


def test_error_grid_max_pools_and_keeps_a_single_element():
    a = torch.zeros(200, 130, dtype=torch.float64)
    n = torch.zeros_like(a)
    a[199, 0] = 2.0
    a[5, 129] = 1e-7  # below tolerance: shows in |a - n|, not as mismatched
    grid = error_grid(a, n, atol=1e-5, rtol=1e-3)
    assert (grid.row_tile, grid.col_tile) == (4, 3)
    assert len(grid.abs_diff) == 50 and len(grid.abs_diff[0]) == 44
    assert grid.abs_diff[49][0] == 2.0 and grid.mismatched[49][0] == 1
    assert grid.abs_diff[1][43] == 1e-7 and grid.mismatched[1][43] == 0
    assert sum(map(sum, grid.mismatched)) == 1
    assert grid.rel_diff[49][0] == pytest.approx(2.0 / 1e-5)  # |n| = 0: floored at atol


def test_error_grid_cells_keep_three_significant_digits():
    a = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = a * torch.logspace(-300, 300, 30, dtype=torch.float64).reshape(6, 5)
    a[0, 0], a[0, 1] = float("inf"), float("nan")
    grid = error_grid(a, torch.zeros_like(a), atol=1e-5, rtol=1e-3)
    diff = (a.abs()).tolist()
    expected = [[float(f"{v:.3g}") if v == v else float("inf") for v in row] for row in diff]
    assert [list(row) for row in grid.abs_diff] == expected  # a nan difference shows as inf
    assert all(type(v) is int for row in grid.mismatched for v in row)
    assert sum(map(sum, grid.mismatched)) == sum(not v <= 1e-5 for row in diff for v in row)


def test_passing_blocks_carry_no_grid():
    report = gradtool.check(f"{BUGS}:Scale", ["6x40"])
    assert report.ok()
    assert all(b.grid is None for _, _, k in report.checks() for b in k.blocks)
    assert parse(render_html(report)).figures == []


def test_probe_mode_says_why_there_is_no_map():
    report = gradtool.check(f"{BUGS}:ScaleTwice", ["6x40"], checks=["gradient"], mode="probe")
    assert not report.ok() and all(b.grid is None for b in failing_blocks(report))
    page = render_html(report)
    assert parse(page).figures == [] and "probe mode" in page and "no heat" in page


def test_colour_levels():
    assert level(0.0, 1.0) == 0 and level(1e-9, 1.0) == 0  # below the 6 decades shown
    assert level(1.0, 1.0) == 8 and level(float("inf"), 1.0) == -1
    assert 1 <= level(1e-3, 1.0) < level(1e-1, 1.0) < 8


def test_cli_writes_page_and_junit_links_it(tmp_path):
    html, junit = tmp_path / "out" / "report.html", tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "gradtool", "check", f"{BUGS}:ScaleTwice", "-i", "4x4",
         "--check", "gradient", "--html", str(html), "--junit-xml", str(junit), "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert len(parse(html.read_text(encoding="utf-8")).figures) == 1
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["html_report"] == str(html)


def test_pyproject_html_setting(tmp_path):
    from gradtool.config.pyproject import load_config

    (tmp_path / "pyproject.toml").write_text('[tool.gradtool]\nhtml = "reports/g.html"\n')
    config = load_config(tmp_path / "pyproject.toml", cwd=tmp_path)
    assert config.settings["html"] == "reports/g.html"
    (tmp_path / "pyproject.toml").write_text("[tool.gradtool]\nhtml = 3\n")
    with pytest.raises(gradtool.errors.ConfigError, match="html = 3: expected a file path"):
        load_config(tmp_path / "pyproject.toml", cwd=tmp_path)


def test_json_report_with_grids_and_reproducers_validates():
    import json
    from dataclasses import replace
    from importlib.resources import files

    import jsonschema

    from gradtool.results import Reproducer

    report = gradtool.check(f"{BUGS}:SquareTailDropped", ["6x42"], checks=["gradient"])
    report = replace(report, reproducers=(Reproducer("t", "d/test_t.py", "gradient", "few",
                                                     "6x42", "1x5", 9, 40),))
    schema = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["targets"][0]["cases"][0]["checks"][0]["blocks"][0]["grid"]["row_tile"] == 4
    jsonschema.validate(data, schema)


def test_verbose_terminal_shows_a_text_heat_map_and_plain_output_is_unchanged():
    from gradtool.render.terminal import HEATMAP, heat_text, render_plain, report_lines

    report = gradtool.check(f"{BUGS}:SquareTailDropped", ["6x42"], checks=["gradient"])
    plain, verbose = render_plain(report), render_plain(report, verbose=True)
    assert "│" not in plain and "|a − n|" not in plain
    rows = [text for text, style in report_lines(report, verbose=True) if style == HEATMAP]
    assert len(rows) == 16 and all(r.strip().startswith("│") for r in rows)
    assert "×" in "".join(rows) and "█" in rows[-1]  # worst elements; the tail: bottom right
    assert rows[-1].rstrip().endswith("█│") and "|a − n| of 'x' -> output" in verbose
    # the map is the only addition: the rest is the plain report (timing on the header line,
    # the case's cost plan, and where the run's time went)
    rest = [line for line in verbose.splitlines() if "│" not in line and "|a − n|" not in line
            and not line.startswith(("time: ", "  plan: ", "  beyond the plan: "))]
    assert [line.split("  (")[0] if line.startswith("FAIL") else line for line in rest] == \
        plain.splitlines()
    styled = heat_text("│··█×│")
    assert styled.plain == "│··█×│" and {str(s.style) for s in styled.spans} >= {"bold red",
                                                                                 "bold cyan"}


def test_page_for_the_bundled_examples_failures_is_small():
    """Every failing Function of specs/examples/*.py (their specs declare them xfail)."""
    failing, pages = 0, 0
    for path in sorted((ROOT / "specs" / "examples").glob("*.py")):
        report = gradtool.check(str(path), checks=["gradient", "double_backward"])
        page = render_html(report)
        parsed = parse(page)
        blocks = [b for b in failing_blocks(report) if b.grid is not None]
        assert len(parsed.figures) == len(blocks)
        assert parsed.urls == [] and parsed.links == 0 and parsed.script_src == 0
        failing += len(blocks)
        pages += len(page.encode())
    assert failing >= 5 and pages <= 5 * 2**20


def test_maps_are_well_formed_svg_with_cells_inside_the_frame():
    import re

    report = gradtool.check(f"{BUGS}:ScaleTwice", ["6x40"], checks=["gradient"])
    svgs = re.findall(r"<svg .*?</svg>", render_html(report), re.S)
    assert len(svgs) == 2
    for svg in svgs:
        root = ET.fromstring(svg)  # well-formed XML
        width, height = float(root.get("width")), float(root.get("height"))
        rects = [r for r in root.iter("rect") if r.get("class") != "l0"]
        assert rects  # the diagonal's cells are drawn
        for r in rects:
            assert float(r.get("x")) + float(r.get("width")) <= width
            assert float(r.get("y")) + float(r.get("height")) <= height


def test_help_and_option_parsing_do_not_import_the_page_or_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom gradtool.cli.main import main\n"
            "r = CliRunner().invoke(main, ['check', '--help'])\nassert r.exit_code == 0\n"
            "assert '--html' in r.output and '--repro-budget' in r.output\n"
            "bad = [m for m in ('torch', 'gradtool.render.html', 'gradtool.run.shrink') "
            "if m in sys.modules]\nassert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
