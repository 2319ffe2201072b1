"""One graph capture for every tool: fx, export, strict export, TorchDynamo, eager.

What tools built on it use beside it is in ``unitscale.capture.toolkit``; why the package is
shaped as it is: ``unitscale/capture/README.md``.
"""

from unitscale.capture._cache import clear_capture_cache as clear_capture_cache
from unitscale.capture._capture import ROUTES as ROUTES
from unitscale.capture._capture import Capture as Capture
from unitscale.capture._capture import capture as capture
from unitscale.capture._eager import RecordedOp as RecordedOp
from unitscale.capture._kv_cache import no_kv_cache as no_kv_cache
from unitscale.capture._routes import DeepTracing as DeepTracing
from unitscale.capture.tools import capture_exec_order as capture_exec_order
from unitscale.capture.tools import module_paths as module_paths
from unitscale.capture.tools import trace_exec_order as trace_exec_order

__all__ = [
    "ROUTES",
    "Capture",
    "RecordedOp",
    "capture",
    "clear_capture_cache",
    "DeepTracing",
    "no_kv_cache",
    "capture_exec_order",
    "module_paths",
    "trace_exec_order",
]
