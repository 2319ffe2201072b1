"""The claims of tutorial 12, pinned on a tiny transformer: unit-scaled FP8 trains like unit-scaled
FP32, and plain FP8 with the loss divided by 64 loses its weight gradients to E5M2's range.

The oracles are torch's own: the FP32 run of the same model from the same weights on the same
batches, and torch's ``float8_e5m2`` cast of the FP32 gradients (a value it sends to zero is one
that no E5M2 rounding can keep).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from unitscale.examples import MarkovSource, TinyGPT
from unitscale.transforms import simulate_fp8, unit_scale

VOCAB, SEQ, BATCH, DIVISOR = 8, 8, 16, 64
SOURCE = MarkovSource(vocab_size=VOCAB, concentration=0.2, seed=0)
BATCHES = [SOURCE.sample(BATCH, SEQ + 1, generator=torch.Generator().manual_seed(s)) for s in range(20)]


def _model(unit_scaled: bool, fp8: bool) -> nn.Module:
    torch.manual_seed(0)
    model: nn.Module = TinyGPT(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, seq_len=SEQ)
    if unit_scaled:
        model = unit_scale(model)
    if fp8:
        model = simulate_fp8(model)
    torch.manual_seed(1)  # the unit-scaled weights are drawn at the first call: the same for both
    _loss(model, BATCHES[0], unit_scaled)
    model.zero_grad(set_to_none=True)
    return model


def _loss(model: nn.Module, tokens: torch.Tensor, unit_scaled: bool) -> torch.Tensor:
    loss_fn = U.cross_entropy if unit_scaled else F.cross_entropy
    return loss_fn(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _train(model: nn.Module, unit_scaled: bool, lr: float) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for tokens in BATCHES:
        loss = _loss(model, tokens, unit_scaled)
        opt.zero_grad()
        (loss / DIVISOR).backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _weight_grad_zero_share(model: nn.Module, unit_scaled: bool) -> float:
    model.zero_grad(set_to_none=True)
    (_loss(model, BATCHES[0], unit_scaled) / DIVISOR).backward()
    grads = [p.grad for p in model.parameters() if p.dim() > 1 and p.grad is not None]
    return float(sum((g == 0).sum() for g in grads) / sum(g.numel() for g in grads))


def _e5m2_zero_share(model: nn.Module, unit_scaled: bool) -> float:
    """The share of the FP32 weight gradients that torch's E5M2 cast sends to zero."""
    model.zero_grad(set_to_none=True)
    (_loss(model, BATCHES[0], unit_scaled) / DIVISOR).backward()
    grads = [p.grad for p in model.parameters() if p.dim() > 1 and p.grad is not None]
    zeros = sum(((g.to(torch.float8_e5m2).float() == 0) & (g != 0)).sum() for g in grads)
    return float(zeros / sum(g.numel() for g in grads))


def test_unit_scaled_fp8_training_tracks_unit_scaled_fp32_with_the_loss_divided_by_64() -> None:
    fp32 = _train(_model(unit_scaled=True, fp8=False), unit_scaled=True, lr=0.05)
    fp8 = _train(_model(unit_scaled=True, fp8=True), unit_scaled=True, lr=0.05)
    assert fp8 != fp32, "simulate_fp8 rounded nothing: the comparison would be trivial"
    learned = fp32[0] - sum(fp32[-5:]) / 5
    assert learned > 0.2, f"the FP32 run learned only {learned:.3f} nats: the test says nothing"
    gap = sum(fp8[-5:]) / sum(fp32[-5:]) - 1
    assert abs(gap) < 0.02, f"unit-scaled FP8 ends {gap:+.2%} from unit-scaled FP32"


def test_plain_fp8_flushes_the_weight_gradients_that_unit_scaled_fp8_keeps() -> None:
    # torch's cast says which FP32 gradients E5M2 cannot hold
    plain_cast = _e5m2_zero_share(_model(unit_scaled=False, fp8=False), unit_scaled=False)
    scaled_cast = _e5m2_zero_share(_model(unit_scaled=True, fp8=False), unit_scaled=True)
    assert plain_cast > 0.1 and scaled_cast < 0.01, (plain_cast, scaled_cast)
    # simulated FP8 loses at least those, and more upstream of each rounded gradient
    plain_fp8 = _weight_grad_zero_share(_model(unit_scaled=False, fp8=True), unit_scaled=False)
    scaled_fp8 = _weight_grad_zero_share(_model(unit_scaled=True, fp8=True), unit_scaled=True)
    assert plain_fp8 >= plain_cast - 0.02, (plain_fp8, plain_cast)
    assert scaled_fp8 < 0.01 and plain_fp8 - scaled_fp8 > 0.1, (plain_fp8, scaled_fp8)
