"""One graph capture for every tool: fx, export, strict export, TorchDynamo, eager.

>>> import torch
>>> from unitscale.capture import capture
>>> cap = capture(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.randn(1, 2))
>>> cap.route, [n.meta["module_path"] for n in cap.nodes(compute_only=True)]
('fx', ['0'])
"""

from unitscale.capture._capture import GRAPH_ROUTE_NAMES as GRAPH_ROUTE_NAMES
from unitscale.capture._capture import ROUTES as ROUTES
from unitscale.capture._capture import Capture as Capture
from unitscale.capture._capture import capture as capture
from unitscale.capture._eager import RecordedOp as RecordedOp
from unitscale.capture.tools import capture_exec_order as capture_exec_order
from unitscale.capture.tools import module_paths as module_paths
from unitscale.capture.tools import trace_exec_order as trace_exec_order

__all__ = [
    "ROUTES",
    "GRAPH_ROUTE_NAMES",
    "Capture",
    "RecordedOp",
    "capture",
    "capture_exec_order",
    "module_paths",
    "trace_exec_order",
]
