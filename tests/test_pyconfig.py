"""[tool.gradtool] config: discovery, validation, paths, precedence, the effective table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gradtool.config.settings import CheckConfig
from gradtool.errors import ConfigError
from gradtool.config.pyproject import (DEFAULTS, KEYS, ProjectConfig, check_config_kwargs, discover,
                               find_pyproject, load_config, merge, render_effective,
                               resolve_entry)

REPO = Path(__file__).resolve().parents[1]


def write(folder: Path, body: str, name: str = "pyproject.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(body, encoding="utf-8")
    return path


def project(tmp_path: Path, body: str) -> Path:
    return write(tmp_path / "proj", "[project]\nname = 'x'\n\n[tool.gradtool]\n" + body)


# --- discovery ---------------------------------------------------------------------------------

def test_find_pyproject_walks_up(tmp_path):
    path = project(tmp_path, "seed = 1\n")
    deep = tmp_path / "proj" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    assert find_pyproject(deep) == path
    assert find_pyproject(path.parent) == path


def test_find_pyproject_skips_files_without_our_table(tmp_path):
    path = project(tmp_path, "seed = 1\n")
    inner = write(tmp_path / "proj" / "sub", "[tool.ruff]\nline-length = 100\n")
    assert find_pyproject(inner.parent) == path


def test_find_pyproject_stops_at_the_repository_root(tmp_path):
    project(tmp_path, "seed = 1\n")
    repo = tmp_path / "proj" / "checkout"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    assert find_pyproject(repo / "src") is None


def test_find_pyproject_none(tmp_path):
    assert find_pyproject(tmp_path) is None


def test_find_pyproject_returns_a_broken_file_that_mentions_us(tmp_path):
    path = write(tmp_path, "[tool.gradtool]\nseed = \n")
    assert find_pyproject(tmp_path) == path


def test_discover(tmp_path):
    path = project(tmp_path, "seed = 7\n")
    config = discover(path.parent)
    assert config.path == path and config.settings["seed"] == 7
    assert discover(tmp_path).path is None


# --- loading -----------------------------------------------------------------------------------

def test_no_pyproject_means_defaults():
    config = load_config(None)
    assert config == ProjectConfig(path=None)
    assert config.settings == DEFAULTS and set(config.sources.values()) == {"default"}
    assert config.root is None


def test_values_and_their_sources(tmp_path):
    path = project(tmp_path, 'seed = 3\natol = 1e-4\nrtol = 0\ndtype = "float32"\nmode = "full"\n'
                             'checks = ["gradient"]\nstrict = true\nprobes = 8\nmax_memory = 1e9\n'
                             'format = "json"\nannotations = "github"\ndevice = "cuda:0"\n')
    config = load_config(path)
    s = config.settings
    assert (s["seed"], s["atol"], s["rtol"], s["dtype"], s["mode"]) == (3, 1e-4, 0.0, "float32",
                                                                       "full")
    assert s["checks"] == ["gradient"] and s["strict"] is True and s["probes"] == 8
    assert isinstance(s["rtol"], float) and s["eps"] is None
    origin = f"pyproject.toml [tool.gradtool] at {path.absolute()}"
    assert config.sources["seed"] == origin and config.sources["annotations"] == origin
    assert config.sources["eps"] == "default" and config.sources["paths"] == "default"
    assert config.root == path.parent.absolute()


def test_kebab_case_keys_are_accepted(tmp_path):
    path = project(tmp_path, 'junit-xml = "out/junit.xml"\nnondet-tol = 1e-9\n')
    config = load_config(path, cwd=tmp_path)
    assert config.settings["junit_xml"] == "proj/out/junit.xml"
    assert config.settings["nondet_tol"] == 1e-9


def test_pyproject_without_our_table_gives_defaults(tmp_path):
    path = write(tmp_path, "[tool.ruff]\nline-length = 100\n")
    config = load_config(path)
    assert config.settings == DEFAULTS and config.path == path.absolute()


# --- errors ------------------------------------------------------------------------------------

def test_unknown_key_suggests_the_closest(tmp_path):
    path = project(tmp_path, "atoll = 1e-5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "unknown key 'atoll' in [tool.gradtool]" in message
    assert "did you mean 'atol'?" in message and str(path.absolute()) in message


def test_unknown_key_without_a_close_match_lists_the_keys(tmp_path):
    with pytest.raises(ConfigError, match="valid keys: paths, seed"):
        load_config(project(tmp_path, "zzz = 1\n"))


@pytest.mark.parametrize("line, expected", [
    ('seed = "0"', 'seed = "0": expected a non-negative integer'),
    ("seed = -1", "seed = -1: expected a non-negative integer"),
    ("atol = true", "atol = true: expected a non-negative number"),
    ('atol = "1e-5"', 'atol = "1e-5": expected a non-negative number'),
    ("eps = 0", "eps = 0: expected a positive number"),
    ("rtol = nan", "rtol = nan: expected a non-negative number"),
    ('dtype = "float63"', 'dtype = "float63": expected one of float64'),
    ('mode = "ful"', 'mode = "ful": expected one of auto, full, probe'),
    ('checks = ["gradient", "hessian"]', 'checks = ["gradient", "hessian"]: expected a list of'),
    ("checks = []", "checks = []: expected a list of check names"),
    ('paths = "specs"', 'paths = "specs": expected a list of strings'),
    ("paths = [1, 2]", "paths = [1, 2]: expected a list of strings"),
    ('strict = "yes"', 'strict = "yes": expected true or false'),
    ("probes = 0", "probes = 0: expected a positive integer"),
    ("probes = 2.5", "probes = 2.5: expected a positive integer"),
    ('max_memory = "2GB"', 'max_memory = "2GB": expected a positive number of bytes'),
    ('format = "xml"', 'format = "xml": expected one of terminal, json'),
    ('annotations = "gitlab"', 'annotations = "gitlab": expected one of auto, github, none'),
    ("junit_xml = 3", "junit_xml = 3: expected a file path string"),
    ("device = 0", "device = 0: expected a string"),
])
def test_wrong_type_names_key_value_and_expected(tmp_path, line, expected):
    with pytest.raises(ConfigError) as info:
        load_config(project(tmp_path, line + "\n"))
    assert f"[tool.gradtool] {expected}" in str(info.value)


def test_wrong_choice_suggests_the_closest(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'float64'"):
        load_config(project(tmp_path, 'dtype = "float46"\n'))


@pytest.mark.parametrize("line, hint", [
    ('checks = "gradient"', 'write a list: checks = ["gradient"]'),
    ('checks = ["contract", "gradiant"]', "did you mean 'gradient'?"),
    ('paths = "specs"', 'write a list: paths = ["specs"]'),
    ('mode = "probes"', "did you mean 'probe'?"),
])
def test_wrong_value_hints_at_the_fix(tmp_path, line, hint):
    with pytest.raises(ConfigError) as info:
        load_config(project(tmp_path, line + "\n"))
    assert info.value.hint == hint


def test_bad_toml_names_the_file_and_line(tmp_path):
    path = project(tmp_path, "seed = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path.absolute()}: invalid TOML")
    assert re.search(r"line \d+", message)


def test_tool_gradtool_must_be_a_table(tmp_path):
    with pytest.raises(ConfigError, match=r"\[tool.gradtool\] must be a table, got 3"):
        load_config(write(tmp_path, "[tool]\ngradtool = 3\n"))


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


# --- paths -------------------------------------------------------------------------------------

def test_paths_resolve_against_the_pyproject_folder(tmp_path, monkeypatch):
    path = project(tmp_path, 'paths = ["specs", "ops/f.py:MyOp", "pkg.mod:Name", "pkg.mod", '
                             '"specs/x.yaml", "../shared/y.yml"]\njunit_xml = "junit.xml"\n')
    (path.parent / "specs").mkdir()
    root = path.parent.absolute()
    monkeypatch.chdir(tmp_path / "proj")
    assert load_config(path).settings["paths"] == [
        "specs", "ops/f.py:MyOp", "pkg.mod:Name", "pkg.mod", "specs/x.yaml",
        (tmp_path / "shared" / "y.yml").absolute().as_posix()]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_config(path).settings
    assert settings["paths"][:3] == [f"{root.as_posix()}/specs", f"{root.as_posix()}/ops/f.py:MyOp",
                                     "pkg.mod:Name"]
    assert settings["junit_xml"] == f"{root.as_posix()}/junit.xml"


def test_resolve_entry(tmp_path):
    (tmp_path / "specs").mkdir()
    assert resolve_entry("specs", tmp_path, cwd=tmp_path) == "specs"
    assert resolve_entry("a/b.py:F", tmp_path, cwd=tmp_path.parent) == f"{tmp_path.name}/a/b.py:F"
    assert resolve_entry("pkg.mod:F", tmp_path, cwd=tmp_path) == "pkg.mod:F"
    assert resolve_entry("/abs/op.yaml", tmp_path, cwd=tmp_path) == "/abs/op.yaml"


# --- merging and showing -----------------------------------------------------------------------

def test_precedence_cli_over_pyproject_over_default(tmp_path):
    path = project(tmp_path, 'seed = 3\natol = 1e-4\nmode = "full"\n')
    cli = {"seed": 9, "atol": None, "mode": None, "rtol": 0.5, "checks": (), "paths": ("x.py",)}
    settings, sources = merge(load_config(path), cli)
    origin = f"pyproject.toml [tool.gradtool] at {path.absolute()}"
    assert (settings["seed"], sources["seed"]) == (9, "command line")
    assert (settings["atol"], sources["atol"]) == (1e-4, origin)
    assert (settings["mode"], sources["mode"]) == ("full", origin)
    assert (settings["rtol"], sources["rtol"]) == (0.5, "command line")
    assert (settings["checks"], sources["checks"]) == (list(DEFAULTS["checks"]), "default")
    assert (settings["paths"], sources["paths"]) == (["x.py"], "command line")
    assert settings["dtype"] == "float64" and sources["dtype"] == "default"


def test_false_from_the_command_line_overrides(tmp_path):
    settings, sources = merge(load_config(project(tmp_path, "strict = true\n")), {"strict": False})
    assert settings["strict"] is False and sources["strict"] == "command line"


def test_merge_does_not_mutate_the_project(tmp_path):
    config = load_config(project(tmp_path, "seed = 3\n"))
    merge(config, {"seed": 1})
    assert config.settings["seed"] == 3


def test_check_config_kwargs_build_a_check_config(tmp_path):
    config = load_config(project(tmp_path, 'checks = ["gradient"]\natol = 1e-4\nseed = 2\n'))
    settings, _ = merge(config, {"dtype": "float32"})
    check = CheckConfig(**check_config_kwargs(settings))
    assert check.checks == ("gradient",) and check.atol == 1e-4 and check.dtype == "float32"
    assert check.tolerance("rtol") == 1e-2


def test_render_effective_is_an_aligned_table(tmp_path):
    path = project(tmp_path, 'seed = 3\nchecks = ["gradient", "contract"]\n')
    settings, sources = merge(load_config(path), {"strict": True, "extra_flag": "x"})
    text = render_effective(settings, sources)
    lines = text.splitlines()
    assert lines[0].split() == ["key", "value", "source"]
    assert len(lines) == len(KEYS) + 2
    value_col = lines[0].index("value")
    source_col = lines[0].index("source")
    for line in lines[1:]:
        assert line[value_col - 2: value_col] == "  " and line[value_col] != " "
        assert line[source_col - 2: source_col] == "  " and line[source_col] != " "
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["seed"].split(None, 2)[1:] == ["3", f"pyproject.toml [tool.gradtool] at "
                                                    f"{path.absolute()}"]
    assert '["gradient", "contract"]' in rows["checks"]
    assert "1e-05 (float64 default)" in rows["atol"] and rows["atol"].endswith("default")
    assert "true" in rows["strict"] and rows["strict"].endswith("command line")
    assert "(not set)" in rows["junit_xml"]
    assert lines[-1].startswith("extra_flag")


# --- pre-commit --------------------------------------------------------------------------------

def test_pre_commit_hook_runs_gradtool_on_changed_specs():
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    hook = hooks["gradtool"]
    assert hook["entry"] == "gradtool check" and hook["language"] == "python"
    assert hook["pass_filenames"] is True
    files = re.compile(hook["files"])
    for name in ("specs/op.yaml", "specs/sub/op.yml", "pkg/specs/op.yaml"):
        assert files.search(name), name
    for name in ("specs/op.py", "other/op.yaml", "specs.yaml", "myspecs/op.yaml"):
        assert not files.search(name), name
    for hook in hooks.values():
        assert set(hook) >= {"id", "name", "entry", "language", "files"}
