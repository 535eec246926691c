"""The one run description (run/collect.py:Run) the CLI, gradtool.check and the pytest plugin share."""

from __future__ import annotations

import pickle

import pytest
import torch

import gradtool
from gradtool.config.settings import CheckConfig
from gradtool.errors import NothingToCheck
from gradtool.run.collect import Run, Sources
from gradtool.spec.schema import load_file

CUBE = "specs/examples/cube.yaml"


def outline(jobs):
    return [(j.target.name, [(c.label, c.seed) for c in j.cases], j.config, j.spec, j.reproduce)
            for j in jobs]


def test_a_loaded_spec_collects_as_its_file_does():
    """The plugin's Specs and the CLI's spec path are one collection."""
    config = CheckConfig()
    by_path, rejected = Run((CUBE,), config)()
    by_spec, _ = Run(tuple(load_file(CUBE)), config)()
    assert rejected == [] and len(by_path) == 2
    assert outline(by_spec) == outline(by_path)


def test_a_run_survives_pickling_with_its_collection():
    """What a spawned worker receives collects the jobs the supervisor's copy names."""
    run = Run(("specs/examples/cube.py:my_cube",), CheckConfig(seed=4), Sources(inputs=("3x2",)))
    again = pickle.loads(pickle.dumps(run))
    assert again == run
    assert outline(again()[0]) == outline(run()[0])
    assert [c.inputs[0].shape for c in again()[0][0].cases] == [(3, 2)]


def test_empty_ok_is_the_only_difference_for_a_folder_naming_nothing(tmp_path):
    with pytest.raises(NothingToCheck):
        Run((str(tmp_path),), CheckConfig())()
    assert Run((str(tmp_path),), CheckConfig(), empty_ok=True)() == ([], [])
    report = gradtool.check(str(tmp_path))
    assert report.targets == () and report.rejected == ()


def square(x):
    return x * x


def test_an_object_and_its_name_collect_the_same_job():
    """The library's object goes through the same collection as the string naming it."""
    x = torch.rand(3, dtype=torch.float64)
    given = Sources(given=(x,))
    from gradtool.run.reproduce import loadable_location

    # named as a command line in the working directory loads it: this test module by its file
    # (tests/ is on sys.path only inside pytest)
    name = f"{loadable_location(__name__)}:square"
    assert name.endswith("test_run.py:square")
    [by_object], _ = Run((square,), CheckConfig(), given)()
    [by_name], _ = Run((name,), CheckConfig(), given)()
    assert by_object.target.name == by_name.target.name == name
    assert by_object.reproduce is None  # loadable by that name: the command line reproduces it
    assert [c.inputs for c in by_object.cases] == [c.inputs for c in by_name.cases]


def test_an_unloadable_object_says_how_to_reproduce_it_in_python():
    [job], _ = Run((lambda x: x * 2,), CheckConfig(seed=7))()
    assert job.reproduce.startswith("gradtool.check(<the lambda at ")
    assert "seed=7" in job.reproduce
