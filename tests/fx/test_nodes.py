"""Tests for the shared homes in unitscale.fx: op names, op tables, autowrap defaults, trace errors."""

from __future__ import annotations

import math
import operator

import einops
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from unitscale import partition, track_scales
from unitscale.errors import InputError, TraceError
from unitscale.functional import gelu, linear
from unitscale.fx import DeepTracer, ModulePathTracer
from unitscale.fx.autowrap import default_autowrap_modules, register_autowrap_module
from unitscale.fx.nodes import (
    SCALE_NEUTRAL_FUNCTIONS,
    SCALE_NEUTRAL_METHODS,
    VIEW_FUNCTIONS,
    VIEW_METHODS,
    op_name,
)

NAMES = [
    # target, short name (report column), qualified name (messages)
    (F.linear, "linear", "torch.nn.functional.linear"),
    (F.relu, "relu", "torch.nn.functional.relu"),
    (F.max_pool2d, "max_pool2d", "torch.nn.functional.max_pool2d"),
    (torch.relu, "relu", "torch.relu"),
    (torch.add, "add", "torch.add"),
    (operator.add, "add", "operator.add"),
    (operator.getitem, "getitem", "operator.getitem"),
    (torch.Tensor.__add__, "Tensor.add", "Tensor.add"),
    (torch.Tensor.mul_, "Tensor.mul_", "Tensor.mul_"),
    ("reshape", "Tensor.reshape", "Tensor.reshape"),
    (math.sqrt, "sqrt", "math.sqrt"),
    (U.linear, "linear", "unitscale.functional.linear"),
    (getattr, "getattr", "getattr"),
    (torch.ops.aten.add.Tensor, "add.Tensor", "torch.ops.aten.add.Tensor"),
]


@pytest.mark.parametrize(("target", "short", "qualified"), NAMES)
def test_op_name_short_and_qualified(target: object, short: str, qualified: str) -> None:
    assert op_name(target) == short
    assert op_name(target, qualified=True) == qualified


def test_op_name_of_a_local_function_is_its_module_and_name() -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    assert op_name(double) == "double" and op_name(double, qualified=True) == f"{__name__}.double"
    assert op_name(lambda x: x, qualified=True).endswith("<lambda>")


def test_views_are_scale_neutral_and_casts_are_not_views() -> None:
    assert VIEW_METHODS < SCALE_NEUTRAL_METHODS and VIEW_FUNCTIONS < SCALE_NEUTRAL_FUNCTIONS
    assert {"reshape", "transpose", "swapdims"} <= VIEW_METHODS
    assert {"to", "masked_fill", "__getitem__"} <= SCALE_NEUTRAL_METHODS - VIEW_METHODS
    assert einops.rearrange in VIEW_FUNCTIONS and torch.cat in SCALE_NEUTRAL_FUNCTIONS - VIEW_FUNCTIONS


def test_default_autowrap_modules_start_with_math_einops_and_the_unit_scaled_ops() -> None:
    # one import path of the unit-scaled ops, registered once
    assert default_autowrap_modules()[:3] == (math, einops, U)
    assert default_autowrap_modules().count(U) == 1


def test_register_autowrap_module_refuses_a_function() -> None:
    with pytest.raises(InputError, match=r"expects a module, got builtin_function_or_method .*autowrap_functions"):
        register_autowrap_module(math.sqrt)  # type: ignore[arg-type]


def test_unit_scaled_ops_stay_single_nodes_by_default_as_module_attributes_or_imported_names() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return U.gelu(U.linear(x, w))

    class ByName(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return gelu(linear(x, w))

    for net in (Net(), ByName()):
        graph = DeepTracer().trace(net)
        assert [n.target for n in graph.nodes if n.op == "call_function"] == [U.linear, U.gelu]


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


@pytest.mark.parametrize(
    ("run", "advice"),
    [
        (lambda: ModulePathTracer().trace(Branchy()), "Make the control flow static"),
        (lambda: partition(Branchy(), 1, torch.randn(2)), "Make the control flow static"),
        (lambda: track_scales(Branchy(), torch.randn(2), route="fx"), "Use route='auto'"),
    ],
    ids=["tracer", "partition", "track_scales"],
)
def test_every_trace_failure_names_the_users_line_the_same_way(run, advice: str) -> None:
    with pytest.raises(TraceError) as info:
        run()
    message = full = str(info.value)
    if "no route could capture Branchy" in message:
        # the capture layer lists each route's reason: the fx one is the same message
        message = message.split("\n  fx: TraceError: ")[1].split("\n")[0]
    assert message.startswith("torch.fx could not trace Branchy at ")
    assert "test_nodes.py:" in message and "(`return x if x.sum() > 0 else -x`): symbolically traced" in message
    assert message.endswith(".") and advice in full
    assert message.count("could not trace") == 1
