"""Unit-scaled transformer blocks: MLP, multi-head self-attention, a pre-norm layer."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.nn._activations import GELU
from unitscale.nn._linear import Linear, _check_sizes
from unitscale.nn._norms import LayerNorm
from unitscale.scaling.checks import check_p, check_tau
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint


class MLP(nn.Module):
    """Unit-scaled feed-forward block: ``Linear(d, e*d) -> GELU -> Linear(e*d, d)``.

    Args:
        hidden_size: model width ``d``.
        expansion_factor: the inner width is ``expansion_factor * d``.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import MLP
    >>> _ = torch.manual_seed(0)
    >>> round(MLP(64)(torch.randn(512, 64)).std().item(), 1)
    1.0
    """

    def __init__(self, hidden_size: int, expansion_factor: int = 4, constraint: ConstraintArg = "gmean") -> None:
        super().__init__()
        inner = expansion_factor * hidden_size
        self.linear_1 = Linear(hidden_size, inner, constraint=constraint)
        self.act = GELU(constraint=constraint)
        self.linear_2 = Linear(inner, hidden_size, constraint=constraint)

    def forward(self, input: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(input)))


class MHSA(nn.Module):
    """Unit-scaled multi-head self-attention: fused QKV projection, attention, output projection.

    The attention scales assume keys and values independent; here both are
    projections of the same tokens, so the output carries some real signal that
    the scaling amplifies: without causal masking its std grows slowly with the
    sequence length (about 1.2 at 64 tokens, 1.6 at 256).

    Args:
        hidden_size: model width, divisible by ``heads``.
        heads: number of attention heads.
        is_causal: mask future positions.
        dropout_p: attention dropout probability (while training).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        InputError: ``hidden_size`` is not divisible by ``heads``, or ``dropout_p`` not in ``[0, 1)``.
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import MHSA
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 32, 64)
    >>> round(MHSA(64, heads=4, is_causal=True, constraint=None)(x).std().item(), 1)
    1.0

    With the default ``gmean`` constraint the fused ``64 -> 192`` projection gives
    ``q``, ``k``, ``v`` std ``3**-0.25``, and the output is below 1:

    >>> round(MHSA(64, heads=4, is_causal=True)(x).std().item(), 1)
    0.8
    """

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        super().__init__()
        _check_sizes("MHSA", hidden_size=hidden_size, heads=heads)
        if heads < 1 or hidden_size % heads:
            raise InputError(
                f"MHSA: hidden_size={hidden_size} is not divisible by heads={heads}; pick heads dividing hidden_size"
            )
        if check_p("MHSA", dropout_p, "dropout_p") == 1:
            raise InputError("MHSA: dropout_p=1 drops every attention weight; pass a value below 1")
        resolve_constraint(constraint)
        self.heads = heads
        self.is_causal = is_causal
        self.dropout_p = dropout_p
        self.constraint = constraint
        self.linear_qkv = Linear(hidden_size, 3 * hidden_size, constraint=constraint)
        self.linear_o = Linear(hidden_size, hidden_size, constraint=constraint)

    def forward(self, input: Tensor) -> Tensor:
        # (..., seq, 3 * width) -> (3, ..., heads, seq, head_dim); no shape unpacking, so torch.fx can trace it
        qkv = self.linear_qkv(input).unflatten(-1, (3, self.heads, -1)).movedim(-3, 0).transpose(-3, -2)
        out = U.scaled_dot_product_attention(
            qkv[0],
            qkv[1],
            qkv[2],
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=self.is_causal,
            constraint=self.constraint,
        )
        return self.linear_o(out.transpose(-3, -2).flatten(-2))


class TransformerLayer(nn.Module):
    """A unit-scaled pre-norm transformer layer with ``residual_split`` / ``residual_add`` residuals.

    ``x -> x' = residual_add(MHSA(LN(r)), s, attn_tau)`` with ``r, s = residual_split(x, attn_tau)``,
    then the same with the MLP and ``mlp_tau``.

    Args:
        hidden_size: model width, divisible by ``heads``.
        heads: number of attention heads.
        is_causal: mask future positions.
        dropout_p: dropout on attention weights and on each branch's output (while training).
        attn_tau: share of the variance the attention branch adds (0.01 after Blake et al.).
        mlp_tau: share of the variance the MLP branch adds.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        InputError: bad ``hidden_size``/``heads``, ``dropout_p`` or tau.
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import TransformerLayer
    >>> _ = torch.manual_seed(0)
    >>> layer = TransformerLayer(64, heads=4)
    >>> round(layer(torch.randn(8, 32, 64)).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        attn_tau: float = 0.01,
        mlp_tau: float = 0.5,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        super().__init__()
        self.attn_tau = check_tau("TransformerLayer", attn_tau, "attn_tau")
        self.mlp_tau = check_tau("TransformerLayer", mlp_tau, "mlp_tau")
        self.dropout_p = dropout_p
        self.attn_norm = LayerNorm(hidden_size)
        self.attn = MHSA(hidden_size, heads, is_causal=is_causal, dropout_p=dropout_p, constraint=constraint)
        self.mlp_norm = LayerNorm(hidden_size)
        self.mlp = MLP(hidden_size, constraint=constraint)

    def forward(self, input: Tensor) -> Tensor:
        # Index the (residual, skip) pair rather than unpack it, so torch.fx can trace it.
        split = U.residual_split(input, self.attn_tau)
        x = U.residual_add(self._dropout(self.attn(self.attn_norm(split[0]))), split[1], self.attn_tau)
        split = U.residual_split(x, self.mlp_tau)
        return U.residual_add(self._dropout(self.mlp(self.mlp_norm(split[0]))), split[1], self.mlp_tau)

    def _dropout(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.dropout_p, self.training) if self.dropout_p else input
