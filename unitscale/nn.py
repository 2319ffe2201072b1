"""Unit-scaled modules (``from unitscale import nn as unn``) over :mod:`unitscale.functional`.

The code lives in ``unitscale.scaling.nn``; this is the import path users know.

>>> import torch
>>> from unitscale import nn as unn
>>> _ = torch.manual_seed(0)
>>> round(unn.Linear(256, 256)(torch.randn(512, 256)).std().item(), 1)
1.0
"""

from unitscale.scaling.nn import *  # noqa: F403
from unitscale.scaling.nn import __all__ as __all__
