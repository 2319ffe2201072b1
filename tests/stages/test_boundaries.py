"""What crosses a stage boundary: integer ids, boolean masks, several tensors at once, and a ``None``
input that a later stage uses. The stages are built with their real example inputs and outputs
(``unitscale.stages.runtime.boundaries``), so no worker runs a stage on made-up indices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from unitscale import partition, run_pipeline
from unitscale.stages.runtime.boundaries import stage_examples


class Mixed(nn.Module):
    """Stage 0 makes a float activation, a boolean mask and passes token ids on; stage 1 embeds
    the ids (an integer tensor crossing the cut, as CLIP's text tower or Jamba's expert indices)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.e = nn.Linear(4, 4), nn.Linear(4, 4), nn.Embedding(10, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.a(x)
        keep = h > 0
        h = self.b(torch.relu(h))
        out = torch.where(keep, h, torch.zeros_like(h)) + self.e(ids)
        return out if scale is None else out * scale


def _mixed_plan() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], object]:
    torch.manual_seed(0)
    model = Mixed()
    x, ids = torch.randn(8, 4), torch.randint(0, 10, (8,))
    plan = partition(model, 2, (x, ids, None))
    plan = plan.with_bounds([0, 3, len(plan.node_costs)])  # cut after `b`: h, keep and ids all cross
    return model, (x, ids), plan


def test_the_cut_carries_a_float_a_bool_and_an_int_tensor() -> None:
    model, (x, ids), plan = _mixed_plan()
    (_, out0), (in1, _) = stage_examples(plan.stage_modules(), (x, ids, None), 4)
    dtypes = sorted(str(t.dtype) for t in in1)
    assert dtypes == ["torch.bool", "torch.float32", "torch.int64"]
    assert [tuple(t.shape) for t in out0] == [tuple(t.shape) for t in in1]
    assert all(t.shape[0] == 2 for t in in1)  # one microbatch of 8 / 4
    assert [t.requires_grad for t in in1 if t.dtype == torch.float32] == [True]
    assert plan.verify(x, ids, None)


def test_integer_and_boolean_tensors_cross_stages_in_a_real_training_step() -> None:
    model, (x, ids), plan = _mixed_plan()
    y = torch.randn(8, 4)
    result = run_pipeline(plan, (x, ids, None), 4, "1f1b", loss_fn=nn.MSELoss(), target=y, timeout=90)
    loss = nn.MSELoss()(model(x, ids), y)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach(), atol=1e-6, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(result.grads[name], p.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b"])
def test_the_ten_line_repro_of_the_issue_runs_forward_on_an_interleaved_schedule(schedule: str) -> None:
    torch.manual_seed(1)
    model = Mixed().eval()
    x, ids = torch.randn(8, 4), torch.randint(0, 10, (8,))
    plan = partition(model, 4, (x, ids, None))
    out = run_pipeline(plan, (x, ids, None), 4, schedule, stages_per_rank=2, timeout=90)
    torch.testing.assert_close(out, model(x, ids), atol=1e-6, rtol=0)
