"""Gemma 2 from its config: soft-capped logits and attention scores, masks of the dtype's lowest value.

Before: ``unit_scale`` raised an untyped ``ValueError: math domain error`` from the scale check
(the masked scores' std is inf, and the check ranked the op by ``log(0)``), and the pass
dropped the outer ``* 30`` of ``30 * tanh(logits / 30)`` as a constant factor (output std 0.04).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import fx, nn

from unitscale.transforms import check_scale, unit_scale

transformers = pytest.importorskip("transformers")


class Masked(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax((x * 8.0) + mask, dim=-1)


def test_the_scale_check_ranks_ops_around_a_tensor_of_infinite_std() -> None:
    """Scores plus a mask of the dtype's lowest value: the sum's std, near float32's largest, is ranked as any."""
    x = torch.randn(4, 16, 16)
    mask = torch.full((16, 16), torch.finfo(torch.float32).min).triu(1)
    check = check_scale(fx.symbolic_trace(Masked()), [x, mask])
    # the one std (tracking's std_stat) is torch.std's (correction=0) in float64, where float32's own overflowed to inf
    want = torch.std((x * 8.0 + mask).double(), correction=0).item()
    assert dict((n, f) for n, f, _ in check.stds)["add"] == pytest.approx(want, rel=1e-6)
    assert all(0 < d.factor < math.inf for d in check.drift)


def test_gemma2_is_unit_scaled_with_its_soft_caps_kept() -> None:
    config = transformers.AutoConfig.for_model(
        "gemma2",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    scaled = unit_scale(model)
    logits = scaled(ids).logits
    assert scaled.scale_check is not None and scaled.scale_check.ok, scaled.scale_check.summary()
    assert 0.5 < logits.std().item() < 2
    assert logits.abs().max().item() < config.final_logit_softcapping
    caps = [line for line in scaled.kept_ops if "soft-capping" in line]
    # per layer the attention scores' three ops, and the logits' three
    assert len(caps) == 3 * (config.num_hidden_layers + 1), scaled.kept_ops
