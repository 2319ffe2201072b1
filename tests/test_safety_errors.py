"""Failures that used to reach the caller untyped or blamed on the inputs: each typed, naming the call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale as us
from unitscale.capture import capture
from unitscale.errors import BackwardError, MetaTensorError, OutOfMemoryError, ReplaceMapError, UnitscaleError
from unitscale.tracking import analyse_module

X = torch.randn(3, 4)


def failing_backward_hook(*_: Any) -> None:
    raise ValueError("bad gradient from the hook")


class RaisesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad gradient from the hook")


class CustomBackward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RaisesInBackward.apply(x)


def with_backward_hook() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[1].register_full_backward_hook(failing_backward_hook)
    return model


def with_custom_backward() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), CustomBackward(), nn.Linear(4, 2))


@pytest.mark.parametrize("tool", ["track_scales", "analyse_module"])
@pytest.mark.parametrize(
    # the eager route runs the model's own backward (what fx drops of it is capture's business)
    ("make", "route"),
    [(with_backward_hook, "eager"), (with_custom_backward, "eager")],
)
def test_a_backward_that_raises_is_a_typed_error_naming_the_call(tool: str, make: Any, route: str) -> None:
    fn = us.track_scales if tool == "track_scales" else analyse_module
    with pytest.raises(BackwardError, match=rf"^{tool}\(\): the backward pass of Sequential failed") as info:
        fn(make(), X, route=route)
    assert isinstance(info.value, RuntimeError)
    assert "ValueError: bad gradient from the hook" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_a_replacement_of_the_wrong_signature_is_refused_by_unit_scale() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())

    def gelu_without_approximate(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    with pytest.raises(ReplaceMapError, match=r"replace\['gelu'\] = gelu_without_approximate\(x.*approximate") as info:
        us.unit_scale(model, replace={F.gelu: gelu_without_approximate}, example_inputs=(X,))
    assert isinstance(info.value, TypeError)

    calls = []

    def gelu_taking_it(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        calls.append(approximate)
        return F.gelu(x, approximate=approximate)

    scaled = us.unit_scale(model, replace={F.gelu: gelu_taking_it}, example_inputs=(X,))
    calls.clear()
    scaled(X)
    assert calls == ["none"]  # the replacement runs, with the call it replaced


def meta_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: us.track_scales(m, X),
        lambda m: us.track_scales(m, X, route="eager"),
        lambda m: us.partition(m, 2, X),
        lambda m: us.unit_scale(m, example_inputs=(X,)),
        lambda m: capture(m, X),
    ],
)
def test_a_meta_model_is_refused_up_front_saying_how_to_materialise_it(call: Any) -> None:
    with pytest.raises(MetaTensorError, match=r"meta device \(0\.weight, 0\.bias, 2\.weight.*to_empty"):
        call(meta_model())
    materialised = meta_model().to_empty(device="cpu")
    for p in materialised.parameters():
        nn.init.normal_(p)
    call(materialised)  # runs once it holds values


def test_a_meta_input_is_refused() -> None:
    with pytest.raises(MetaTensorError, match="input 0"):
        us.track_scales(nn.Linear(4, 2), torch.empty(3, 4, device="meta"))


class Huge(nn.Module):
    """Asks the allocator for 2**50 floats: torch's own "can't allocate memory", at no cost."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.zeros(2**50, 4).sum()


@pytest.mark.parametrize(
    "call",
    [
        lambda m: us.track_scales(m, X),
        lambda m: us.track_scales(m, X, route="eager"),
        lambda m: us.partition(m, 2, X),
        lambda m: capture(m, X),
    ],
)
def test_running_out_of_memory_is_not_blamed_on_the_inputs(call: Any) -> None:
    with pytest.raises(OutOfMemoryError, match="ran out of memory.*smaller") as info:
        call(Huge())
    assert isinstance(info.value, MemoryError) and isinstance(info.value, UnitscaleError)
    assert "Check that" not in str(info.value) and "can't allocate memory" in str(info.value)
    assert "can't allocate memory" in str(info.value.__cause__)


def test_running_out_of_memory_while_costing_is_not_blamed_on_the_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture fits, then the per-node profiler runs out: partition says so, as capture does."""
    from unitscale.stages.partitioner import costs

    def out_of_memory(self: Any, node: Any) -> Any:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2**52 bytes")

    monkeypatch.setattr(costs.NodeProfiler, "run_node", out_of_memory)
    with pytest.raises(OutOfMemoryError, match="costing Sequential ran out of memory.*smaller") as info:
        us.partition(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), 2, X)
    assert "do not fit" not in str(info.value) and "can't allocate memory" in str(info.value.__cause__)
