"""Tests for unitscale.fx.trace_cache: when a cached trace is reused, and clearing it."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from unitscale.examples.models import MLP
from unitscale.fx import trace_cache
from unitscale.fx.autowrap import default_autowrap_modules
from unitscale.fx.trace_cache import trace_for_scales
from unitscale.tracking import clear_trace_cache


class PicksColumns(nn.Module):
    """``forward`` reads ``self.cols`` (any container) while tracing: the graph depends on it."""

    def __init__(self, cols: object) -> None:
        super().__init__()
        self.cols = cols

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(x[:, c] for c in self.cols)  # type: ignore[attr-defined, return-value]


class Settings:
    def __init__(self, scale: float) -> None:
        self.scale = scale


class ReadsSettings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.settings = Settings(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.settings.scale


def _getitems(graph: fx.Graph) -> list[object]:
    return [n.args[1][1] for n in graph.nodes if n.target is operator.getitem]  # type: ignore[index]


def _run(trace: trace_cache.Trace, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return fx.GraphModule(module, trace.graph)(x)


def test_changing_a_tuple_attribute_retraces() -> None:
    model, x = PicksColumns((1, 2)), torch.arange(8.0).reshape(2, 4)
    first = trace_for_scales(model)
    assert trace_for_scales(model) is first
    model.cols = (2, 3)
    second = trace_for_scales(model)
    assert second is not first
    assert _getitems(first.graph) == [1, 2] and _getitems(second.graph) == [2, 3]
    assert torch.equal(_run(second, model, x), x[:, 2] + x[:, 3])


def test_an_equal_tuple_reuses_the_trace() -> None:
    model = PicksColumns((1, 2))
    first = trace_for_scales(model)
    model.cols = (1, 2)  # a new object with the same value: the same trace
    assert trace_for_scales(model) is first


def test_lists_frozensets_and_nested_containers_are_compared_by_value() -> None:
    for before, after in [([0, 1], [0, 2]), (frozenset({0}), frozenset({3})), (((0,), 1), ((0,), 2))]:
        model = PicksColumns(before)
        first = trace_for_scales(model)
        model.cols = type(before)(before)  # equal copy: reused
        assert trace_for_scales(model) is first
        model.cols = after
        assert trace_for_scales(model) is not first


def test_a_list_changed_in_place_retraces() -> None:
    model = PicksColumns([0, 1])
    first = trace_for_scales(model)
    model.cols.append(3)  # type: ignore[attr-defined]
    second = trace_for_scales(model)
    assert second is not first and len(_getitems(second.graph)) == 3


def test_another_object_is_compared_by_identity_and_type() -> None:
    model = ReadsSettings()
    first = trace_for_scales(model)
    assert trace_for_scales(model) is first
    model.settings = Settings(3.0)  # a new object: it may say anything, so trace again
    second = trace_for_scales(model)
    assert second is not first
    assert torch.equal(_run(second, model, torch.ones(2)), torch.full((2,), 3.0))


def test_clear_forgets_every_trace_and_the_next_trace_is_equal() -> None:
    model = MLP(4)
    first = trace_for_scales(model)
    clear_trace_cache()
    second = trace_for_scales(model)
    assert second is not first
    assert second.code == first.code


def test_clear_is_needed_only_for_what_the_fingerprint_cannot_see() -> None:
    model = ReadsSettings()
    first = trace_for_scales(model)
    model.settings.scale = 5.0  # changed in place: invisible to the fingerprint
    assert trace_for_scales(model) is first
    clear_trace_cache()
    assert torch.equal(_run(trace_for_scales(model), model, torch.ones(1)), torch.full((1,), 5.0))


def test_default_autowrap_modules_key_the_same_trace_as_none() -> None:
    model = MLP(4)
    assert trace_for_scales(model, autowrap_modules=default_autowrap_modules()) is trace_for_scales(model)


def test_a_model_with_a_tensor_constant_is_traced_once() -> None:
    class Shift(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tensor([1.0, 2.0])  # tracing stores it on the root as _tensor_constant0

    model = nn.Sequential(nn.Linear(2, 2), Shift())
    first = trace_for_scales(model)
    assert trace_for_scales(model) is first
