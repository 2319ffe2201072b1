"""Eval mode on unseen inputs: a CNN with batch norm and squeeze-excitation, trained a few steps (issue 39).

After a few training steps, eval-mode output std on fresh batches (same distribution, never
seen in training) should stay in the band the train-mode output had: batch norm's running
statistics stand for the batches they were averaged over, nothing more.

The band: the train-mode output std's range over the training steps, widened by 25% each
way. One batch's output std varies from batch to batch, and the plain model's eval/train
ratio in this setup is 0.91-1.17 (the small CNN), so the 25% takes that sampling spread and
no more. (An earlier note gave 0.87-1.28 for plain EfficientNet-B0; measured again, one run,
it is 0.46-1.17 and out of band: see below.)

The setup is realistic and documented, and the plain model is the oracle that it is: the
same architecture with torch's own batch norm, ``momentum=None`` (torch's cumulative
average, so a few steps give running statistics averaged over every batch seen rather than
mostly torch's initial mean 0 and variance 1), 32 samples a batch, and feature maps of at
least 3x3 at the last batch norm, so every channel's statistics come from hundreds of
values. With 8 samples and 2x2 maps (EfficientNet-B0 at 64x64, the setup first reported)
the PLAIN model is out of band too: running variances estimated from 32 values a channel
(8 independent samples) let single fresh samples land 5-10 of their standard deviations
out, and that compounds block by block (plain EfficientNet-B0, cumulative average: train
2.5-3.4, eval 5.7 / 2.7 / 3.5 on fresh batches, one sample at 12.3). That is the setup, not
unit scaling.

The unit-scaled model keeps its default ``momentum`` (0.1): ``unit_scale`` refuses
``momentum=None`` in training mode with a typed error naming the module (torch's batch norm
reads ``1 / float(num_batches_tracked)`` in Python). With every non-attention residual add at
``tau = 0.5`` the unit-scaled small CNN was out of band where the plain one is in it (train
1.40-1.64, eval 1.90 / 1.93 / 2.50): 0.5 weighs each block's branch as much as the whole
stream before it, another function than the model's; with the running-mean ``tau``
(``_residuals.py``) it is in band.

``U.batch_norm``'s running statistics. Its first training batch replaced the reset
statistics, then momentum 0.1, so after 5 steps two thirds of the statistics were the first
batch's, taken with the initial weights. The plain model given that rule is out of band
(train 2.44-3.14, eval 5.89 / 5.59 / 5.42) where with the cumulative average it is in band,
and unit-scaled EfficientNet-B0 at 96x96 was out of band (train 1.26-1.50, eval 0.95 / 2.34
/ 1.17). Now ``U.batch_norm`` is given the module's ``num_batches_tracked`` and updates at
rate ``max(1 / n, momentum)``: the first ``1 / momentum`` batches are averaged cumulatively
(torch's ``momentum=None``), then the exponential average takes over (tested below on every
route). Measured after that change, each in a fresh process (one run each; the draws of
dropout and stochastic depth make the train stds differ from earlier runs):

- RegNet-Y-400MF: unit-scaled train 1.55-1.64, eval 1.47 / 1.50 / 1.44, in band; plain
  (cumulative) train 0.38-0.68, eval 0.49 / 0.47 / 0.48, in band.
- LeViT-128S (64x64): unit-scaled train 2.37-2.60, eval 3.77 / 3.25 / 3.21, out of band
  (above it); but the plain model is out of band too (train 0.26-0.79, eval 1.03 / 0.98 /
  1.08): its output std grows at every step, so statistics averaged over the steps are
  not the last weights'. The setup does not hold for LeViT (its oracle fails), so both its
  tests are ``xfail`` with these numbers, not evidence either way.
- EfficientNet-B0: unit-scaled train 1.12-1.25, eval 0.32 / 0.32 / 0.32, below the band.
  Not the statistics: after the 5 steps each batch norm's running variance matches the
  variance its input has in training mode (median ratio per layer 0.94-1.08), and the same
  fresh batch in train mode gives 1.18, in band. Not the graphs either: the eval graph is
  the train graph's ops with the same constants (``tau`` included) less the stochastic-depth
  products and with dropout off. The output still depends on its input (per-class std over
  a batch 0.17-0.19); the signal shrinks, the same at every batch. Node by node on one fresh
  batch, the eval input of each batch norm has, of its running variance, 1.00 up to the first
  residual block with stochastic depth, then 0.96, 0.91, ... 0.41 (stage 5), 0.21, 0.13
  (stage 6) and 0.094 at the last: each block loses some and hands the loss on. The train
  graph with the random products at their expectation (batch statistics) shows what each
  block loses: 0.96 after a stage's first residual add, down to 0.89 in the last stages, the
  variance stochastic depth adds in training, ``(1 - tau) + tau / q`` of unit branches
  (``tau = 0.5``, ``q = 0.925``: 0.961, measured 0.959). That is the known disharmony of
  stochastic depth and batch norm, and the PLAIN model has it too: plain EfficientNet-B0
  here (cumulative average) is out of band as well, train 2.32-3.73, eval 2.73 / 1.90 /
  1.70 (band 1.85-4.67), and the small CNN with timm's ``drop_path`` at 0.2 in every block
  is, plain, train 0.45-0.60, eval 0.31-0.34. ``unit_scale`` now scales the product
  ``x * bernoulli(q) / q`` by ``q**0.5`` both ways, as ``U.dropout`` does, so in training it
  has its input's std and the stream its eval-mode width (tested below: a batch norm after a
  stochastic-depth block gives std 0.96-0.97 in eval mode, 0.79-0.84 before). Measured after
  that (one run each): the small CNN with ``drop_path`` 0.2, unit-scaled, train 1.64-1.76,
  eval 1.20 / 1.35 / 1.33 (0.86 / 0.93 / 0.90 before); EfficientNet-B0 train 1.11-1.22, eval
  0.61 / 0.79 / 0.79 (band 0.89-1.53): twice nearer, still out of band, and its oracle, the
  plain model, is out of band too. What is left is not located; a guess, not measured: a
  sample's block is dropped or kept, so training mixes two widths whose mean is now right,
  and the nonlinear ops after them (the squeeze-excitation gates, whose unit-scaled inputs
  are far from the plain model's near-zero ones) keep more than the mean; no static scale
  matches a mixture's every moment. Built with
  ``stochastic_depth_prob=0.0`` (one run, before the change), unit-scaled EfficientNet-B0 is
  in band: train 1.22-1.35, eval 1.28 / 1.32 / 1.58 (band 0.98-1.69). Not the route either:
  on the fx route (``stochastic_depth`` a leaf call there, which this rule does not see),
  train 1.00-1.39, eval 0.63 / 0.70 / 0.37. Both EfficientNet tests are ``xfail`` with these
  numbers, as LeViT's are: the setup's oracle fails for them.

The small CNN always runs; EfficientNet-B0, RegNet-Y-400MF and LeViT-128S (from their
configs, ``tests/vision_models.py``) run with ``UNITSCALE_SLOW_MODELS=1``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from unitscale.transforms import unit_scale

STEPS, BATCH, FRESH, WIDEN = 5, 32, 3, 1.25


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


class _Block(nn.Module):
    """An inverted residual block (EfficientNet's MBConv): expand, depthwise, squeeze-excite, project."""

    def __init__(self, c: int) -> None:
        super().__init__()
        wide = 4 * c
        self.body = nn.Sequential(
            *(nn.Conv2d(c, wide, 1, bias=False), nn.BatchNorm2d(wide), nn.SiLU()),
            *(nn.Conv2d(wide, wide, 3, padding=1, groups=wide, bias=False), nn.BatchNorm2d(wide), nn.SiLU()),
            *(_SqueezeExcite(wide), nn.Conv2d(wide, c, 1, bias=False), nn.BatchNorm2d(c)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        *(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.SiLU()),
        *(_Block(16) for _ in range(4)),
        *(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.SiLU()),
        *(_Block(32) for _ in range(4)),
        *(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)),
    ).train()


def _cumulative(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.momentum = None
    return model


def _logits(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits  # type: ignore[attr-defined]


def _train_then_eval(model: nn.Module, shape: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """Output stds of ``STEPS`` Adam steps (train mode), then of ``FRESH`` unseen batches in eval mode."""
    gen = torch.Generator().manual_seed(100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train = []
    model.train()
    for _ in range(STEPS):
        x, y = torch.randn(shape, generator=gen), torch.randint(0, 10, (shape[0],), generator=gen)
        out = _logits(model(x))
        train.append(out.std().item())
        opt.zero_grad()
        F.cross_entropy(out, y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        fresh = [_logits(model(torch.randn(shape, generator=gen))).std().item() for _ in range(FRESH)]
    return train, fresh


def _assert_in_band(train: list[float], fresh: list[float]) -> None:
    low, high = min(train) / WIDEN, max(train) * WIDEN
    assert all(low <= s <= high for s in fresh), f"eval stds {fresh} outside [{low:.2f}, {high:.2f}] (train {train})"


def _unit_scaled(model: nn.Module, **kwargs: Any) -> Any:
    logging.disable(logging.WARNING)  # the std check's summary, not under test here
    try:
        return unit_scale(model, **kwargs)
    finally:
        logging.disable(logging.NOTSET)


SMALL_SHAPE = (BATCH, 3, 16, 16)  # 4x4 maps at the last block: 512 values a channel


def test_plain_small_cnn_eval_in_band() -> None:
    """The oracle for the setup: torch's own batch norm, cumulative average, in band on fresh batches."""
    _assert_in_band(*_train_then_eval(_cumulative(_small_cnn()), SMALL_SHAPE))


def test_unit_scaled_small_cnn_eval_in_band() -> None:
    """Failed with every non-attention residual add at ``tau = 0.5``: eval 1.90-3.61 against train 1.40-1.64."""
    model = _unit_scaled(_small_cnn())
    logging.disable(logging.WARNING)
    try:
        _assert_in_band(*_train_then_eval(model, SMALL_SHAPE))
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("route", ["fx", "export", "dynamo", None])
def test_running_statistics_average_the_first_batches_cumulatively_on_every_route(route: str | None) -> None:
    """After ``k`` training batches, ``k <= 1 / momentum``, a unit-scaled batch norm's running statistics are the
    cumulative average of the ``k`` batches' (torch's ``momentum=None``), then the momentum update takes over.

    The batch norm reads the input, so its statistics are the batches' own. The plain model ran
    two training batches first: ``unit_scale`` resets the statistics and the count together.
    Failed before: the first batch replaced the reset statistics, then momentum 0.1 from the
    second (after 10 batches, 39% of the statistics were the first batch's, not 10%).
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).train()
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(16, 3, 8, 8, generator=gen) * (1 + k) + k for k in range(13)]
    model(xs[0]), model(xs[1])  # the plain model's own batches: forgotten by unit_scale
    kwargs = {} if route is None else {"example_inputs": (xs[0],), "route": route}
    scaled = _unit_scaled(model, **kwargs)
    bn = scaled.module[0]
    oracle = nn.BatchNorm2d(3, momentum=None)
    for k, x in enumerate(xs, start=1):
        scaled(x)
        if k <= 10:
            oracle(x)
            mean, var = oracle.running_mean, oracle.running_var
        else:
            mean = 0.9 * mean + 0.1 * x.mean((0, 2, 3))
            var = 0.9 * var + 0.1 * x.var((0, 2, 3), unbiased=True)
        assert torch.allclose(bn.running_mean, mean, rtol=1e-5, atol=1e-5), k
        assert torch.allclose(bn.running_var, var, rtol=1e-5, atol=1e-5), k
    assert bn.num_batches_tracked.item() == len(xs)


#: name -> input shape: 32 samples, and maps of at least 3x3 at the last batch norm.
HEAVY = {"efficientnet_b0": (BATCH, 3, 96, 96), "regnet_y_400mf": (BATCH, 3, 96, 96), "levit_128s": (BATCH, 3, 64, 64)}
slow = pytest.mark.skipif(not os.environ.get("UNITSCALE_SLOW_MODELS"), reason="set UNITSCALE_SLOW_MODELS=1")
#: The setup's oracle fails for these: the plain model is out of band too.
_NO_ORACLE = {
    "efficientnet_b0": pytest.mark.xfail(reason="plain EfficientNet-B0 out of band: eval 1.70-2.73, train 2.32-3.73"),
    "levit_128s": pytest.mark.xfail(reason="plain LeViT-128S out of band here: eval 0.98-1.08, train 0.26-0.79"),
}
_MARKS = _PLAIN_MARKS = {name: [mark] for name, mark in _NO_ORACLE.items()}


@slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_PLAIN_MARKS.get(n, [])) for n in sorted(HEAVY)])
def test_plain_vision_model_eval_in_band(name: str) -> None:
    from tests.vision_models import build

    model, _ = build(name)
    _assert_in_band(*_train_then_eval(_cumulative(model), HEAVY[name]))


@slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_MARKS.get(n, [])) for n in sorted(HEAVY)])
def test_unit_scaled_vision_model_eval_in_band(name: str) -> None:
    from tests.vision_models import build

    model = _unit_scaled(build(name)[0])
    logging.disable(logging.WARNING)
    try:
        _assert_in_band(*_train_then_eval(model, HEAVY[name]))
    finally:
        logging.disable(logging.NOTSET)


class _DropPath(nn.Module):
    """Stochastic depth as timm's ``drop_path`` writes it: a sample's branch kept with probability ``q``, over ``q``."""

    def __init__(self, q: float) -> None:
        super().__init__()
        self.q = q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return x * x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(self.q).div_(self.q)


def _torchvision_drop_path(q: float) -> nn.Module:
    """torchvision's ``StochasticDepth``: its function is a leaf on the fx route (``torch.fx.wrap``)."""
    from tests.vision_models import torchvision

    return torchvision.ops.StochasticDepth(1 - q, "row")


class _DropPathBlock(nn.Module):
    def __init__(self, c: int, q: float, drop_path: Any = _DropPath) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), drop_path(q))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@pytest.mark.parametrize("drop_path", [_DropPath, _torchvision_drop_path], ids=["timm", "torchvision"])
@pytest.mark.parametrize("route", ["fx", "export", None])
def test_batch_norm_after_stochastic_depth_unit_std_in_eval_mode(route: str | None, drop_path: Any) -> None:
    """A batch norm reading a residual stream whose branch has stochastic depth gives unit std in eval mode too.

    The oracle is batch norm's own promise: its running variance stands for its training
    inputs, so a fresh eval-mode batch of the same distribution comes out at the std training
    mode gives it, 1. Stochastic depth's ``x * bernoulli(q) / q`` has std ``q**-0.5`` times its
    input's in training mode and is the identity in eval mode; left unscaled, the stream's
    variance at ``tau = 0.5``, ``q = 0.5`` is 1.5 in training, 1 in eval mode, and the batch norm
    after it gave std ``1.5**-0.5 = 0.82`` on fresh batches (measured 0.79-0.84); now 0.96-0.97.
    The export route (aten's ``bernoulli_`` and ``div_`` were not read) and torchvision's
    ``stochastic_depth`` on the fx route (a leaf call) were not scaled: 0.79-0.84 there too.
    """
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)),
        _DropPathBlock(16, 0.5, drop_path),
        *(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16)),
    ).train()
    gen = torch.Generator().manual_seed(1)
    shape = (64, 3, 8, 8)
    kwargs = {} if route is None else {"example_inputs": (torch.randn(shape),), "route": route}
    scaled = _unit_scaled(model, **kwargs)
    with torch.no_grad():
        for _ in range(10):  # the cumulative average's batches: the running statistics of all ten
            scaled(torch.randn(shape, generator=gen))
        scaled.eval()
        stds = [scaled(torch.randn(shape, generator=gen)).std().item() for _ in range(3)]
    assert all(abs(s - 1) < 0.06 for s in stds), stds
