"""``unitscale.analysis``, kept as an import path: the code lives in :mod:`unitscale.tracking.analysis`."""

from unitscale.tracking.analysis import *  # noqa: F403
from unitscale.tracking.analysis import __all__ as __all__
