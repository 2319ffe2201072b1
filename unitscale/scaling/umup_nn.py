"""u-μP modules: unit-scaled layers whose parameters carry their u-μP role.

Every weight is initialised ``N(0, 1)`` (unit scaling: no fan-in factor in the
initialisation; u-μP, Section 4, puts it in the op's multiplier instead), every bias
and norm gain as torch does (0 and 1), and every parameter is tagged (:func:`tag`)
so that :mod:`unitscale.optim` can give it the paper's learning rate.

>>> import torch
>>> from unitscale.scaling import umup
>>> _ = torch.manual_seed(0)
>>> layer = umup.TransformerLayer(64, heads=4, attn_tau=0.3, mlp_tau=0.25)
>>> round(layer(torch.randn(8, 32, 64)).std().item(), 1)
1.0
"""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.scaling import umup_functional as UF
from unitscale.scaling.checks import check_mult, check_tau
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint
from unitscale.scaling.parameter import tag

__all__ = [
    "Linear",
    "LinearReadout",
    "Embedding",
    "RMSNorm",
    "Conv2d",
    "SwiGLU",
    "MHSA",
    "TransformerLayer",
]


class Linear(nn.Linear):
    """A u-μP hidden linear layer: weight role ``"weight"`` (width = fan-in), bias role ``"bias"``.

    Forward × ``fan_in**-0.5`` (u-μP, Section 4: the hidden weight's multiplier, with unit
    initialisation), input gradient unit-scaled too, both reconciled by ``constraint``.
    The default constraint is ``"to_output_scale"``, the reference library's u-μP default
    (this library's plain :class:`unitscale.nn.Linear` uses ``"gmean"``).

    Args:
        in_features: fan-in.
        out_features: fan-out.
        bias: add a bias (zeros).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    >>> import torch
    >>> from unitscale.scaling.umup import Linear, role_of
    >>> layer = Linear(256, 64)
    >>> role_of(layer.weight)
    ParamRole(role='weight', width=256, depth=None)
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, constraint: ConstraintArg = "to_output_scale"
    ) -> None:
        resolve_constraint(constraint)
        super().__init__(in_features, out_features, bias)
        self.constraint = constraint
        tag(self.weight, "weight")
        if self.bias is not None:
            tag(self.bias, "bias")

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.linear(input, self.weight, self.bias, self.constraint)


class LinearReadout(Linear):
    """The u-μP readout (last layer): weight role ``"readout"``, forward × ``mult / fan_in``.

    See :func:`~unitscale.scaling.umup.linear_readout`. Its learning rate does not scale
    with width under Adam (u-μP, Section 4).

    Args:
        in_features: fan-in (the model width).
        out_features: the number of classes.
        bias: add a bias (zeros).
        mult: α_loss-softmax, a finite number > 0.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import LinearReadout, role_of
    >>> role_of(LinearReadout(64, 10).weight).role
    'readout'
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, mult: float = 1.0) -> None:
        self.mult = check_mult("LinearReadout", "mult", mult)
        super().__init__(in_features, out_features, bias, constraint=None)
        tag(self.weight, "readout")

    def forward(self, input: Tensor) -> Tensor:
        out = UF.linear_readout(input, self.weight, None, self.mult)
        return out if self.bias is None else out + U.scale(self.bias, 1.0, (out.numel() / out.shape[-1]) ** -0.5)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mult={self.mult}"


class Embedding(nn.Embedding):
    """A u-μP embedding: rows ``N(0, 1)``, role ``"embedding"`` (width = the embedding dimension).

    Under Adam its learning rate scales as ``dim**-0.5``: u-μP's embedding rule (Section 4),
    where μP would keep it constant. The reference library tags it ``"weight"`` and reads
    the same width from its shape; here the role says it.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: width.

    >>> import torch
    >>> from unitscale.scaling.umup import Embedding, role_of
    >>> role_of(Embedding(100, 32).weight)
    ParamRole(role='embedding', width=32, depth=None)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        tag(self.weight, "embedding")

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight)


class RMSNorm(nn.RMSNorm):
    """Unit-scaled RMS norm whose gain has role ``"norm"`` (learning rate constant in width).

    Args:
        normalized_shape: the trailing shape to normalise over.
        eps: added to the mean square (``None``: the dtype's machine epsilon).
        elementwise_affine: learn a gain.

    >>> import torch
    >>> from unitscale.scaling.umup import RMSNorm, role_of
    >>> role_of(RMSNorm(16).weight).role
    'norm'
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        if self.weight is not None:
            tag(self.weight, "norm")

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class Conv2d(nn.Conv2d):
    """A u-μP 2-D convolution: weight role ``"weight"``, width = ``in_channels / groups * kh * kw``.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: as in torch.
        stride: as in torch.
        padding: as in torch.
        groups: as in torch.
        bias: add a bias (zeros).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    >>> import torch
    >>> from unitscale.scaling.umup import Conv2d, role_of
    >>> role_of(Conv2d(8, 16, 3, padding=1).weight).width
    72
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        groups: int = 1,
        bias: bool = False,
        constraint: ConstraintArg = "to_output_scale",
    ) -> None:
        resolve_constraint(constraint)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, 1, groups, bias)
        self.constraint = constraint
        tag(self.weight, "weight")
        if self.bias is not None:
            tag(self.bias, "bias")

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv2d(
            input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, self.constraint
        )


class SwiGLU(nn.Module):
    """A u-μP SwiGLU feed-forward block: ``down(silu_glu(up(x), gate(x), mult))``.

    Args:
        width: model width.
        expansion: hidden size over width.
        mult: α_ffn-act, a finite number > 0.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import SwiGLU
    >>> _ = torch.manual_seed(0)
    >>> round(SwiGLU(64)(torch.randn(512, 64)).std().item(), 1)
    1.0
    """

    def __init__(self, width: int, expansion: int = 4, mult: float = 1.0) -> None:
        super().__init__()
        self.mult = check_mult("SwiGLU", "mult", mult)
        UF._gauss_rms("value", self.mult)
        self.up = Linear(width, expansion * width)
        self.gate = Linear(width, expansion * width)
        self.down = Linear(expansion * width, width)

    def forward(self, input: Tensor) -> Tensor:
        return self.down(UF.silu_glu(self.up(input), self.gate(input), self.mult))


class MHSA(nn.Module):
    """u-μP causal multi-head self-attention: scores × ``mult / d_head`` (see :func:`attention`).

    Args:
        width: model width.
        heads: number of heads (divides ``width``).
        mult: α_attn-softmax, a finite number > 0.
        is_causal: apply a causal mask.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import MHSA
    >>> _ = torch.manual_seed(0)
    >>> round(MHSA(64, heads=4)(torch.randn(8, 32, 64)).std().item(), 1)
    1.0
    """

    def __init__(self, width: int, heads: int, mult: float = 1.0, is_causal: bool = True) -> None:
        super().__init__()
        self.mult = check_mult("MHSA", "mult", mult)
        self.heads, self.is_causal = heads, is_causal
        self.qkv = Linear(width, 3 * width)
        self.out = Linear(width, width)

    def forward(self, input: Tensor) -> Tensor:
        batch, seq, width = input.shape
        q, k, v = self.qkv(input).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = UF.attention(q, k, v, mult=self.mult, is_causal=self.is_causal)
        return self.out(y.transpose(1, 2).reshape(batch, seq, width))


class TransformerLayer(nn.Module):
    """A pre-norm u-μP transformer block with residual weights ``attn_tau`` and ``mlp_tau``.

    Each branch is ``residual_split`` → :class:`RMSNorm` → attention or :class:`SwiGLU`
    → ``residual_add`` with its tau (take the taus from :func:`residual_taus`, which
    implements the paper's depth rule, Appendix G).

    Args:
        width: model width.
        heads: attention heads.
        attn_tau: the attention branch's share of the variance, in (0, 1).
        mlp_tau: the MLP branch's share, in (0, 1).
        attn_mult: α_attn-softmax.
        ffn_mult: α_ffn-act.

    Raises:
        InputError: a tau is not strictly between 0 and 1.
        MultiplierError: a multiplier is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import TransformerLayer
    >>> TransformerLayer(32, heads=2, attn_tau=0.5, mlp_tau=0.5)(torch.randn(2, 8, 32)).shape
    torch.Size([2, 8, 32])
    """

    def __init__(
        self,
        width: int,
        heads: int,
        attn_tau: float,
        mlp_tau: float,
        attn_mult: float = 1.0,
        ffn_mult: float = 1.0,
    ) -> None:
        super().__init__()
        self.attn_tau = check_tau("TransformerLayer", attn_tau, "attn_tau")
        self.mlp_tau = check_tau("TransformerLayer", mlp_tau, "mlp_tau")
        self.attn_norm = RMSNorm(width)
        self.attn = MHSA(width, heads, mult=attn_mult)
        self.mlp_norm = RMSNorm(width)
        self.mlp = SwiGLU(width, mult=ffn_mult)

    def forward(self, input: Tensor) -> Tensor:
        branch, skip = U.residual_split(input, self.attn_tau)
        x = U.residual_add(self.attn(self.attn_norm(branch)), skip, self.attn_tau)
        branch, skip = U.residual_split(x, self.mlp_tau)
        return U.residual_add(self.mlp(self.mlp_norm(branch)), skip, self.mlp_tau)
