"""``module_state_kept``: what a forward changes on its module tree is undone, on success and failure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from unitscale.fx.module_state import module_state_kept


class Counts(nn.Module):
    """Assigns to itself and updates a buffer in place, as stateful forwards do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.last = x
        self.fc.extra = nn.ReLU()  # a submodule added on the fly
        return self.fc(x)


def test_attributes_submodules_and_buffer_values_are_put_back() -> None:
    model = Counts()
    weight = model.fc.weight
    with module_state_kept(model, values=True):
        model(torch.ones(1, 2))
        model(torch.ones(1, 2))
        assert model.steps.item() == 2.0 and hasattr(model, "last") and hasattr(model.fc, "extra")
    assert model.steps.item() == 0.0
    assert not hasattr(model, "last") and not hasattr(model.fc, "extra")
    assert model.fc.weight is weight and [n for n, _ in model.named_modules()] == ["", "fc"]


def test_without_values_only_the_structure_is_put_back() -> None:
    model = Counts()
    with module_state_kept(model):
        model(torch.ones(1, 2))
    assert model.steps.item() == 1.0 and not hasattr(model, "last")


def test_the_state_is_put_back_when_the_forward_fails() -> None:
    model = Counts()
    with pytest.raises(RuntimeError), module_state_kept(model, values=True):
        model(torch.ones(1, 3))  # fc fails after steps and last were set
    assert model.steps.item() == 0.0 and not hasattr(model, "last")
