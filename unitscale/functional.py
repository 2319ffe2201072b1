"""``unitscale.functional``, kept as an import path: the code lives in :mod:`unitscale.scaling.functional`."""

import sys as _sys

from unitscale.fx.autowrap import register_autowrap_module as _register_autowrap_module
from unitscale.scaling.functional import *  # noqa: F403
from unitscale.scaling.functional import __all__ as __all__

# ``U.linear(...)`` in a model reads this module's namespace, which fx must patch too.
_register_autowrap_module(_sys.modules[__name__])
