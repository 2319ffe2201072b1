"""Containers that record their depth on their parameters' u-μP roles, and the transformer stacks built on them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import UntaggedParameterError
from unitscale.nn._embedding import Embedding
from unitscale.nn._linear import LinearReadout, _check_sizes
from unitscale.nn._norms import RMSNorm
from unitscale.nn._transformer import TransformerLayer
from unitscale.scaling.parameter import residual_taus, role_of, set_depth


def _set_depth(owner: str, container: nn.Module, depth: int) -> None:
    untagged = [name for name, param in container.named_parameters() if role_of(param) is None]
    if untagged:
        raise UntaggedParameterError(
            f"{owner}: {len(untagged)} parameter(s) have no u-μP role, so their depth cannot be recorded: "
            f"{', '.join(untagged[:5])}. Build the blocks from unitscale.nn modules, or tag each parameter "
            "with unitscale.scaling.tag(param, role) first"
        )
    if depth:
        set_depth(container, depth)


class DepthModuleList(nn.ModuleList):
    """A :class:`torch.nn.ModuleList` of residual blocks that records its length as their parameters' depth.

    :mod:`unitscale.optim` then scales their learning rates by ``depth**-0.5``. Blocks added
    after construction are not counted.

    Args:
        modules: the blocks, built from :mod:`unitscale.nn` modules (tagged parameters).

    Raises:
        UntaggedParameterError: a parameter has no u-μP role.

    >>> from unitscale.nn import DepthModuleList, Linear
    >>> from unitscale.scaling import role_of
    >>> blocks = DepthModuleList(Linear(8, 8) for _ in range(3))
    >>> role_of(blocks[0].weight).depth
    3
    """

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        super().__init__(modules)
        _set_depth("DepthModuleList", self, len(self))


class DepthSequential(nn.Sequential):
    """A :class:`torch.nn.Sequential` of residual blocks that records its length as their parameters' depth.

    As :class:`DepthModuleList`, for blocks applied one after the other.

    Args:
        *args: the blocks, built from :mod:`unitscale.nn` modules.

    Raises:
        UntaggedParameterError: a parameter has no u-μP role.

    >>> from unitscale.nn import DepthSequential, Linear
    >>> from unitscale.scaling import role_of
    >>> role_of(DepthSequential(Linear(8, 8), Linear(8, 8))[1].weight).depth
    2
    """

    def __init__(self, *args: nn.Module) -> None:
        super().__init__(*args)
        _set_depth("DepthSequential", self, len(self))


class TransformerStack(DepthSequential):
    """``layers`` :class:`TransformerLayer` blocks whose residual weights follow u-μP's depth rule.

    The taus come from :func:`~unitscale.scaling.residual_taus`; every parameter's depth is ``layers``.

    Args:
        residual_mult: α_res.
        attn_ratio: α_res-attn-ratio.
        **kwargs: passed to each :class:`TransformerLayer` (``is_causal``, ``constraint``,
            ``attn_mult``, ``mlp_mult``, ``norm``, ``mlp``, ``dropout_p``).

    Raises:
        InputError: a bad size or argument of the layers.
        MultiplierError: ``layers`` is not an int >= 1, or a multiplier is not a finite number > 0.

    >>> from unitscale.nn import TransformerStack
    >>> stack = TransformerStack(2, 32, heads=2, is_causal=True)
    >>> [round(layer.attn_tau, 3) for layer in stack]
    [0.333, 0.2]
    """

    def __init__(
        self,
        layers: int,
        hidden_size: int,
        heads: int,
        residual_mult: float = 1.0,
        attn_ratio: float = 1.0,
        **kwargs: Any,
    ) -> None:
        taus = residual_taus(layers, residual_mult, attn_ratio)
        super().__init__(
            *(
                TransformerLayer(hidden_size, heads, attn_tau=taus[2 * i], mlp_tau=taus[2 * i + 1], **kwargs)
                for i in range(layers)
            )
        )


class TransformerDecoder(nn.Module):
    """A unit-scaled u-μP decoder-only transformer: embedding, :class:`TransformerStack`, RMS norm, readout.

    A demonstration of the parts in the u-μP configuration (RMS norms, SwiGLU MLPs,
    ``to_output_scale`` constraints), with no position embedding.

    Args:
        dropout_p: dropout on attention weights and branch outputs (while training).
        residual_mult: α_res.
        attn_ratio: α_res-attn-ratio.
        loss_mult: α_loss-softmax (on the readout).

    Raises:
        InputError: a size is not a positive int, or ``hidden_size`` not divisible by ``heads``.
        MultiplierError: a multiplier is not a finite number > 0.

    >>> import torch
    >>> from unitscale.nn import TransformerDecoder
    >>> _ = torch.manual_seed(0)
    >>> model = TransformerDecoder(16, 32, layers=2, heads=2)
    >>> ids = torch.randint(0, 16, (4, 12))
    >>> model(ids).shape, round(model.loss(ids).item(), 1)
    (torch.Size([4, 12, 16]), 2.8)
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        layers: int,
        heads: int,
        dropout_p: float = 0.0,
        residual_mult: float = 1.0,
        attn_ratio: float = 1.0,
        loss_mult: float = 1.0,
    ) -> None:
        super().__init__()
        _check_sizes("TransformerDecoder", vocab_size=vocab_size, hidden_size=hidden_size)
        self.embedding = Embedding(vocab_size, hidden_size)
        self.layers = TransformerStack(
            layers,
            hidden_size,
            heads,
            residual_mult,
            attn_ratio,
            is_causal=True,
            dropout_p=dropout_p,
            constraint="to_output_scale",
            norm="rms_norm",
            mlp="swiglu",
        )
        self.final_norm = RMSNorm(hidden_size)
        self.projection = LinearReadout(hidden_size, vocab_size, mult=loss_mult)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.projection(self.final_norm(self.layers(self.embedding(input_ids))))

    def loss(self, input_ids: Tensor) -> Tensor:
        """Unit-scaled cross-entropy of each token's prediction of the next (its value is torch's)."""
        logits = self(input_ids)[..., :-1, :]
        return U.cross_entropy(logits.flatten(0, -2), input_ids[..., 1:].flatten())
