"""Unit-scaled modules (``from unitscale import nn as unn``) over :mod:`unitscale.functional`.

Each layer subclasses its torch counterpart (same attributes and state-dict keys)
and calls the unit-scaled op in ``forward``. Weights are initialised ``N(0, 1)``
and ``Linear`` has no bias by default, so activations and gradients start with
unit std without any fan-in factor in the initialisation.

>>> import torch
>>> from unitscale import nn as unn
>>> _ = torch.manual_seed(0)
>>> layer = unn.TransformerLayer(64, heads=4, is_causal=True)
>>> round(layer(torch.randn(8, 32, 64)).std().item(), 1)
1.0
"""

from unitscale.nn._activations import GELU, Dropout, SiLU, Softmax
from unitscale.nn._embedding import Embedding
from unitscale.nn._linear import Conv2d, Linear
from unitscale.nn._norms import LayerNorm, RMSNorm
from unitscale.nn._transformer import MHSA, MLP, TransformerLayer

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
