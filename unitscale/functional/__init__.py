"""Unit-scaled ops (``import unitscale.functional as U``): unit-normal inputs give outputs and gradients of std 1.

Each op is its torch twin (same signature, so a graph transform swaps them by :data:`torch_map`)
with fixed scales, after Blake et al., "Unit Scaling" (arXiv 2303.11257), that bring its output
and each input gradient to unit std for unit-normal inputs: a matmul's output × ``fan_in**-0.5``,
an input gradient × ``count**-0.5``, ``count`` being the terms summed into one of its elements.
Ops whose two scales differ take ``constraint=``, which makes them one number so that input
gradients are the true gradients of the scaled function (``None``: each direction on its own,
true only on a cut edge; see :mod:`unitscale.scaling`). The gradients of weights, biases, gains
and tables are scaled on their own by the terms each sums (the batch): a parameter read by one op
is a cut edge. One read by ops of different sizes (an embedding tied to the readout) sums
differently scaled gradients, which is not a true gradient: untie it, or scale its uses alike.

>>> import torch
>>> import unitscale.functional as U
>>> _ = torch.manual_seed(0)
>>> x, w = torch.randn(256, 512), torch.randn(128, 512)
>>> round(U.linear(x, w, constraint=None).std().item(), 1)
1.0
"""

# Only the ops are public names: tracers autowrap every public callable here (see below).
import sys as _sys

from unitscale.functional._activations import gelu, hardtanh, relu, relu6, silu, silu_glu, softmax
from unitscale.functional._attention import multi_head_attention_forward, scaled_dot_product_attention
from unitscale.functional._batchnorm import batch_norm
from unitscale.functional._dropout import dropout
from unitscale.functional._embedding import embedding
from unitscale.functional._gates import hardsigmoid, hardswish, layer_scale, mul, sigmoid
from unitscale.functional._linear import (
    addmm,
    conv1d,
    conv2d,
    conv_transpose2d,
    linear,
    linear_readout,
    matmul,
)
from unitscale.functional._losses import cross_entropy, mse_loss
from unitscale.functional._norms import layer_norm, rms_norm
from unitscale.functional._pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d, mean
from unitscale.functional._recurrent import gru, lstm, rnn_relu, rnn_tanh
from unitscale.functional._resample import interpolate
from unitscale.functional._residual import add, residual_add, residual_apply, residual_split
from unitscale.functional._scale import frozen_grad_scale, scale
from unitscale.functional._torch_map import torch_map
from unitscale.fx.autowrap import register_autowrap_module as _register_autowrap_module

__all__ = [
    "scale",
    "linear",
    "matmul",
    "gelu",
    "softmax",
    "add",
    "residual_split",
    "residual_add",
    "residual_apply",
    "layer_norm",
    "embedding",
    "dropout",
    "cross_entropy",
    "mse_loss",
    "scaled_dot_product_attention",
    "addmm",
    "conv1d",
    "conv2d",
    "silu",
    "silu_glu",
    "linear_readout",
    "relu",
    "hardtanh",
    "relu6",
    "rms_norm",
    "batch_norm",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "sigmoid",
    "hardsigmoid",
    "hardswish",
    "mul",
    "mean",
    "conv_transpose2d",
    "interpolate",
    "layer_scale",
    "multi_head_attention_forward",
    "lstm",
    "gru",
    "rnn_tanh",
    "rnn_relu",
    "frozen_grad_scale",
    "torch_map",
]

# Graphs, generated code and pickles name a function by its ``__module__``: the ops are
# named by this, their one import path (``unitscale_functional_linear``).
for _name in __all__:
    _fn = globals()[_name]
    if callable(_fn):
        _fn.__module__ = __name__

# Tracers keep these ops as single nodes by default; fx learns of them here, not by
# importing this layer. ``U.linear(...)`` in a model reads this namespace, which fx patches.
_register_autowrap_module(_sys.modules[__name__])
