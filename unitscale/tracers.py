"""``unitscale.tracers``, kept as an import path: the code lives in :mod:`unitscale.fx.tracers`."""

from unitscale.fx.tracers import *  # noqa: F403
from unitscale.fx.tracers import __all__ as __all__
