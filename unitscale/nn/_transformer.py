"""Unit-scaled transformer blocks: feed-forward (GELU or SwiGLU), multi-head self-attention, a pre-norm layer."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.nn._activations import GELU, _Multiplied
from unitscale.nn._linear import Linear, _check_sizes
from unitscale.nn._norms import LayerNorm, RMSNorm
from unitscale.scaling.checks import check_mult, check_p, check_tau
from unitscale.scaling.constraints import ConstraintArg
from unitscale.scaling.docs import fill_docstring


@fill_docstring
class MLP(nn.Module):
    """Unit-scaled feed-forward block: ``Linear(d, e*d) -> GELU(mult) -> Linear(e*d, d)``.

    Args:
        expansion_factor: the inner width is ``expansion_factor * d``.
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import MLP
    >>> _ = torch.manual_seed(0)
    >>> round(MLP(64)(torch.randn(512, 64)).std().item(), 1)
    1.0
    """

    def __init__(
        self, hidden_size: int, expansion_factor: int = 4, constraint: ConstraintArg = "gmean", mult: float = 1.0
    ) -> None:
        super().__init__()
        inner = expansion_factor * hidden_size
        self.linear_1 = Linear(hidden_size, inner, constraint=constraint)
        self.act = GELU(constraint=constraint, mult=mult)
        self.linear_2 = Linear(inner, hidden_size, constraint=constraint)

    def forward(self, input: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(input)))


@fill_docstring
class SwiGLU(nn.Module):
    """Unit-scaled SwiGLU feed-forward block: ``down(silu_glu(up(x), gate(x), mult))`` (Llama's MLP).

    ``mult`` is u-μP's α_ffn-act. The default ``constraint=None`` keeps the block's input
    gradient true: ``up`` and ``gate`` scale by ``d**-0.5`` forward and ``(e d)**-0.5`` backward,
    ``down`` the other way round, so every path multiplies to one number. A constraint gives
    each projection one scale both ways instead (``gmean``: output std ``(1 / e)**0.25``).

    Args:
        expansion_factor: the inner width is ``expansion_factor * d`` (``e d``).
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import SwiGLU
    >>> _ = torch.manual_seed(0)
    >>> mlp = SwiGLU(64)
    >>> round(mlp(torch.randn(512, 64)).std().item(), 1)
    1.0
    """

    def __init__(
        self, hidden_size: int, expansion_factor: int = 4, constraint: ConstraintArg = None, mult: float = 1.0
    ) -> None:
        super().__init__()
        self.mult = check_mult("SwiGLU", "mult", mult)
        inner = expansion_factor * hidden_size
        self.up = Linear(hidden_size, inner, constraint=constraint)
        self.gate = Linear(hidden_size, inner, constraint=constraint)
        self.down = Linear(inner, hidden_size, constraint=constraint)

    def forward(self, input: Tensor) -> Tensor:
        return self.down(U.silu_glu(self.up(input), self.gate(input), self.mult))


@fill_docstring
class MHSA(_Multiplied):
    """Unit-scaled multi-head self-attention with u-μP's attention multiplier: fused QKV, attention, output.

    The scores are ``mult * q·k / d_head`` (μP's ``1 / d_head``; ``mult`` is u-μP's
    α_attn-softmax). The attention scales assume keys and values independent; here both are
    projections of the same tokens, so without causal masking the scaling amplifies some signal.

    Args:
        dropout_p: attention dropout probability (while training).
        {constraint}
        {mult}

    Raises:
        InputError: ``hidden_size`` is not divisible by ``heads``, or ``dropout_p`` not in ``[0, 1)``.
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import MHSA
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 32, 64)
    >>> round(MHSA(64, heads=4, is_causal=True, constraint=None)(x).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        constraint: ConstraintArg = "gmean",
        mult: float = 1.0,
    ) -> None:
        super().__init__()
        _check_sizes("MHSA", hidden_size=hidden_size, heads=heads)
        if heads < 1 or hidden_size % heads:
            raise InputError(
                f"MHSA: hidden_size={hidden_size} is not divisible by heads={heads}; pick heads dividing hidden_size"
            )
        if check_p("MHSA", dropout_p, "dropout_p") == 1:
            raise InputError("MHSA: dropout_p=1 drops every attention weight; pass a value below 1")
        self._keep(constraint, mult)
        self.heads = heads
        self.is_causal = is_causal
        self.dropout_p = dropout_p
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
            scale=self.mult / qkv.shape[-1],
            constraint=self.constraint,
        )
        return self.linear_o(out.transpose(-3, -2).flatten(-2))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, is_causal={self.is_causal}, {super().extra_repr()}"


@fill_docstring
class TransformerLayer(nn.Module):
    """A unit-scaled pre-norm transformer layer with ``residual_split`` / ``residual_add`` residuals.

    The defaults are a unit-scaled GPT-2 layer; ``norm="rms_norm"``, ``mlp="swiglu"`` and taus
    from :func:`~unitscale.scaling.residual_taus` give the u-μP Llama-style layer. With
    ``constraint=None`` a branch's gradient reaches the residual stream scaled by another
    factor than the skip's, so their sum is not a true gradient: use a constraint here.

    Args:
        dropout_p: dropout on attention weights and on each branch's output (while training).
        attn_tau: share of the variance the attention branch adds (0.01 after Blake et al.).
        mlp_tau: share of the variance the MLP branch adds.
        {constraint}
        attn_mult: α_attn-softmax of u-μP (see :class:`MHSA`).
        mlp_mult: α_ffn-act of u-μP, the multiplier of the MLP's nonlinearity.
        mlp: ``"gelu"`` (:class:`MLP`) or ``"swiglu"`` (:class:`SwiGLU`).

    Raises:
        InputError: bad ``hidden_size``/``heads``, ``dropout_p``, tau, ``norm`` or ``mlp``.
        {constraint_errors}
        MultiplierError: a multiplier is not a finite number > 0.

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
        attn_mult: float = 1.0,
        mlp_mult: float = 1.0,
        norm: Literal["layer_norm", "rms_norm"] = "layer_norm",
        mlp: Literal["gelu", "swiglu"] = "gelu",
    ) -> None:
        super().__init__()
        self.attn_tau = check_tau("TransformerLayer", attn_tau, "attn_tau")
        self.mlp_tau = check_tau("TransformerLayer", mlp_tau, "mlp_tau")
        norms = {"layer_norm": LayerNorm, "rms_norm": RMSNorm}
        mlps = {"gelu": MLP, "swiglu": SwiGLU}
        if norm not in norms or mlp not in mlps:
            raise InputError(
                f"TransformerLayer: norm={norm!r:.60}, mlp={mlp!r:.60}; pass norm 'layer_norm' or 'rms_norm' "
                "and mlp 'gelu' or 'swiglu'"
            )
        self.dropout_p = dropout_p
        self.attn_norm = norms[norm](hidden_size)
        self.attn = MHSA(hidden_size, heads, is_causal, dropout_p, constraint, attn_mult)
        self.mlp_norm = norms[norm](hidden_size)
        self.mlp = mlps[mlp](hidden_size, constraint=constraint, mult=mlp_mult)

    def forward(self, input: Tensor) -> Tensor:
        # Index the (residual, skip) pair rather than unpack it, so torch.fx can trace it.
        split = U.residual_split(input, self.attn_tau)
        x = U.residual_add(self._dropout(self.attn(self.attn_norm(split[0]))), split[1], self.attn_tau)
        split = U.residual_split(x, self.mlp_tau)
        return U.residual_add(self._dropout(self.mlp(self.mlp_norm(split[0]))), split[1], self.mlp_tau)

    def _dropout(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.dropout_p, self.training) if self.dropout_p else input
