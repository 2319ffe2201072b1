"""Unit-scaled modules over :mod:`unitscale.scaling.functional` (import as ``from unitscale.scaling import nn as unn``).

Each layer subclasses its torch counterpart (same attributes and state-dict keys)
and calls the unit-scaled op in ``forward``. Weights are initialised ``N(0, 1)``
and ``Linear`` has no bias by default, so activations and gradients start with
unit std without any fan-in factor in the initialisation.

>>> import torch
>>> from unitscale.scaling import nn as unn
>>> _ = torch.manual_seed(0)
>>> layer = unn.TransformerLayer(64, heads=4, is_causal=True)
>>> round(layer(torch.randn(8, 32, 64)).std().item(), 1)
1.0
"""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.scaling.functional as U
from unitscale.errors import InputError
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint
from unitscale.scaling.functional import _check_p, _check_tau

__all__ = [
    "Linear",
    "GELU",
    "Softmax",
    "LayerNorm",
    "Embedding",
    "Dropout",
    "SiLU",
    "RMSNorm",
    "Conv2d",
    "MLP",
    "MHSA",
    "TransformerLayer",
]


def _check_sizes(owner: str, **sizes: object) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{owner}: {name}={value!r:.60} must be an int >= 0")


class Linear(nn.Linear):
    """Unit-scaled :class:`torch.nn.Linear`: weight ``N(0, 1)``, no bias by default.

    Args:
        in_features: size of each input row.
        out_features: size of each output row.
        bias: add a learnable bias (initialised to zero).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Linear
    >>> _ = torch.manual_seed(0)
    >>> round(Linear(256, 256)(torch.randn(64, 256)).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        resolve_constraint(constraint)
        _check_sizes("Linear", in_features=in_features, out_features=out_features)
        super().__init__(in_features, out_features, bias=bias)
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.linear(input, self.weight, self.bias, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class GELU(nn.GELU):
    """Unit-scaled :class:`torch.nn.GELU`.

    Args:
        approximate: ``"none"`` or ``"tanh"``, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import GELU
    >>> _ = torch.manual_seed(0)
    >>> round(GELU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, approximate: str = "none", constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        U._check_approximate("GELU", approximate)
        super().__init__(approximate=approximate)
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.gelu(input, approximate=self.approximate, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class Softmax(nn.Softmax):
    """Unit-scaled :class:`torch.nn.Softmax`.

    Args:
        dim: the dimension to normalise over.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Softmax
    >>> _ = torch.manual_seed(0)
    >>> round(Softmax(dim=-1, constraint=None)(torch.randn(1000, 64)).std().item(), 1)
    1.0
    """

    dim: int

    def __init__(self, dim: int, constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InputError(f"Softmax: dim={dim!r:.60} is a {type(dim).__name__}; pass an int, e.g. dim=-1")
        super().__init__(dim=dim)
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.softmax(input, self.dim, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class LayerNorm(nn.LayerNorm):
    """Unit-scaled :class:`torch.nn.LayerNorm`: gain 1, bias 0, affine gradients scaled to unit std.

    Args:
        normalized_shape: the trailing shape to normalise over.
        eps: added to the variance.
        elementwise_affine: learn a gain (and bias).
        bias: learn a bias (with ``elementwise_affine``).

    >>> import torch
    >>> from unitscale.nn import LayerNorm
    >>> y = LayerNorm(8)(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3)
    1.0
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(nn.Embedding):
    """Unit-scaled :class:`torch.nn.Embedding`: table ``N(0, 1)``, gradient scaled to unit std.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: size of each row.
        padding_idx: as in torch (that row starts at zero and gets no gradient).

    >>> import torch
    >>> from unitscale.nn import Embedding
    >>> Embedding(10, 4)(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 4])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> None:
        _check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight, self.padding_idx)


class Dropout(nn.Dropout):
    """Unit-scaled :class:`torch.nn.Dropout`: kept values times ``(1 - p)**-0.5``, not ``(1 - p)**-1``.

    Args:
        p: probability of zeroing an element, in ``[0, 1]``.
        inplace: as in torch.

    Raises:
        InputError: ``p`` is not in ``[0, 1]``.

    >>> import torch
    >>> from unitscale.nn import Dropout
    >>> _ = torch.manual_seed(0)
    >>> round(Dropout(0.5)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__(_check_p("Dropout", p), inplace)

    def forward(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.p, self.training, self.inplace)


class SiLU(nn.SiLU):
    """Unit-scaled :class:`torch.nn.SiLU` (Llama's gate activation).

    Args:
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import SiLU
    >>> _ = torch.manual_seed(0)
    >>> round(SiLU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        super().__init__()
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.silu(input, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"constraint={self.constraint!r}"


class RMSNorm(nn.RMSNorm):
    """Unit-scaled :class:`torch.nn.RMSNorm`: gain 1, its gradient scaled to unit std.

    Args:
        normalized_shape: the trailing shape to normalise over.
        eps: added to the mean square (``None``: the dtype's machine epsilon).
        elementwise_affine: learn a gain.

    >>> import torch
    >>> from unitscale.nn import RMSNorm
    >>> y = RMSNorm(8)(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3)
    1.0
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class Conv2d(nn.Conv2d):
    """Unit-scaled :class:`torch.nn.Conv2d`: weight ``N(0, 1)``, no bias by default, zero padding only.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: as in torch.
        stride: as in torch.
        padding: as in torch (``"same"`` and ``"valid"`` included).
        dilation: as in torch.
        groups: as in torch.
        bias: add a learnable bias (initialised to zero).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Conv2d
    >>> _ = torch.manual_seed(0)
    >>> conv = Conv2d(32, 32, 3, padding=1, constraint=None)
    >>> round(conv(torch.randn(8, 32, 16, 16)).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        resolve_constraint(constraint)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv2d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.constraint,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


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
        if _check_p("MHSA", dropout_p, "dropout_p") == 1:
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
        self.attn_tau = _check_tau("TransformerLayer", attn_tau, "attn_tau")
        self.mlp_tau = _check_tau("TransformerLayer", mlp_tau, "mlp_tau")
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
