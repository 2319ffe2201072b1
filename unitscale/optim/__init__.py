"""u-μP's learning-rate rules per parameter role, and torch optimisers that apply them.

u-μP (Blake et al., arXiv 2407.17465, §4) sets each parameter's learning rate from one global
``lr`` and the parameter's role (:func:`~unitscale.scaling.tag`; every :mod:`unitscale.nn`
module tags its parameters). Under Adam, ``weight`` × ``fan_in**-0.5``, ``embedding`` ×
``width**-0.5`` (its fan-out), and ``readout``, ``bias`` and ``norm`` × 1; a parameter in a
stack of ``depth`` residual blocks (:class:`unitscale.nn.DepthSequential`) a further
``depth**-0.5``. Unit-scaled gradients make SGD's rules the same, except below a readout
constrained ``to_output_scale``, whose gradients shrink like ``1 / width``: then ``weight`` and
``embedding`` × ``width**0.5``, ``bias`` and ``norm`` × ``width``, ``readout`` × 1 (the
reference library's ``lr_scale_func_sgd``). Tutorial 10 teaches the rules.

Weight decay is independent of ``lr`` by default: each group's decay is divided by its own
learning rate, so :class:`AdamW` and :class:`SGD` decay by ``weight_decay · p`` per update (a
schedule still scales it); :class:`Adam`'s is an L2 term, as in torch. Parameters without a
role raise :class:`~unitscale.errors.UntaggedParameterError`; ``allow_untagged=True`` gives
them the scale 1 with an :class:`~unitscale.errors.UntaggedParameterWarning`.

>>> import torch
>>> from unitscale import nn as unn
>>> from unitscale.optim import lr_scales
>>> model = torch.nn.Sequential(unn.Linear(256, 64), unn.LinearReadout(64, 10))
>>> lr_scales(model)
{'0.weight': 0.0625, '1.weight': 1.0}
"""

from unitscale.optim._optimizers import SGD, Adam, AdamW
from unitscale.optim._rules import RULES, lr_scale, lr_scales, param_groups

__all__ = ["SGD", "Adam", "AdamW", "lr_scale", "lr_scales", "param_groups", "RULES"]
