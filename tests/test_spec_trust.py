"""Spec trust: outside its folder a spec may run Functions, Modules and torch operators only;
a plain callable from an installed package needs the spec's and the run's opt-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WRITERS = [  # popular callables that write a file named by their first argument
    ("numpy:savetxt", "[{name: f, value: '{out}'}, {x: '(3,)'}]"),
    ("numpy:savez_compressed", "[{name: f, value: '{out}'}, {x: '(3,)'}]"),
    ("numpy:memmap", "[{name: f, value: '{out}'}, {name: d, value: float64}, "
                     "{name: m, value: 'w+'}, {name: o, value: 0}, {name: s, value: 3}]"),
    ("numpy:tofile", "[{name: f, value: '{out}'}]"),  # not a numpy name: refused at resolve
    ("numpy:save", "[{name: f, value: '{out}'}, {x: '(3,)'}]"),  # an old refusal: 'save'
    ("logging:FileHandler", "[{name: f, value: '{out}'}]"),  # an old refusal: the stdlib
]
NEW = {"numpy:savetxt", "numpy:savez_compressed"}  # refused by the allow-list


def gradtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradtool", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def write_spec(tmp_path: Path, target: str, inputs: str, trust: bool = False) -> Path:
    out = tmp_path / "written.out"
    lines = ["version: 1", "specs:", f"  - target: {target}",
             f"    inputs: {inputs.replace('{out}', str(out))}"]
    if trust:
        lines.append("    trust_callable: true")
    path = tmp_path / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("target, inputs", WRITERS)
def test_file_writing_callables_are_refused_and_write_nothing(tmp_path, target, inputs):
    spec = write_spec(tmp_path, target, inputs)
    done = gradtool(str(spec), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (tmp_path / "written.out").exists()
    assert not list(tmp_path.glob("written.out*")) and not (tmp_path / "runs").exists()
    text = done.stdout + done.stderr
    assert ("--trust-callables" in text) == (target in NEW), text
    assert "spec.yaml:3" in text or target not in NEW


def test_spec_opt_in_alone_is_not_enough(tmp_path):
    spec = write_spec(tmp_path, *WRITERS[0], trust=True)
    done = gradtool(str(spec), cwd=tmp_path)
    assert done.returncode == 2 and "--trust-callables was not given" in done.stdout + done.stderr
    assert not (tmp_path / "written.out").exists()


def test_flag_alone_is_not_enough(tmp_path):
    spec = write_spec(tmp_path, *WRITERS[0])
    done = gradtool(str(spec), "--trust-callables", cwd=tmp_path)
    assert done.returncode == 2 and "trust_callable: true" in done.stdout + done.stderr
    assert not (tmp_path / "written.out").exists()


def test_both_opt_ins_run_the_callable(tmp_path):
    spec = write_spec(tmp_path, *WRITERS[0], trust=True)
    gradtool(str(spec), "--trust-callables", "--check", "contract", cwd=tmp_path)
    assert (tmp_path / "written.out").exists()  # trusted: it ran, as the user asked


@pytest.mark.parametrize("target, inputs", [
    ("torch:sin", "[{x: '(3,)'}]"), ("torch.nn.functional:gelu", "[{x: '(3,)'}]"),
    ("torch.nn:Linear", "[{x: '2x3'}]"),
])
def test_functions_modules_and_torch_operators_need_no_opt_in(tmp_path, target, inputs):
    spec = write_spec(tmp_path, target, inputs)
    if target.endswith("Linear"):
        spec.write_text(spec.read_text() + "    init: [3, 2]\n")
    done = gradtool(str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_existing_refusals_stay(tmp_path):
    spec = write_spec(tmp_path, "torch:save", "[{x: '(3,)'}]", trust=True)
    done = gradtool(str(spec), "--trust-callables", cwd=tmp_path)
    assert done.returncode == 2 and "refused" in done.stdout + done.stderr
