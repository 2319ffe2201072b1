"""One graph capture for every tool: fx, export, strict export, TorchDynamo, eager.

:func:`capture` is how every tool gets a model's graph or op record. The rest is what the
tools built on it use: the node meta every route is normalised to (:func:`normalise_graph`,
:func:`normalise_path`, :func:`stack_entries`), TorchDynamo's graph of one call for the
graph transforms (:func:`dynamo_graph`), and the eager op recorder (:class:`OpRecorder`).
Why the package is shaped as it is: ``unitscale/capture/README.md``.

>>> import torch
>>> from unitscale.capture import capture
>>> cap = capture(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.randn(1, 2))
>>> cap.route, [n.meta["module_path"] for n in cap.nodes(compute_only=True)]
('fx', ['0'])
"""

from unitscale.capture._cache import call_state as call_state
from unitscale.capture._cache import clear_capture_cache as clear_capture_cache
from unitscale.capture._cache import hook_key as hook_key
from unitscale.capture._capture import GRAPH_ROUTE_NAMES as GRAPH_ROUTE_NAMES
from unitscale.capture._capture import ROUTES as ROUTES
from unitscale.capture._capture import Capture as Capture
from unitscale.capture._capture import capture as capture
from unitscale.capture._dynamo import DynamoGraph as DynamoGraph
from unitscale.capture._dynamo import dynamo_graph as dynamo_graph
from unitscale.capture._dynamo import no_torch_function_modes as no_torch_function_modes
from unitscale.capture._eager import OpRecorder as OpRecorder
from unitscale.capture._eager import RecordedOp as RecordedOp
from unitscale.capture._kv_cache import no_kv_cache as no_kv_cache
from unitscale.capture._meta import normalise_graph as normalise_graph
from unitscale.capture._meta import normalise_path as normalise_path
from unitscale.capture._meta import stack_entries as stack_entries
from unitscale.capture._routes import DeepTracing as DeepTracing
from unitscale.capture._verify import flat_graph_inputs as flat_graph_inputs
from unitscale.capture.tools import capture_exec_order as capture_exec_order
from unitscale.capture.tools import module_paths as module_paths
from unitscale.capture.tools import trace_exec_order as trace_exec_order

__all__ = [
    "ROUTES",
    "GRAPH_ROUTE_NAMES",
    "Capture",
    "RecordedOp",
    "capture",
    "clear_capture_cache",
    "call_state",
    "hook_key",
    "DeepTracing",
    "OpRecorder",
    "capture_exec_order",
    "module_paths",
    "trace_exec_order",
    "normalise_graph",
    "normalise_path",
    "stack_entries",
    "DynamoGraph",
    "dynamo_graph",
    "no_torch_function_modes",
    "flat_graph_inputs",
    "no_kv_cache",
]
