"""u-μP (Blake et al., arXiv 2407.17465): unit scaling plus μP, so the best learning rate transfers across width.

Three parts, one module each, gathered here:

- parameter roles (:mod:`~unitscale.scaling.parameter`): :func:`tag`, :func:`role_of`,
  :func:`set_depth`, :func:`residual_taus` (the depth rule), :func:`check_mult`;
- ops with the paper's multipliers (:mod:`~unitscale.scaling.umup_functional`):
  :func:`silu_glu`, :func:`linear_readout`, :func:`attention`, :func:`cross_entropy`;
- modules whose parameters carry their role (``unitscale.scaling.umup_nn``):
  :class:`Linear`, :class:`LinearReadout`, :class:`Embedding`, :class:`RMSNorm`,
  :class:`Conv2d`, :class:`SwiGLU`, :class:`MHSA`, :class:`TransformerLayer`.

The learning-rate rules that read the roles are in :mod:`unitscale.optim`; the checks
that the parametrisation holds (coordinate check, learning-rate sweep) in
``unitscale.scaling.transfer``.

>>> import torch
>>> from unitscale.scaling import umup
>>> model = torch.nn.Sequential(umup.Embedding(16, 32), umup.LinearReadout(32, 16))
>>> sorted({umup.role_of(p).role for p in model.parameters()})
['embedding', 'readout']
"""

from unitscale.scaling.checks import check_mult as check_mult
from unitscale.scaling.parameter import ROLES as ROLES
from unitscale.scaling.parameter import ParamRole as ParamRole
from unitscale.scaling.parameter import residual_taus as residual_taus
from unitscale.scaling.parameter import role_of as role_of
from unitscale.scaling.parameter import set_depth as set_depth
from unitscale.scaling.parameter import tag as tag
from unitscale.scaling.umup_functional import attention as attention
from unitscale.scaling.umup_functional import cross_entropy as cross_entropy
from unitscale.scaling.umup_functional import linear_readout as linear_readout
from unitscale.scaling.umup_functional import silu_glu as silu_glu
from unitscale.scaling.umup_nn import MHSA as MHSA
from unitscale.scaling.umup_nn import Conv2d as Conv2d
from unitscale.scaling.umup_nn import Embedding as Embedding
from unitscale.scaling.umup_nn import Linear as Linear
from unitscale.scaling.umup_nn import LinearReadout as LinearReadout
from unitscale.scaling.umup_nn import RMSNorm as RMSNorm
from unitscale.scaling.umup_nn import SwiGLU as SwiGLU
from unitscale.scaling.umup_nn import TransformerLayer as TransformerLayer

__all__ = [
    "ROLES",
    "ParamRole",
    "tag",
    "role_of",
    "set_depth",
    "check_mult",
    "residual_taus",
    "silu_glu",
    "linear_readout",
    "attention",
    "cross_entropy",
    "Linear",
    "LinearReadout",
    "Embedding",
    "RMSNorm",
    "Conv2d",
    "SwiGLU",
    "MHSA",
    "TransformerLayer",
]
