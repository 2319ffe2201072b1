"""Unit-scaled ops (``import unitscale.functional as U``): torch's functions, scaled so that
unit-normal inputs give outputs and gradients of std close to 1.

The code lives in ``unitscale.scaling.functional``; this is the import path users know.

>>> import torch
>>> import unitscale.functional as U
>>> _ = torch.manual_seed(0)
>>> x, w = torch.randn(256, 512), torch.randn(128, 512)
>>> round(U.linear(x, w, constraint=None).std().item(), 1)
1.0
"""

import sys as _sys

from unitscale.fx.autowrap import register_autowrap_module as _register_autowrap_module
from unitscale.scaling.functional import *  # noqa: F403
from unitscale.scaling.functional import __all__ as __all__

# ``U.linear(...)`` in a model reads this module's namespace, which fx must patch too.
_register_autowrap_module(_sys.modules[__name__])
