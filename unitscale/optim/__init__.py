"""u-μP optimisers (import as ``unitscale.optim``): torch's, with learning rates set per parameter role.

The rules and why they are what they are: ``unitscale.scaling.optim``.

>>> import torch
>>> import unitscale.optim
>>> from unitscale.scaling import umup
>>> opt = unitscale.optim.Adam(umup.Linear(256, 8).parameters(), lr=0.5)
>>> opt.param_groups[0]["lr"]
0.03125
"""

from unitscale.scaling.optim import RULES as RULES
from unitscale.scaling.optim import SGD as SGD
from unitscale.scaling.optim import Adam as Adam
from unitscale.scaling.optim import AdamW as AdamW
from unitscale.scaling.optim import lr_scale as lr_scale
from unitscale.scaling.optim import lr_scales as lr_scales
from unitscale.scaling.optim import param_groups as param_groups

__all__ = ["SGD", "Adam", "AdamW", "lr_scale", "lr_scales", "param_groups", "RULES"]
