"""unit_scale scales mean pools, layer scales, transposed convolutions, interpolation, MultiheadAttention, RNNs.

Each model uses one op that ``unit_scale`` used to leave unscaled (listed in ``unscaled_ops``).
Oracles: the twin named in the graph, the std of the output and of the input gradient for
unit-normal inputs, and finite differences in float64 for every gradient's direction.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.gradient_oracle import module_cosines, projected, worst
from unitscale import unit_scale


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


class MeanPoolHead(nn.Module):
    """timm's global pool: ``x.mean((2, 3))`` (or with ``keepdim``) before the classifier."""

    def __init__(self, keepdim: bool = False) -> None:
        super().__init__()
        self.keepdim = keepdim
        self.conv, self.head = nn.Conv2d(8, 32, 3, padding=1), nn.Linear(32, 10)

    def forward(self, x):
        pooled = F.relu(self.conv(x)).mean((2, 3), keepdim=self.keepdim)
        return self.head(pooled.flatten(1))


class TokenMean(nn.Module):
    """A ViT's mean over tokens: ``x.mean(dim=1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.proj(x).mean(dim=1))


class LayerScaleBlock(nn.Module):
    """ConvNeXt's and CaiT's ``x + gamma * branch(x)`` with ``gamma`` initialised to 1e-6."""

    def __init__(self) -> None:
        super().__init__()
        self.branch, self.head = nn.Linear(32, 32), nn.Linear(32, 8)
        self.gamma = nn.Parameter(1e-6 * torch.ones(32))

    def forward(self, x):
        return self.head(x + self.gamma * self.branch(x))


class Decoder(nn.Module):
    """A U-Net's upsampling path: a transposed convolution, then interpolation."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(self.up(x), scale_factor=2, mode="bilinear"))


class Attention(nn.Module):
    """``nn.MultiheadAttention`` in a residual block, as a ViT writes it."""

    def __init__(self, need_weights: bool = False) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.attn, self.head = nn.MultiheadAttention(32, 4, batch_first=True), nn.Linear(32, 8)

    def forward(self, x):
        return self.head(x + self.attn(x, x, x, need_weights=self.need_weights)[0])


class Recurrent(nn.Module):
    """``nn.LSTM`` (or ``nn.GRU``, ``nn.RNN``) then a head on every step (a tagger), or on the last step alone."""

    def __init__(self, cls: type[nn.Module] = nn.LSTM, last_step: bool = False, **kwargs) -> None:
        super().__init__()
        self.rnn, self.head, self.last_step = cls(8, 16, batch_first=True, **kwargs), nn.Linear(16, 4), last_step

    def forward(self, x):
        out = self.rnn(x)[0]
        return self.head(out[:, -1] if self.last_step else out)


class ResidualRecurrent(nn.Module):
    """An LSTM on a residual branch (``x + lstm(x)``): off the trunk, its twin keeps its constraint."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.head = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(x + self.rnn(x)[0])


CASES = {
    "mean_pool": (lambda: MeanPoolHead(), (16, 8, 8, 8), U.mean),
    "mean_pool_keepdim": (lambda: MeanPoolHead(keepdim=True), (16, 8, 8, 8), U.mean),
    "token_mean": (lambda: TokenMean(), (16, 12, 16), U.mean),
    "layer_scale": (lambda: LayerScaleBlock(), (64, 32), U.layer_scale),
    "conv_transpose2d": (lambda: Decoder(), (8, 16, 8, 8), U.conv_transpose2d),
    "interpolate": (lambda: Decoder(), (8, 16, 8, 8), U.interpolate),
    "multi_head_attention": (lambda: Attention(), (8, 16, 32), U.multi_head_attention_forward),
    "multi_head_attention_weights": (lambda: Attention(True), (8, 16, 32), U.multi_head_attention_forward),
    "lstm": (lambda: Recurrent(nn.LSTM), (8, 6, 8), U.lstm),
    "gru": (lambda: Recurrent(nn.GRU), (8, 6, 8), U.gru),
    "rnn_tanh": (lambda: Recurrent(nn.RNN), (8, 6, 8), U.rnn_tanh),
    "rnn_relu": (lambda: Recurrent(nn.RNN, nonlinearity="relu"), (8, 6, 8), U.rnn_relu),
    "lstm_residual": (lambda: ResidualRecurrent(), (8, 6, 8), U.lstm),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unit_scale_reports_the_op_scaled_and_keeps_unit_scale(name):
    build, shape, twin = CASES[name]
    model = build()
    x = torch.randn(shape, requires_grad=True)
    scaled = unit_scale(model)
    out = scaled(x)
    assert scaled.unscaled_ops == [], scaled.unscaled_ops
    assert any(node.target is twin for node in scaled.graph_module.graph.nodes)
    out.backward(torch.randn_like(out))
    assert 0.5 < out.std().item() < 2, out.std().item()
    assert 0.5 < x.grad.std().item() < 2, x.grad.std().item()


@pytest.mark.parametrize("name", list(CASES))
def test_unit_scaled_ops_keep_true_gradients(name):
    build, shape, _ = CASES[name]
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    scaled = unit_scale(build().double())
    scaled(x)
    cosines = module_cosines(scaled, lambda: projected(scaled(x)), {"x": x}, directions=3)
    assert min(cosines.values()) > 0.9999, worst(cosines)


def test_mean_pool_keeps_the_std_of_what_it_pools_where_it_was_root_n_smaller():
    """Before: ``x.mean((2, 3))`` over 8x8 gave 0.14 of its input's std (about ``64**-0.5``), left unscaled.

    The pool is scaled by ``64**0.5``; the rule for a ReLU's mean after it then brings the pooled
    values (mostly that mean, shared by every channel) to unit root-mean-square.
    """
    model = MeanPoolHead()
    x = torch.randn(64, 8, 8, 8)
    scaled = unit_scale(model)
    scaled(x)
    stds = dict((row[0], row[1]) for row in scaled.scale_check.stds)
    pooled = next(n for n in scaled.graph_module.graph.nodes if n.target is U.mean)
    ratio = stds[pooled.name] / stds[pooled.args[0].name]
    assert 0.8 < ratio < 1.5, stds


def test_layer_scale_gain_starts_at_one_as_a_norms_gain():
    scaled = unit_scale(LayerScaleBlock())
    scaled(torch.randn(4, 32))
    assert torch.equal(scaled.module.gamma.detach(), torch.ones(32))


def test_statistic_means_are_left_as_they_are():
    """A loss's mean and a hand-written norm's mean and variance are not pools: they are not scaled."""

    class HandNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            h = self.proj(x)
            u = h.mean(-1, keepdim=True)
            s = (h - u).pow(2).mean(-1, keepdim=True)
            return ((h - u) / torch.sqrt(s + 1e-5)).mean()

    scaled = unit_scale(HandNorm())
    scaled(torch.randn(8, 16))
    assert not any(node.target is U.mean for node in scaled.graph_module.graph.nodes)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_layers_are_captured_by_the_default_route(cls):
    """Before: ``CaptureError`` blaming "data-dependent Python control flow" (TorchDynamo refuses RNNs unless told);
    then GRU and RNN captured but left unscaled (``torch.gru``, ``torch.rnn_tanh`` in ``unscaled_ops``)."""
    scaled = unit_scale(Recurrent(cls, last_step=True))
    scaled(torch.randn(4, 6, 8))
    assert scaled.route == "dynamo" and scaled.unscaled_ops == []


@pytest.mark.parametrize(("cls", "twin"), [(nn.LSTM, U.lstm), (nn.GRU, U.gru), (nn.RNN, U.rnn_tanh)])
def test_recurrent_layers_are_scaled_on_the_export_route(cls, twin):
    """Before: with ``example_inputs`` (torch.export), ``aten.lstm.input`` (``aten.gru.input``, ...) and the zeros
    torch makes for ``h_0`` were listed unscaled."""
    x = torch.randn(4, 6, 8)
    scaled = unit_scale(Recurrent(cls), example_inputs=(x,))
    scaled(x)
    assert scaled.route == "export" and scaled.unscaled_ops == [], scaled.unscaled_ops
    assert any(node.target is twin for node in scaled.graph_module.graph.nodes)
