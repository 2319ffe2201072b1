"""Unit-scaled ops (``import unitscale.functional as U``): unit-normal inputs give outputs and gradients of std 1.

Each op is its torch twin with fixed scales applied in the forward pass (to the
output) and in the backward pass (to the input gradients), after Blake et al.,
"Unit Scaling" (arXiv 2303.11257). Signatures mirror torch's, plus a
``constraint=`` argument on ops whose forward and backward scales differ, so a
graph transform can swap a torch function for its twin by target
(:data:`torch_map`).

Unit scaling changes the scales of gradients, never their directions: with a
constraint, an op's input gradients are the true gradients of the scaled function
it computed (see :mod:`unitscale.scaling` for ``constraint=None``).
The gradients of weights, biases, norm gains and embedding tables are scaled on
their own, by the number of terms each sums over: a parameter is a *cut edge*,
whose gradient is a positive multiple of its true gradient because it is read by
one op. A parameter read by several ops of different sizes (an embedding table
tied to the readout, one layer applied to sequences of two lengths) gets the sum
of differently scaled gradients, which is not: untie it, or scale its uses alike.

>>> import torch
>>> import unitscale.functional as U
>>> _ = torch.manual_seed(0)
>>> x, w = torch.randn(256, 512), torch.randn(128, 512)
>>> round(U.linear(x, w, constraint=None).std().item(), 1)
1.0
>>> round(torch.nn.functional.linear(x, w).std().item())
23

Only the ops are public names here: tracers keep every public callable of this
module as a single graph node (it is registered with ``unitscale.fx.autowrap``
below), and would otherwise patch an imported name (``Tensor``, ``Callable``) in
the traced model's module too.
"""

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
