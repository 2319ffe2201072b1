"""A small decoder-only transformer in two parametrisations, u-μP and standard (SP), and its data.

Both twins have the same architecture and take the width and depth as arguments, so a
learning-rate sweep over widths can compare how the best learning rate moves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unitscale.functional as U
from unitscale import nn as unn
from unitscale.errors import ConfigError
from unitscale.examples._checks import check_int
from unitscale.examples.data import MarkovSource

__all__ = ["UmupGPT", "SPGPT", "markov_batches"]


def _check_family(owner: str, vocab_size: int, width: int, depth: int, head_dim: int, max_len: int) -> int:
    check_int(owner, "vocab_size", vocab_size, 2)
    for name, value in (("width", width), ("depth", depth), ("head_dim", head_dim), ("max_len", max_len)):
        check_int(owner, name, value, 1)
    if width % head_dim:
        raise ConfigError(f"{owner}: width={width} is not divisible by head_dim={head_dim}; pass a multiple of it")
    return width // head_dim


class UmupGPT(nn.Module):
    """The u-μP twin: unit-scaled, tagged, residual branches weighted by :func:`~unitscale.scaling.residual_taus`.

    Token and position embeddings, a :class:`unitscale.nn.TransformerStack` of u-μP layers (RMS
    norms, SwiGLU, causal attention, ``to_output_scale`` constraints), an RMS norm and a readout;
    train it with :mod:`unitscale.optim`.

    Args:
        width: a multiple of ``head_dim``.
        max_len: longest sequence (learned positions).
        attn_mult: α_attn-softmax.
        ffn_mult: α_ffn-act.
        residual_mult: α_res.
        loss_mult: α_loss-softmax (on the readout).

    Raises:
        ConfigError: a size is not a positive int, or ``width`` is not a multiple of ``head_dim``.
        MultiplierError: a multiplier is not a finite number > 0.

    >>> import torch
    >>> from unitscale.examples import UmupGPT
    >>> _ = torch.manual_seed(0)
    >>> model = UmupGPT(16, width=32, depth=2)
    >>> idx = torch.randint(0, 16, (4, 12))
    >>> round(model.loss(idx[:, :-1], idx[:, 1:]).item(), 1)
    2.8
    """

    def __init__(
        self,
        vocab_size: int,
        width: int,
        depth: int = 2,
        head_dim: int = 16,
        max_len: int = 64,
        attn_mult: float = 1.0,
        ffn_mult: float = 1.0,
        residual_mult: float = 1.0,
        loss_mult: float = 1.0,
    ) -> None:
        super().__init__()
        heads = _check_family("UmupGPT", vocab_size, width, depth, head_dim, max_len)
        self.tokens = unn.Embedding(vocab_size, width)
        self.positions = unn.Embedding(max_len, width)
        self.blocks = unn.TransformerStack(
            depth,
            width,
            heads,
            residual_mult,
            is_causal=True,
            constraint="to_output_scale",
            attn_mult=attn_mult,
            mlp_mult=ffn_mult,
            norm="rms_norm",
            mlp="swiglu",
        )
        self.norm = unn.RMSNorm(width)
        self.readout = unn.LinearReadout(width, vocab_size, mult=loss_mult)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[-1], device=idx.device)
        # Two independent unit-std embeddings sum to std sqrt(2).
        x = (self.tokens(idx) + self.positions(positions)) * 0.5**0.5
        return self.readout(self.norm(self.blocks(x)))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Unit-scaled cross-entropy of the next-token predictions (its value is torch's)."""
        return U.cross_entropy(self(idx).flatten(0, -2), targets.flatten())


class _SPBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width, bias=False), nn.Linear(width, width, bias=False)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.gate = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(batch, seq, width))
        h = self.mlp_norm(x)
        return x + self.down(self.up(h) * F.silu(self.gate(h)))


class SPGPT(nn.Module):
    """The standard-parametrisation twin: same architecture as :class:`UmupGPT`, torch's defaults.

    Plain torch (``x + f(x)`` residuals, attention scaled by ``d_head**-0.5``); train it with
    ``torch.optim``.

    Args:
        width: a multiple of ``head_dim``.
        max_len: longest sequence.

    Raises:
        ConfigError: a size is not a positive int, or ``width`` is not a multiple of ``head_dim``.

    >>> from unitscale.examples import SPGPT, UmupGPT
    >>> count = lambda model: sum(p.numel() for p in model.parameters())
    >>> count(SPGPT(16, width=32, depth=1)), count(UmupGPT(16, width=32, depth=1))
    (19552, 19552)
    """

    def __init__(self, vocab_size: int, width: int, depth: int = 2, head_dim: int = 16, max_len: int = 64) -> None:
        super().__init__()
        heads = _check_family("SPGPT", vocab_size, width, depth, head_dim, max_len)
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(_SPBlock(width, heads) for _ in range(depth))
        self.norm = nn.RMSNorm(width)
        self.readout = nn.Linear(width, vocab_size, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[-1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.readout(self.norm(x))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy of the next-token predictions."""
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def markov_batches(
    source: MarkovSource, batch: int, seq_len: int, seed: int = 0
) -> Callable[[int], tuple[Tensor, Tensor]]:
    """A function ``step -> (inputs, targets)`` of next-token batches from ``source``, the same for every caller.

    Batch ``step`` is drawn with its own generator (seeded ``seed + step``) and kept, so every
    width and learning rate of a sweep trains on the same tokens.

    Args:
        seq_len: tokens per input sequence (targets are shifted by one).
        seed: seed of the first batch.

    Raises:
        ConfigError: ``batch`` or ``seq_len`` is not a positive int, or ``seed`` is negative.

    >>> from unitscale.examples import MarkovSource, markov_batches
    >>> data = markov_batches(MarkovSource(8), batch=2, seq_len=5)
    >>> x, y = data(0)
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all()), data(0)[0] is x
    (torch.Size([2, 5]), True, True)
    """
    check_int("markov_batches", "batch", batch, 1)
    check_int("markov_batches", "seq_len", seq_len, 1)
    check_int("markov_batches", "seed", seed, 0)
    kept: dict[int, tuple[Tensor, Tensor]] = {}

    def data(step: int) -> tuple[Tensor, Tensor]:
        if step not in kept:
            tokens = source.sample(batch, seq_len + 1, generator=torch.Generator().manual_seed(seed + step))
            kept[step] = (tokens[:, :-1], tokens[:, 1:])
        return kept[step]

    return data
