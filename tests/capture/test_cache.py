"""The capture cache (``capture(..., cache=True)``): when a capture is reused, and clearing it."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from unitscale.capture import Capture, DeepTracing, capture, clear_capture_cache
from unitscale.examples.models import MLP
from unitscale.fx.autowrap import default_autowrap_modules


def trace_for_scales(model: nn.Module, autowrap_modules: tuple[object, ...] | None = None) -> Capture:
    """Scale tracking's capture of ``model``: deep, unchecked, cached (inputs do not matter to a trace)."""
    deep = DeepTracing(autowrap_modules=autowrap_modules)  # type: ignore[arg-type]
    return capture(model, torch.ones(2, 4), deep=deep, check=False, cache=True)


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


def _run(cap: Capture, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return fx.GraphModule(module, cap.graph_module.graph)(x)


def test_changing_a_tuple_attribute_retraces() -> None:
    model, x = PicksColumns((1, 2)), torch.arange(8.0).reshape(2, 4)
    first = trace_for_scales(model)
    assert trace_for_scales(model) is first
    model.cols = (2, 3)
    second = trace_for_scales(model)
    assert second is not first
    assert _getitems(first.graph_module.graph) == [1, 2] and _getitems(second.graph_module.graph) == [2, 3]
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
    assert second is not first and len(_getitems(second.graph_module.graph)) == 3


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
    clear_capture_cache()
    second = trace_for_scales(model)
    assert second is not first
    assert second.python_code()[0] == first.python_code()[0]


def test_clear_is_needed_only_for_what_the_fingerprint_cannot_see() -> None:
    model = ReadsSettings()
    first = trace_for_scales(model)
    model.settings.scale = 5.0  # changed in place: invisible to the fingerprint
    assert trace_for_scales(model) is first
    clear_capture_cache()
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


def test_an_export_is_kept_per_input_signature_and_parameter_identity() -> None:
    model = MLP(4)
    x = torch.randn(2, 4)
    first = capture(model, x, route="export", cache=True)
    assert capture(model, torch.randn(2, 4), route="export", cache=True) is first  # other values, same signature
    assert capture(model, torch.randn(3, 4), route="export", cache=True) is not first  # another shape
    again = capture(model, x, route="export", cache=True)
    with torch.no_grad():
        model.fc1.weight = nn.Parameter(torch.zeros(16, 4))  # the exported graph holds the old one
    assert capture(model, x, route="export", cache=True) is not again


def test_a_request_with_other_options_is_another_entry() -> None:
    model, x = MLP(4), torch.randn(2, 4)
    plain, flat = capture(model, x, cache=True), capture(model, x, flat=True, cache=True)
    assert (
        plain is not flat
        and capture(model, x, cache=True) is plain
        and capture(model, x, flat=True, cache=True) is flat
    )
    assert [n.op for n in plain.nodes(compute_only=True)] == ["call_module"] * 3
    assert "call_module" not in [n.op for n in flat.nodes()]


def test_a_symbolic_trace_serves_every_input_shape_and_a_failure_is_kept_too() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    model = MLP(4)
    deep = DeepTracing()
    first = capture(model, torch.randn(2, 4), deep=deep, check=False, cache=True)
    assert capture(model, torch.randn(7, 4), deep=deep, check=False, cache=True) is first
    branchy = Branchy()
    eager = capture(branchy, torch.randn(3), route=("fx", "eager"), deep=deep, check=False, cache=True)
    assert eager.route == "eager" and "could not trace Branchy" in eager.reasons["fx"]
    assert capture(branchy, torch.randn(5), route=("fx", "eager"), deep=deep, check=False, cache=True) is eager
