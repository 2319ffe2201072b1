"""unit_scale on ops written out by hand: RMS norm, tanh GELU, rotary embeddings, gates, constants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import unitscale.functional as U
from unitscale.transforms import apply_transform, unit_scale
from unitscale.transforms.patterns import fold_patterns


class HandRMSNorm(nn.Module):
    """``LlamaRMSNorm`` as transformers writes it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + 1e-6)
        return self.weight * x.to(dtype)


class HandGELU(nn.Module):
    """GPT-2's ``NewGELUActivation``; ``c`` other than sqrt(2 / pi) makes it another function."""

    def __init__(self, c: float = math.sqrt(2.0 / math.pi)) -> None:
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(self.c * (x + 0.044715 * torch.pow(x, 3.0))))


def _folded(model: nn.Module) -> nn.Module:
    def fold(gm: fx.GraphModule) -> fx.GraphModule:
        fold_patterns(gm.graph)
        gm.recompile()
        return gm

    return apply_transform(model, fold)


def test_a_written_out_rms_norm_folds_into_one_twin_that_computes_the_same() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 32), HandRMSNorm(32)), torch.randn(16, 32)
    folded = _folded(model)
    torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)
    calls = [n.target for n in folded.graph_module.graph.nodes if n.op in ("call_function", "call_method")]
    assert calls == [F.linear, "to", U.rms_norm]  # the cast to float32 before the norm stays
    (norm,) = [n for n in folded.graph_module.graph.nodes if n.target is U.rms_norm]
    assert norm.args[1:] == ((32,), norm.args[2], 1e-6) and norm.args[2].target == "1.weight"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_rms_norm_folds_with_its_casts_and_computes_the_same(dtype: torch.dtype) -> None:
    """A bf16 Llama's norm upcasts, normalises and casts back: the fold must hand on its dtype."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 32), HandRMSNorm(32), nn.Linear(32, 8)).to(dtype), torch.randn(16, 32)
    x = x.to(dtype)
    folded = _folded(model)
    out = folded(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, model(x), rtol=0.02, atol=0.02)
    calls = [n.target for n in folded.graph_module.graph.nodes if n.op in ("call_function", "call_method")]
    assert calls == [F.linear, "to", "to", U.rms_norm, "to", F.linear]  # input and gain up, the result back
    for route in ("fx", "dynamo", "export"):
        torch.manual_seed(0)
        scaled = unit_scale(model, example_inputs=x, route=route)
        assert scaled.unscaled_ops == [] and scaled(x).dtype == dtype, route


def test_a_written_out_tanh_gelu_folds_into_the_unit_scaled_gelu() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 32), HandGELU()), torch.randn(16, 32)
    folded = _folded(model)
    torch.testing.assert_close(folded(x), U.gelu(model[0](x), approximate="tanh"), rtol=1e-5, atol=1e-5)
    assert torch.allclose(F.gelu(x, approximate="tanh"), HandGELU()(x), atol=1e-6)
    calls = [n.target for n in folded.graph_module.graph.nodes if n.op in ("call_function", "call_method")]
    assert calls == [F.linear, U.gelu]


def test_unit_scale_folds_a_hand_rms_norm_and_resets_its_gain_to_one() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(nn.Sequential(nn.Linear(64, 64), HandRMSNorm(64), nn.Linear(64, 64)))
    y = scaled(torch.randn(256, 64))
    assert scaled.unscaled_ops == [] and torch.all(scaled.module[1].weight == 1)
    assert y.std().item() == pytest.approx(1.0, abs=0.1)


def test_a_near_miss_of_the_gelu_formula_is_not_folded_and_is_listed() -> None:
    scaled = unit_scale(nn.Sequential(nn.Linear(8, 8), HandGELU(c=0.8)))
    scaled(torch.randn(4, 8))
    assert not any(n.target is U.gelu for n in scaled.graph_module.graph.nodes)
    assert "torch.tanh (node tanh, module 1) at test_patterns.py:40" in scaled.unscaled_ops


class Rotary(nn.Module):
    """A linear layer, rotary position embedding on its output, and a gated product."""

    def __init__(self, d: int = 32, seq: int = 16) -> None:
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, d, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
        self.seq = seq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(self.seq, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = self.q(x)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        q = q * cos + rotated * sin
        return q * F.silu(self.gate(x))


def test_rotary_embedding_and_gated_product_are_kept_with_reasons_not_scaled() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(Rotary(), strict=True)
    x = torch.randn(64, 16, 32, requires_grad=True)
    y = scaled(x)
    y.backward(torch.randn_like(y))
    reasons = [line.split(": ", 1)[1] for line in scaled.kept_ops]
    assert reasons == [
        "rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)",
        "rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)",
        "rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)",
        "product of two activations (unit std times unit std stays unit std)",
    ]
    # The cos/sin table (outer, cat, cos, sin of positions and a buffer) is neither scaled nor listed.
    assert scaled.unscaled_ops == []
    assert not any(n.target in (U.add, U.matmul) for n in scaled.graph_module.graph.nodes)
    # x feeds two linear layers, whose unit gradients add: sqrt(2).
    assert 0.8 < y.std().item() < 1.25 and 1.2 < x.grad.std().item() < 1.7


class Scaled(nn.Module):
    def __init__(self, before: str) -> None:
        super().__init__()
        self.fc, self.head, self.before = nn.Linear(16, 16), nn.Linear(16, 16), before

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x) / 4.0
        return self.head(h) if self.before == "linear" else torch.softmax(h, dim=-1)


def test_a_constant_factor_before_a_linear_layer_is_dropped_before_a_softmax_it_stays() -> None:
    torch.manual_seed(0)
    to_linear = unit_scale(Scaled("linear"))
    y = to_linear(torch.randn(512, 16))
    assert to_linear.unscaled_ops == [] and y.std().item() == pytest.approx(1.0, abs=0.15)
    (dropped,) = [n for n in to_linear.graph_module.graph.nodes if n.target is U.scale]
    assert dropped.args[1:] == (1.0, 1.0)
    to_softmax = unit_scale(Scaled("softmax"))
    to_softmax(torch.randn(4, 16))
    assert [line.split(" at ")[0] for line in to_softmax.unscaled_ops] == ["operator.truediv (node h)"]


class GemmaNorm(nn.Module):
    """RMS norm with Gemma's gain ``1 + w`` (``w`` starts at zero)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc, self.weight = nn.Linear(d, d), nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed * (1.0 + self.weight)


def test_a_gain_computed_from_a_parameter_is_listed_unscaled_and_keeps_its_values() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(GemmaNorm(16))
    scaled(torch.randn(8, 16))
    assert [line.split(" (node")[0] for line in scaled.unscaled_ops] == ["operator.add", "operator.mul"]
    assert scaled.kept_ops == [] and torch.all(scaled.module.weight == 0)
    assert any(n.target is U.rms_norm for n in scaled.graph_module.graph.nodes)
