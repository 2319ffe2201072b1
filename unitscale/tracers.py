"""``unitscale.tracers``, kept as an import path: the tracers live in :mod:`unitscale.fx`,
:func:`~unitscale.trace_exec_order` in :mod:`unitscale.capture`."""

from unitscale.capture.tools import trace_exec_order as trace_exec_order
from unitscale.fx.tracers import *  # noqa: F403
from unitscale.fx.tracers import __all__ as _fx_all

__all__ = [*_fx_all, "trace_exec_order"]
