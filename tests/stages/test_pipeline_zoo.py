"""``partition`` + ``run_pipeline`` training on the zoo of the capture invariant (issue 36).

For each torch-native pattern of ``tests/capture/test_faithful_zoo.py`` and each
``transformers`` family here, a two-stage pipeline's training step must give the loss and
every parameter's gradient of the model's own forward and ``.backward()`` (in float64; a
tied weight once, under its first name), or refuse with a typed error that names what it
cannot keep. An error from inside a worker is neither: it fails the test.

Starting worker processes costs seconds each, so by default the pipeline runs in this
process as one rank holding both stages (``"interleaved_1f1b"``, ``stages_per_rank=2``):
everything ``run_pipeline`` does but start a process (the checks, the stages pickled as
they travel, torch's ``PipelineStage`` and schedule, the gradients summed by name).
``UNITSCALE_SLOW_MODELS=1`` runs them on two real worker processes (``"gpipe"``), and
adds the families that take longest.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import tests.real_models as real_models
from tests.capture.test_faithful_zoo import ZOO, NoGradBlock, Recurrent, W, _build
from unitscale import partition, run_pipeline
from unitscale.errors import NoRouteError, StageCountError
from unitscale.stages.runtime.pickling import pickled
from unitscale.stages.runtime.worker import run_rank

SLOW = bool(os.environ.get("UNITSCALE_SLOW_MODELS"))
# torch warns that a reentrant checkpoint's inputs need no gradient: true of a pipeline's inputs
pytestmark = pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad=True")


@pytest.fixture(scope="module", autouse=True)
def one_rank_in_this_process() -> Iterator[None]:
    """``run_pipeline``'s one worker is this process (a gloo group of one); real workers with ``SLOW``."""
    if SLOW:
        yield
        return

    def in_process(jobs: list[bytes], names: Any, timeout: Any, main_hint: Any, main_path: Any) -> dict[int, Any]:
        (job,) = jobs
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            return {0: run_rank(0, pickle.loads(job))}
        finally:
            dist.destroy_process_group()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importlib.import_module("unitscale.stages.runtime.pipeline"), "run_workers", in_process)
        yield


def main_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "prediction_outputs", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    raise AssertionError(f"no output tensor in {type(out).__name__}")


def mse_on_main_output(out: Any, target: torch.Tensor) -> torch.Tensor:
    """The loss the pipeline's last stage applies to the model's own output (a tensor or a ``ModelOutput``)."""
    return nn.functional.mse_loss(main_output(out), target)


def pipeline_gradient_error(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> float:
    """Train ``model`` one step as a two-stage pipeline; check loss and gradients against its own; the worst error."""
    torch.manual_seed(0)
    target = torch.randn(main_output(model(*inputs)).shape, dtype=torch.float64)
    plan = partition(model, 2, inputs)
    schedule: dict[str, Any] = {"schedule": "gpipe"} if SLOW else {"schedule": "interleaved_1f1b", "stages_per_rank": 2}
    result = run_pipeline(plan, inputs, 2, **schedule, loss_fn=mse_on_main_output, target=target, timeout=120)
    model.zero_grad(set_to_none=True)
    loss = mse_on_main_output(model(*inputs), target)
    loss.backward()
    want = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(result.loss, loss.detach(), rtol=1e-10, atol=1e-12)
    assert sorted(result.grads) == sorted(want)  # one key per parameter the model trains, tied ones once
    for name, grad in want.items():
        torch.testing.assert_close(result.grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    return max((result.grads[n] - g).abs().max().item() for n, g in want.items())


def _with_head(kind: type[nn.Module]) -> nn.Module:
    """A recurrent layer and a linear head: two pieces, where the layer alone is one."""
    return nn.Sequential(Recurrent(kind), nn.Linear(W, W))


PIPELINE_ZOO: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    **ZOO,
    "lstm_head": (lambda: _with_head(nn.LSTM), (2, 5, W)),
    "gru_head": (lambda: _with_head(nn.GRU), (2, 5, W)),
}
# pattern -> (the typed refusal, what its message must name)
FUNCTION = r"autograd\.Function \S*{}.*the model's gradient is lost"
PIPELINE_REFUSED: dict[str, tuple[type[Exception], str]] = {
    "function_ste": (NoRouteError, FUNCTION.format("RoundSTE")),
    "function_grad_x100": (NoRouteError, FUNCTION.format("GradTimes100")),
    "checkpoint_reentrant": (NoRouteError, r"use_reentrant=True\) in the root \(Checkpointed\).*inputs alone"),
    "lstm": (StageCountError, "more than the 1 pieces Recurrent can be cut into"),
    "gru": (StageCountError, "more than the 1 pieces Recurrent can be cut into"),
}


@pytest.mark.parametrize("name", list(PIPELINE_ZOO))
def test_pipeline_training_on_the_zoo_is_the_models_own(name: str) -> None:
    build, shape = PIPELINE_ZOO[name]
    torch.manual_seed(0)
    model = build().double()
    x = torch.randn(shape, dtype=torch.float64)
    if name not in PIPELINE_REFUSED:
        assert pipeline_gradient_error(model, (x,)) < 1e-12
        return
    kind, message = PIPELINE_REFUSED[name]
    with pytest.raises(kind) as refused:
        pipeline_gradient_error(model, (x,))
    assert re.search(message, str(refused.value), re.S), str(refused.value)


def test_a_no_grad_block_travels_to_the_workers_as_it_is() -> None:
    # torch.fx pickles a GraphModule as its code and traces it again on loading: the trace ran
    # export's wrap_with_set_grad_enabled instead of recording it, so the worker's stage 0
    # computed a gradient the model does not, and torch's stage backward failed (untyped).
    model, x, _ = _build("no_grad_block")
    assert isinstance(model, NoGradBlock)
    plan = partition(model, 2, x)
    stage = plan.stage_modules()[0]
    travelled = pickle.loads(pickled("stage 0", stage, []))
    assert not stage(x).requires_grad and not travelled(x).requires_grad
    torch.testing.assert_close(travelled(x), stage(x), rtol=0, atol=0)


def _family(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = getattr(real_models, name)()
    return model.double(), tuple(x.double() if x.is_floating_point() else x for x in inputs)


# name -> the refusal's message (None: must train as the model does); the slow ones only with SLOW
FAMILIES: dict[str, str | None] = {
    "llama": None,
    "bert": None,
    "fnet": None,
    "gpt_neox": None,
    "bloom": r"GeLUFunction in module 'transformer\.h\.0\.mlp\.gelu_impl' \(BloomGelu\)",
}
SLOW_FAMILIES: dict[str, str | None] = {
    "gpt2": None,
    "albert": None,
    "deberta_v2": None,
    "phi3": None,
    "convnextv2": None,
    "swinv2": None,
    "patchtst": None,
    "vit_mae": None,
    # a branch on a tensor's value (is_global_attn): no graph route can hold the forward
    "longformer": r"(?s)no route could capture LongformerModel .*is_global_attn",
}


@pytest.mark.parametrize(
    "family",
    [
        *FAMILIES,
        *(
            pytest.param(f, marks=pytest.mark.skipif(not SLOW, reason="set UNITSCALE_SLOW_MODELS=1"))
            for f in SLOW_FAMILIES
        ),
    ],
)
def test_pipeline_training_on_transformers_families_is_the_models_own(family: str) -> None:
    model, inputs = _family(family)
    refused = {**FAMILIES, **SLOW_FAMILIES}[family]
    if refused is None:
        assert pipeline_gradient_error(model, inputs) < 1e-12
        return
    with pytest.raises(NoRouteError, match=refused):  # BLOOM's GELU: a Function with its own backward
        pipeline_gradient_error(model, inputs)
