"""Unit-scaled modules (``from unitscale import nn as unn``): one family for unit scaling and u-μP.

Each layer subclasses its torch counterpart (same attributes and state-dict keys)
and calls the unit-scaled op in ``forward``. Weights are initialised ``N(0, 1)``
and ``Linear`` has no bias by default, so activations and gradients start with
unit std without any fan-in factor in the initialisation. Layers take u-μP's
multipliers (``mult=``) where the paper has one, and every parameter carries its
u-μP role (:func:`unitscale.scaling.role_of`), so any model built from these
modules trains with :mod:`unitscale.optim`.

>>> import torch
>>> import unitscale.optim
>>> from unitscale import nn as unn
>>> _ = torch.manual_seed(0)
>>> layer = unn.TransformerLayer(64, heads=4, is_causal=True)
>>> round(layer(torch.randn(8, 32, 64)).std().item(), 1)
1.0
>>> opt = unitscale.optim.Adam(layer.parameters(), lr=0.01)
"""

from unitscale.nn._activations import GELU, Dropout, SiLU, Softmax
from unitscale.nn._depth import DepthModuleList, DepthSequential, TransformerDecoder, TransformerStack
from unitscale.nn._embedding import Embedding
from unitscale.nn._linear import Conv1d, Conv2d, Linear, LinearReadout
from unitscale.nn._losses import CrossEntropyLoss, MSELoss
from unitscale.nn._norms import LayerNorm, RMSNorm
from unitscale.nn._roles import RoleModule
from unitscale.nn._transformer import MHSA, MLP, SwiGLU, TransformerLayer

__all__ = [
    "Linear",
    "LinearReadout",
    "Conv1d",
    "Conv2d",
    "Embedding",
    "LayerNorm",
    "RMSNorm",
    "GELU",
    "SiLU",
    "Softmax",
    "Dropout",
    "CrossEntropyLoss",
    "MSELoss",
    "MLP",
    "SwiGLU",
    "MHSA",
    "TransformerLayer",
    "DepthModuleList",
    "DepthSequential",
    "TransformerStack",
    "TransformerDecoder",
    "RoleModule",
]
