"""``unitscale.run_pipeline``: real multi-process pipelines on gloo (kept few and small)."""

from __future__ import annotations

import signal
import sys
import types

import pytest
import torch
from torch import nn

from unitscale import partition, run_pipeline
from unitscale.errors import InputError, PipelineError, UnknownScheduleError
from unitscale.examples.models import MLP, TinyGPT


def failing_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("loss exploded on purpose")


def test_two_stage_gpipe_output_matches_the_single_process_model() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    idx = torch.randint(0, 16, (4, 8))
    plan = partition(model, 2, idx, boundary_depth=2)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = run_pipeline(plan, idx, num_microbatches=2, timeout=90)
    # torch's launcher replaces the caller's handlers while it runs; Ctrl-C stays a KeyboardInterrupt after
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert out.shape == (4, 8, 16)
    torch.testing.assert_close(out, model(idx), atol=1e-5, rtol=0)


def test_three_stage_1f1b_training_step_matches_unsplit_gradients() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(MLP(8, 16), nn.GELU(), MLP(8, 32, 4))
    x, y = torch.randn(8, 8), torch.randn(8, 4)
    plan = partition(model, 3, x)
    result = run_pipeline(plan, x, num_microbatches=4, schedule="1f1b", loss_fn=nn.MSELoss(), target=y, timeout=90)
    loss = nn.MSELoss()(model(x), y)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach(), atol=1e-5, rtol=0)
    assert sorted(result.grads) == sorted(name for name, _ in model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(result.grads[name], p.grad, atol=1e-5, rtol=0)


class TiedLM(nn.Module):
    """An embedding tied to the output projection, and a layer (``shared``) run in both stages."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.shared = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.shared(self.emb(ids)))
        h = torch.tanh(self.mid(h))
        return self.head(torch.tanh(self.shared(h)))


def test_pipeline_gradients_of_tied_and_shared_weights_are_the_models() -> None:
    # Stage 0 read the tied tensor as emb.weight, stage 1 as head.weight: each name came back
    # with one stage's part of the gradient (their sum was the model's).
    torch.manual_seed(0)
    model = TiedLM()
    ids, y = torch.randint(0, 10, (4, 3)), torch.randn(4, 3, 10)
    plan = partition(model, 2, ids).with_bounds([0, 3, 8])  # emb, shared, tanh | mid, ..., shared, head
    uses = plan.stage_parameter_names()
    assert "emb.weight" in uses[0] and "head.weight" in uses[1]
    assert "shared.weight" in uses[0] and "shared.weight" in uses[1]
    result = run_pipeline(plan, ids, 2, loss_fn=nn.MSELoss(), target=y, timeout=60)
    nn.MSELoss()(model(ids), y).backward()
    assert list(result.grads) == [name for name, _ in model.named_parameters()]  # head.weight is emb.weight
    for name, p in model.named_parameters():
        torch.testing.assert_close(result.grads[name], p.grad, atol=1e-6, rtol=0)


class RowLoop(nn.Module):
    """Weights each row by its index in a Python loop: export fixes the batch size it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(torch.stack([h[i] * (i + 1) for i in range(x.shape[0])]))


def test_microbatches_of_a_batch_export_fixed_are_refused_before_starting_workers() -> None:
    # The first stage ran on a microbatch of 2 rows and failed with an untyped IndexError (select(): index 2).
    model, x = RowLoop(), torch.randn(4, 4)
    plan = partition(model, 2, x)
    assert plan.route == "export"
    fixed = r"has shape \(2, 4\), but the graph was captured by torch.export for shape \(4, 4\)"
    with pytest.raises(InputError, match=r"^verify\(\): input 'x' " + fixed):
        plan.verify(x[:2])
    with pytest.raises(InputError, match=r"^run_pipeline\(num_microbatches=2\)'s microbatch: input 'x' " + fixed):
        run_pipeline(plan, x, 2)
    torch.testing.assert_close(run_pipeline(plan, x, 1, timeout=60), model(x))  # its own batch runs


def test_worker_failure_surfaces_as_pipeline_error_in_the_caller() -> None:
    torch.manual_seed(0)
    model = MLP(4, 8)
    x = torch.randn(4, 4)
    plan = partition(model, 2, x)
    with pytest.raises(PipelineError, match=r"(?s)^stage 1 worker failed:.*loss exploded on purpose"):
        run_pipeline(plan, x, 2, loss_fn=failing_loss, target=torch.randn(4, 4), timeout=60)


def test_fewer_rows_than_microbatches_is_refused_before_starting_workers() -> None:
    plan = partition(MLP(4), 2, torch.randn(2, 4))
    with pytest.raises(
        InputError, match=r"^pipeline input 0 has batch size 2 \(dim 0\), fewer than num_microbatches=4"
    ):
        run_pipeline(plan, torch.randn(2, 4), 4)


def test_unknown_schedule_and_unpicklable_loss_are_refused() -> None:
    plan = partition(MLP(4), 2, torch.randn(2, 4))
    with pytest.raises(UnknownScheduleError, match=r"^unknown schedule 'zb'; use one of 'gpipe', '1f1b', .*'zbv'$"):
        run_pipeline(plan, torch.randn(2, 4), 1, schedule="zb")
    with pytest.raises(PipelineError, match=r"^loss_fn cannot be pickled for the worker processes"):
        run_pipeline(plan, torch.randn(2, 4), 1, loss_fn=lambda o, t: o.sum(), target=torch.randn(2, 4))


def test_loss_defined_in_a_notebook_main_is_refused_with_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    notebook_main = types.ModuleType("__main__")  # like a Jupyter kernel's: no __file__
    monkeypatch.setitem(sys.modules, "__main__", notebook_main)

    def my_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output - target).pow(2).mean()

    my_loss.__module__ = "__main__"
    plan = partition(MLP(4), 2, torch.randn(2, 4))
    with pytest.raises(PipelineError, match=r"^loss_fn 'test_loss.*my_loss' is defined in __main__ \(a notebook"):
        run_pipeline(plan, torch.randn(2, 4), 1, loss_fn=my_loss, target=torch.randn(2, 4))
