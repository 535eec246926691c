"""Target kinds are adapters: one per kind, asked what differs; a Problem is frozen once built."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from gradtool.config.registry import BY_NAME, REGISTRY
from gradtool.targets.kinds import CALLABLE, FUNCTION, KINDS, MODULE, NAMES, OP, named


def test_a_kind_is_its_name_in_the_report_and_pickles_as_itself():
    for kind in KINDS:
        assert str(kind) == kind.name and named(kind.name) is kind
        assert pickle.loads(pickle.dumps(kind)) is kind  # a worker's Target keeps its adapter


def test_the_registry_knows_the_adapters_kinds():
    from gradtool.config.registry import TARGET_KINDS

    assert TARGET_KINDS == NAMES  # the registry's plain data names the adapters, in order
    assert {k for info in REGISTRY for k in info.targets} <= set(NAMES)


def test_op_checks_are_for_ops_alone_with_the_reason_said_once():
    for name in ("op_schema", "op_fake", "op_autograd", "op_compiled"):
        assert OP.applies(BY_NAME[name]) is None
        for kind in (FUNCTION, MODULE, CALLABLE):
            assert kind.applies(BY_NAME[name]) == "not a custom op (torch.library)"
    assert all(kind.applies(BY_NAME["gradient"]) is None for kind in KINDS)
    assert OP.own_checks() == ("op_schema", "op_fake", "op_autograd")


def test_each_object_is_claimed_by_its_kind():
    torch = pytest.importorskip("torch")
    from gradtool.targets.resolve import make_target

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    assert make_target(Square, "sq").kind is FUNCTION
    assert make_target(Square.apply, "sq").kind is FUNCTION
    assert make_target(torch.nn.Linear(2, 3), "lin").kind is MODULE
    assert make_target(torch.sin, "sin").kind is CALLABLE
    assert make_target(torch.ops.aten.sin.default, "aten::sin").kind is OP


def test_a_problem_is_frozen_once_built():
    torch = pytest.importorskip("torch")
    from gradtool.numerics.problem import Problem

    problem = Problem(torch.sin, [torch.ones(2)], ["x"], [0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.fn = torch.cos  # type: ignore[misc]
    derived = dataclasses.replace(problem, fn=torch.cos)  # a derived problem is a new one
    assert problem.fn is torch.sin and derived.fn is torch.cos
    problem.cache.vmap_ok = False  # memos have their own typed slots
    assert problem.cache.vmap_ok is False and problem.cache.gradient_graph is None


def test_the_report_schema_names_every_kind():
    import json
    from importlib.resources import files

    schema = json.loads(files("gradtool.schemas").joinpath("report.schema.json").read_text())
    found = [node["kind"]["enum"] for node in _walk(schema) if "kind" in node
             and isinstance(node["kind"], dict) and "enum" in node["kind"]]
    assert found == [list(NAMES)]


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)
