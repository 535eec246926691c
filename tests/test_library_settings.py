"""gradtool.check's settings: a misspelt one is an error naming it and the nearest, not Python's
bare TypeError; `checks` given as one name is that check (a new user's trial wrote both)."""

import pytest
import torch

import gradtool
from gradtool.errors import ConfigError


def test_an_unknown_setting_names_itself_the_nearest_and_the_others():
    with pytest.raises(ConfigError) as raised:
        gradtool.check(lambda x: x * 2, [torch.randn(3, dtype=torch.float64)], atoll=1e-3)
    text = str(raised.value)
    assert "'atoll'" in text and "did you mean 'atol'?" in text and "rtol" in text


def test_checks_given_as_one_name_is_that_check():
    report = gradtool.check(lambda x: x * 2, [torch.randn(3, dtype=torch.float64)],
                            checks="gradient")
    assert [check.name for _, _, check in report.checks()] == ["gradient"]
    assert report.ok()
