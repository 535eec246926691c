"""torch's own correct ops below float64 with every default check: no wolf cried."""

from __future__ import annotations

import pytest

import gradtool
from conftest import load_fixture

OPS = load_fixture("torch_ops_lowprec").OPS


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("name", sorted(OPS))
def test_a_correct_torch_op_passes_every_default_check(name, dtype):
    fn, inputs = OPS[name]
    report = gradtool.check(fn, inputs, dtype=dtype)
    checks = {c.name: c for case in report.targets[0].cases for c in case.checks}
    bad = {n: c.summary for n, c in checks.items() if c.outcome.value in ("failed", "error")}
    assert not bad, bad
    assert checks["gradient"].outcome.value == "passed", checks["gradient"].summary
    assert checks["double_backward"].outcome.value in ("passed", "skipped"), \
        checks["double_backward"].summary
