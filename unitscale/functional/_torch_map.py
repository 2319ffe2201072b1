"""Each torch function, as a graph names it, mapped to its unit-scaled twin."""

from __future__ import annotations

import operator as _operator
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._activations import gelu, hardtanh, relu, relu6, silu, softmax
from unitscale.functional._attention import multi_head_attention_forward, scaled_dot_product_attention
from unitscale.functional._batchnorm import batch_norm
from unitscale.functional._dropout import dropout
from unitscale.functional._embedding import embedding
from unitscale.functional._gates import hardsigmoid, hardswish, sigmoid
from unitscale.functional._linear import addmm, conv1d, conv2d, conv_transpose2d, linear, matmul
from unitscale.functional._losses import cross_entropy, mse_loss
from unitscale.functional._norms import layer_norm, rms_norm
from unitscale.functional._pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from unitscale.functional._recurrent import gru, lstm, rnn_relu, rnn_tanh
from unitscale.functional._resample import interpolate
from unitscale.functional._residual import add

if TYPE_CHECKING:
    from collections.abc import Callable


# Each twin with the torch functions it stands for, as TorchDynamo and ``torch.fx`` graphs name them.
_TWINS: dict[Callable[..., object], tuple[Callable[..., object], ...]] = {
    linear: (_F.linear,),
    matmul: (_torch.matmul, _torch.Tensor.matmul, _operator.matmul, _torch.mm, _torch.bmm),
    gelu: (_F.gelu,),
    softmax: (_F.softmax, _torch.softmax, _torch.Tensor.softmax),
    add: (_torch.add, _torch.Tensor.add, _operator.add),
    layer_norm: (_F.layer_norm,),
    embedding: (_F.embedding,),
    dropout: (_F.dropout,),
    cross_entropy: (_F.cross_entropy,),
    mse_loss: (_F.mse_loss,),
    scaled_dot_product_attention: (_F.scaled_dot_product_attention,),
    addmm: (_torch.addmm, _torch.Tensor.addmm),
    conv1d: (_F.conv1d,),
    conv2d: (_F.conv2d,),
    silu: (_F.silu,),
    relu: (_F.relu, _torch.relu, _torch.Tensor.relu),
    hardtanh: (_F.hardtanh, _torch._C._nn.hardtanh),
    relu6: (_F.relu6, _torch._C._nn.relu6),
    rms_norm: (_F.rms_norm, _torch.rms_norm),
    batch_norm: (_F.batch_norm,),
    max_pool2d: (_F.max_pool2d, _torch.max_pool2d),
    avg_pool2d: (_F.avg_pool2d,),
    adaptive_avg_pool2d: (_F.adaptive_avg_pool2d,),
    sigmoid: (_torch.sigmoid, _torch.Tensor.sigmoid, _F.sigmoid),
    hardsigmoid: (_F.hardsigmoid, _torch._C._nn.hardsigmoid),
    hardswish: (_F.hardswish, _torch._C._nn.hardswish),
    conv_transpose2d: (_F.conv_transpose2d, _torch.conv_transpose2d),
    interpolate: (_F.interpolate,),
    multi_head_attention_forward: (_F.multi_head_attention_forward,),
    lstm: (_torch.lstm,),
    gru: (_torch.gru,),
    rnn_tanh: (_torch.rnn_tanh,),
    rnn_relu: (_torch.rnn_relu,),
}

torch_map: dict[Callable[..., object], Callable[..., object]] = {fn: twin for twin, fns in _TWINS.items() for fn in fns}
"""Each torch function (as a TorchDynamo or ``torch.fx`` graph names it) -> its unit-scaled twin."""
