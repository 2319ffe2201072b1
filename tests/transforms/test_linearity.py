"""The linearity invariant: every scale of a unit-scaled graph is a constant, so its backward pass is linear.

Three consequences, each checked against the model's own autograd on the same forward (float64):

- two losses backpropagated one after the other give the gradient of their sum;
- a loss times ``c`` gives gradients times ``c`` (``c`` drawn by hypothesis);
- gradients accumulated over ``k`` micro-batches point where the batch's gradient points
  (cosine > 0.9999 per parameter). A shape-dependent factor (a mean-reduced loss's
  ``batch`` factor, batch norm's gain gradient's ``(N H W)**-0.5``) may differ between the two
  batch sizes, so the micro-batch sum is a positive multiple of the batch's gradient, per
  parameter; a scale read from the batch's gradient would make it point elsewhere.
  Batch norm in training mode normalises each micro-batch with its own statistics, which
  changes the function itself (torch's plain model differs too), so the micro-batch check
  runs in eval mode (batch norm with its running statistics, after one training call);
  the two-losses and scaled-loss checks run in training mode, batch norm included.

Models: the example models (``unitscale.examples``: ``MLP``, ``TinyGPT``, a ResNet, and
``UmupGPT``, already unit-scaled, without the transform), an LSTM classifier and a GRU tagger, CNN families from
``tests/vision_models.py`` (batch norm, squeeze-excitation) and ``transformers`` families
from ``tests/real_models.py``, all small.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unitscale.examples import MLP, ResNet, TinyGPT, UmupGPT
from unitscale.transforms import unit_scale

Built = tuple[torch.nn.Module, torch.Tensor]


def _examples() -> dict[str, Callable[[], Built]]:
    def mlp() -> Built:
        torch.manual_seed(0)
        return MLP(16, hidden=32), torch.randn(8, 16)

    def tinygpt() -> Built:
        torch.manual_seed(0)
        return TinyGPT(vocab_size=16, d_model=16, n_layers=2, n_heads=2, seq_len=8), torch.randint(0, 16, (8, 8))

    def resnet() -> Built:
        torch.manual_seed(0)
        return ResNet((1, 1, 1, 1), num_classes=10, width=4), torch.randn(8, 3, 32, 32)

    return {"mlp": mlp, "tinygpt": tinygpt, "resnet": resnet}


def _vision(name: str) -> Callable[[], Built]:
    def build() -> Built:
        from tests.vision_models import build as vision_build

        model, x = vision_build(name)
        return model, torch.randn((8, *x.shape[1:]), generator=torch.Generator().manual_seed(0))[:, :, :32, :32]

    return build


def _transformers(name: str) -> Callable[[], Built]:
    def build() -> Built:
        from tests import real_models

        model, (ids,) = getattr(real_models, name)()
        return model, real_models.token_ids(batch=8, seq=8)

    return build


def _recurrent(cls: type[torch.nn.Module], last_step: bool) -> Callable[[], Built]:
    def build() -> Built:
        from tests.transforms.test_unit_scale_new_ops import Recurrent

        torch.manual_seed(0)
        return Recurrent(cls, last_step=last_step), torch.randn(8, 6, 8)

    return build


MODELS: dict[str, Callable[[], Built]] = {
    **_examples(),
    "lstm_classifier": _recurrent(torch.nn.LSTM, last_step=True),
    "gru_tagger": _recurrent(torch.nn.GRU, last_step=False),
    **{name: _vision(name) for name in ("efficientnet_b0", "regnet_y_400mf")},
    **{name: _transformers(name) for name in ("gpt2", "llama", "bert")},
}


def _output(out: Any) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    assert isinstance(out, torch.Tensor)
    return out


@functools.cache
def scaled(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The unit-scaled model in float64, in training mode, called once (its graph captured, its factors measured)."""
    model, x = MODELS[name]()
    model = model.double().train()
    x = x.double() if x.is_floating_point() else x
    torch.manual_seed(0)
    result = unit_scale(model)
    result(x)
    return result, x


def _losses(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two losses of the output: a linear one and a non-linear one, with fixed random weights."""
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    b = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    return (out * a).sum(), (torch.tanh(out) * b).mean()


def _params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _grads(loss: torch.Tensor, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    found = torch.autograd.grad(loss, list(params.values()), retain_graph=True, allow_unused=True)
    return {n: g for n, g in zip(params, found, strict=True) if g is not None}


def _forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(1)  # dropout draws one mask per forward
    return _output(model(x))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_two_backward_calls_give_the_gradient_of_the_sum(name: str) -> None:
    """Training mode, batch norm included: ``l1.backward(); l2.backward()`` equals ``(l1 + l2).backward()``."""
    model, x = scaled(name)
    params = _params(model)
    l1, l2 = _losses(_forward(model, x))
    first, second, both = _grads(l1, params), _grads(l2, params), _grads(l1 + l2, params)
    assert both.keys() == first.keys() and both
    errors = _errors({n: first[n] + second[n] for n in both}, both)
    assert errors and max(errors.values()) < 1e-5, max(errors.items(), key=lambda kv: kv[1])
    # one fixed c for every family here; hypothesis draws c on the small models below
    times_c = _grads(3.7 * l1, params)
    errors = _errors(times_c, {n: 3.7 * g for n, g in first.items()})
    assert max(errors.values()) < 1e-5, max(errors.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("name", ["mlp", "tinygpt", "resnet", "lstm_classifier"])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.floats(1e-3, 1e3))
def test_a_loss_times_c_gives_gradients_times_c(name: str, c: float) -> None:
    model, x = scaled(name)
    params = _params(model)
    loss, _ = _losses(_forward(model, x))
    plain, times_c = _grads(loss, params), _grads(c * loss, params)
    errors = _errors(times_c, {n: c * g for n, g in plain.items()})
    assert errors and max(errors.values()) < 1e-5, max(errors.items(), key=lambda kv: kv[1])


def _significant(grads: dict[str, torch.Tensor]) -> list[str]:
    """Parameters whose gradient is not 0 up to rounding (a key bias under softmax has none)."""
    largest = max(g.norm().item() for g in grads.values())
    return [n for n, g in grads.items() if g.norm().item() > 1e-9 * largest]


def _errors(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, float]:
    """``|got - expected| / |expected|`` per parameter (float64; float32 islands, as Llama's norms, round at 1e-7)."""
    return {n: ((got[n] - expected[n]).norm() / expected[n].norm()).item() for n in _significant(expected)}


def _cosines(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {n: F.cosine_similarity(a[n].flatten(), b[n].flatten(), dim=0).item() for n in _significant(a)}


def _micro_batch_cosines(name: str, k: int) -> dict[str, float]:
    model, x = scaled(name)
    model = copy.deepcopy(model).eval()  # batch norm with running statistics (set by the training call)
    params = _params(model)
    out = _forward(model, x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    whole = _grads((out * weights).sum(), params)
    size = x.shape[0] // k
    summed: dict[str, torch.Tensor] = {}
    for rows in (slice(i * size, (i + 1) * size) for i in range(k)):
        # each micro-batch's share of the batch's loss: the shares add up to it
        part = (_forward(model, x[rows]) * weights[rows]).sum()
        for n, g in _grads(part, params).items():
            summed[n] = summed[n] + g if n in summed else g
    return _cosines(whole, summed)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_micro_batches_add_up_to_the_batch(name: str) -> None:
    cosines = _micro_batch_cosines(name, 2)
    assert cosines and min(cosines.values()) > 0.9999, sorted(cosines.items(), key=lambda kv: kv[1])[:3]


@settings(max_examples=3, deadline=None)
@given(k=st.sampled_from([2, 4, 8]))
def test_micro_batches_add_up_to_the_batch_for_any_count(k: int) -> None:
    cosines = _micro_batch_cosines("resnet", k)
    assert min(cosines.values()) > 0.9999, sorted(cosines.items(), key=lambda kv: kv[1])[:3]


def test_umup_gpt_is_linear_in_its_loss() -> None:
    """The u-μP example is unit-scaled by construction: its backward is linear too (no transform)."""
    torch.manual_seed(0)
    model = UmupGPT(vocab_size=16, width=32, depth=2, head_dim=16, max_len=8).double()
    ids, targets = torch.randint(0, 16, (8, 8)), torch.randint(0, 16, (8, 8))
    params = _params(model)
    l1 = model.loss(ids, targets)
    l2 = (model(ids) ** 2).mean()
    first, second, both = _grads(l1, params), _grads(l2, params), _grads(3.0 * l1 + l2, params)
    errors = _errors({n: 3.0 * first[n] + second[n] for n in both}, both)
    assert max(errors.values()) < 1e-9
    whole = _grads(model.loss(ids, targets), params)
    halves = [_grads(model.loss(ids[i : i + 4], targets[i : i + 4]), params) for i in (0, 4)]
    cosines = _cosines(whole, {n: halves[0][n] + halves[1][n] for n in whole})
    assert min(cosines.values()) > 0.9999
