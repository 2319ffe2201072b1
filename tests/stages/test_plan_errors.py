"""Plans that are not plans, and bad inputs seen while trying: each refused with a typed error that
names what the user passed."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from unitscale import partition
from unitscale.errors import BlockedCutError, CostError, PlanMismatchError
from unitscale.stages import plan_pipeline


class KeepsItsShape(nn.Module):
    """Reads its input's shape first and uses it last, as transformers' fx-traced GPT-2 does with
    its ``input_shape``: a ``torch.Size`` cannot cross a stage boundary, so no cut between."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = self.b(torch.relu(self.a(x.reshape(shape))))
        return h.view(shape) * 2


def test_a_plan_whose_only_cuts_leave_a_stage_idle_names_the_values_blocking_them() -> None:
    graph_module = fx.symbolic_trace(KeepsItsShape())  # a GraphModule is partitioned as it is
    x = torch.randn(2, 4)
    # the only allowed cut is before `mul`, after the view that ends `shape`'s life: stages [40, 0]
    allowed = [b for b in partition(graph_module, 1, x).pieces[1:-1]]
    assert len(allowed) == 1
    with pytest.raises(BlockedCutError, match=r"stage\(s\) \[1\] with nothing to do") as info:
        partition(graph_module, 2, x)
    message = str(info.value)
    assert "only 1 of the 6 places between nodes may be cut" in message
    assert "'getattr_1' (Size," in message and "torch.export" in message and "fewer stages" in message
    assert info.value.blockers == ["getattr_1"]


def test_the_same_model_exported_as_the_message_advises_is_cut_freely() -> None:
    # in torch.export's graph the size is numbers (or symbols each stage remakes): the cuts are free
    x = torch.randn(2, 4)
    exported = torch.export.export(KeepsItsShape(), (x,), strict=False).module()
    plan = partition(exported, 2, x)
    assert plan.stage_costs == [20.0, 20.0] and plan.verify(x)


def test_a_cost_too_large_for_a_float_is_a_cost_error_naming_the_argument() -> None:
    model, x = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), torch.randn(3, 2)
    with pytest.raises(CostError, match=r"the cost callable returned an int too large for a float \(401 digits\)"):
        partition(model, 2, x, cost=lambda node: 10**400)
    with pytest.raises(CostError, match=r"the backward callable returned an int too large"):
        plan_pipeline(model, x, 2, num_microbatches=2, cost="params", backward=lambda node: 10**400)


def test_costs_under_a_plan_of_another_model_is_a_plan_mismatch_naming_the_argument() -> None:
    x = torch.randn(3, 2)
    plan = partition(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), 2, x)
    other = partition(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), 1, x, cost="flops")
    with pytest.raises(PlanMismatchError, match=r"costs_under\(other=StagePlan\(Sequential.*no cost for 1 of"):
        plan.costs_under(other)
    assert isinstance(PlanMismatchError("x"), ValueError)
