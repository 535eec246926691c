"""The check registry is the one place check names come from: CLI, specs, schema, docs, runner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import import_module
from importlib.resources import files
from pathlib import Path

import pytest

from gradtool.config.registry import CHECK_NAMES, DEFAULT_CHECKS, REGISTRY
from gradtool.config.settings import CheckConfig

CHECKS_DOC = Path(__file__).resolve().parent.parent / "docs" / "checks.md"


def test_the_default_run_is_every_check_that_is_not_opt_in():
    assert CheckConfig().checks == DEFAULT_CHECKS
    assert set(DEFAULT_CHECKS) == {i.name for i in REGISTRY if i.default}
    assert {"contract", "gradient", "double_backward"} <= set(DEFAULT_CHECKS)


@pytest.mark.parametrize("info", REGISTRY, ids=lambda i: i.name)
def test_every_registered_check_has_a_runnable_module(info):
    module = import_module(info.import_path)
    assert callable(module.run)
    assert info.description and "\n" not in info.description


def test_the_report_schema_names_exactly_the_registered_checks():
    schema = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())
    assert tuple(schema["$defs"]["check"]["properties"]["name"]["enum"]) == CHECK_NAMES


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_docs_describe_every_check(name):
    assert re.search(rf"^- \*\*{name}\*\* — ", CHECKS_DOC.read_text(encoding="utf-8"),
                     re.MULTILINE), name


def test_check_option_and_config_reject_unknown_names_with_the_registered_ones():
    out = subprocess.run([sys.executable, "-m", "gradtool", "check", "x.py:F", "--check", "nope"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert all(name in out.stderr for name in CHECK_NAMES)


def test_registry_is_importable_without_torch():
    code = ("import sys, gradtool.config.registry, gradtool.config.settings; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- rules: every check declares all of them, the report schema and ignore: follow -------------

from gradtool.config.registry import RULE_IDS, RULES, TARGET_KINDS  # noqa: E402
from gradtool.errors import ConfigError  # noqa: E402


def test_every_check_declares_its_rules_with_their_targets():
    for info in REGISTRY:
        assert info.rules, f"{info.name} declares no rule"
        assert set(info.targets) <= set(TARGET_KINDS)
        for rule in info.rules:
            assert rule.check == info.name and rule.severity in ("failure", "warning")
            assert set(rule.targets) <= set(info.targets), rule.id
            assert rule.description and "\n" not in rule.description
    assert len(RULE_IDS) == len(set(RULE_IDS))


def test_the_report_schema_names_exactly_the_registered_rules():
    schema = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())
    assert tuple(schema["$defs"]["finding"]["properties"]["rule"]["enum"]) == RULE_IDS


def test_every_diagnosis_kind_classify_names_is_a_registered_rule():
    from gradtool.diagnosis import classify

    for check in ("gradient", "forward_ad", "complex"):
        kinds = {r.id.split(".", 1)[1] for r in RULES.values() if r.check == check and r.diagnosis}
        assert set(classify.FIRST_ORDER_KINDS) <= kinds, check
    kinds = {r.id.split(".", 1)[1] for r in RULES.values()
             if r.check == "double_backward" and r.diagnosis}
    assert set(classify.SECOND_ORDER_KINDS) == kinds


# A wrong value is never silenced, whichever check computed it; every other rule may be ignored.
WRONG_VALUES = {"gradient.mismatch", "gradient.rounding", "gradient.taylor",
                "double_backward.mismatch", "forward_ad.mismatch", "forward_ad.reverse_disagrees",
                "complex.mismatch", "vmap.forward", "vmap.backward", "vmap.grads_batched",
                "compiled.first_order", "compiled.second_order"}


def test_ignore_accepts_every_rule_but_a_wrong_value():
    assert WRONG_VALUES <= set(RULE_IDS)
    for rule in RULE_IDS:
        if rule not in WRONG_VALUES:
            assert CheckConfig(ignore=(rule,)).ignore == (rule,)
    for rule in WRONG_VALUES:
        with pytest.raises(ConfigError, match=rf"'{rule}' cannot be ignored: a wrong "
                                              r"gradient value is never silenced"):
            CheckConfig(ignore=(rule,))


def test_the_checks_needing_backward_are_the_registrys():
    # The op kind's adapter blocks these on an op without autograd (targets/kinds.py reads
    # needs_backward): the list once hand-kept in checks/op_autograd.py, now registry data.
    assert {i.name for i in REGISTRY if i.needs_backward} == {
        "contract", "gradient", "double_backward", "forward_ad", "vmap", "complex", "compiled",
        "layout"}


def test_list_rules_shows_every_registered_rule():
    out = subprocess.run([sys.executable, "-m", "gradtool", "list", "--rules"],
                         capture_output=True, text=True, check=True).stdout
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
    assert listed == set(RULE_IDS)
