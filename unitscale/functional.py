"""``unitscale.functional``, kept as an import path: the code lives in :mod:`unitscale.scaling.functional`."""

from unitscale.scaling.functional import *  # noqa: F403
from unitscale.scaling.functional import __all__ as __all__
