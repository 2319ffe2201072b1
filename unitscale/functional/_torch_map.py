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
from unitscale.functional._recurrent import lstm
from unitscale.functional._resample import interpolate
from unitscale.functional._residual import add

if TYPE_CHECKING:
    from collections.abc import Callable


torch_map: dict[Callable[..., object], Callable[..., object]] = {
    _F.linear: linear,
    _torch.matmul: matmul,
    _torch.Tensor.matmul: matmul,
    _operator.matmul: matmul,
    _torch.mm: matmul,
    _torch.bmm: matmul,
    _F.gelu: gelu,
    _F.softmax: softmax,
    _torch.softmax: softmax,
    _torch.Tensor.softmax: softmax,
    _torch.add: add,
    _torch.Tensor.add: add,
    _operator.add: add,
    _F.layer_norm: layer_norm,
    _F.embedding: embedding,
    _F.dropout: dropout,
    _F.cross_entropy: cross_entropy,
    _F.mse_loss: mse_loss,
    _F.scaled_dot_product_attention: scaled_dot_product_attention,
    _torch.addmm: addmm,
    _torch.Tensor.addmm: addmm,
    _F.conv1d: conv1d,
    _F.conv2d: conv2d,
    _F.silu: silu,
    _F.relu: relu,
    _torch.relu: relu,
    _torch.Tensor.relu: relu,
    _F.hardtanh: hardtanh,
    _F.relu6: relu6,
    _torch._C._nn.hardtanh: hardtanh,
    _torch._C._nn.relu6: relu6,
    _F.rms_norm: rms_norm,
    _torch.rms_norm: rms_norm,
    _F.batch_norm: batch_norm,
    _F.max_pool2d: max_pool2d,
    _torch.max_pool2d: max_pool2d,
    _F.avg_pool2d: avg_pool2d,
    _F.adaptive_avg_pool2d: adaptive_avg_pool2d,
    _torch.sigmoid: sigmoid,
    _torch.Tensor.sigmoid: sigmoid,
    _F.sigmoid: sigmoid,
    _F.hardsigmoid: hardsigmoid,
    _torch._C._nn.hardsigmoid: hardsigmoid,
    _F.hardswish: hardswish,
    _torch._C._nn.hardswish: hardswish,
    _F.conv_transpose2d: conv_transpose2d,
    _torch.conv_transpose2d: conv_transpose2d,
    _F.interpolate: interpolate,
    _F.multi_head_attention_forward: multi_head_attention_forward,
    _torch.lstm: lstm,
}
"""Each torch function (as a TorchDynamo or ``torch.fx`` graph names it) -> its unit-scaled twin."""
