"""u-μP's learning-rate rules per parameter role, and torch optimisers that apply them.

u-μP (Blake et al., arXiv 2407.17465, §4) sets each parameter's learning rate from one
global ``lr`` and the parameter's role (:func:`~unitscale.scaling.tag`; every module of
:mod:`unitscale.nn` tags its parameters). With Adam, whose update has a size set by
``lr`` whatever the gradient's scale:

==============  ===============================  ==============================================
role            Adam ``lr`` ×                    why, and where in the paper
==============  ===============================  ==============================================
``weight``      ``fan_in**-0.5``                 μP: a unit-init hidden weight whose multiplier
                                                 is ``fan_in**-0.5`` must move by ``O(1/fan_in)``
                                                 (§4, the parametrization table, hidden weights)
``embedding``   ``width**-0.5`` (its fan-out)    u-μP's own rule, where μP keeps it constant
                                                 (§4, "A new embedding LR rule")
``readout``     1                                its ``1/fan_in`` multiplier already shrinks it
                                                 (§4, the parametrization table, output weights)
``bias``        1                                a vector: nothing sums over the width (idem)
``norm``        1                                idem
==============  ===============================  ==============================================

and a parameter in a residual branch of a stack of ``depth`` blocks a further
``depth**-0.5`` (depth-μP for Adam, which u-μP adopts alongside its residual rule:
§4 and Appendix G; :class:`unitscale.nn.DepthSequential` records the depth).

**Why SGD's rules are the same here, and when they are not.** SGD's update is ``lr``
times the gradient, so its size follows the gradient's scale. Every gradient of a
unit-scaled model is scaled to unit std, which makes SGD's updates unit-sized like
Adam's, and the Adam rules carry over (the reference library reasons the same way).
They differ only when the readout's backward scale is tied to its forward one
(``readout_constraint="to_output_scale"``): then every gradient below the readout
shrinks like ``1 / width`` and SGD has to grow its rates instead: ``weight`` and
``embedding`` × ``width**0.5``, ``bias`` and ``norm`` × ``width``, ``readout`` × 1
(the reference library's ``lr_scale_func_sgd``; the paper treats Adam only).

**Weight decay** is independent of ``lr`` by default: each group's decay is divided by
its own learning rate, so the decay step per update is ``weight_decay · p`` for
:class:`AdamW` and :class:`SGD`, whatever the learning rate (of the peak: a schedule
still scales it). With :class:`Adam` the decay is an L2 term fed through Adam's
normaliser, as in torch.

**Parameters without a role** (those of a plain ``torch.nn`` module) raise
:class:`~unitscale.errors.UntaggedParameterError` naming them and saying how to tag
them; ``allow_untagged=True`` gives them the scale 1 (the rule of a bias) and warns
with :class:`~unitscale.errors.UntaggedParameterWarning`.

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
