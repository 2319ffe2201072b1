"""``unitscale.nn``, kept as an import path: the code lives in :mod:`unitscale.scaling.nn`."""

from unitscale.scaling.nn import *  # noqa: F403
from unitscale.scaling.nn import __all__ as __all__
