"""What a tool built on :func:`~unitscale.capture.capture` uses beside it: for other rooms.

The package's face (``unitscale.capture``) holds what users call. This module holds what the
tools on top (``tracking``, ``transforms``, ``stages``, or a tool of your own) need to read,
rewrite or re-run a capture's graph the way every route writes it:

- the normalised node meta: :func:`normalise_graph` (write every node's origin onto a graph
  made outside ``capture``), :func:`normalise_path`, :func:`stack_entries` (read a route's
  module stack), :func:`copy_origin` (a node made by a rewrite takes the origin of the node
  it stands for): with ``write_origin`` inside the package, the only code that writes
  ``module_path``, ``module_type`` and ``source`` (fx's ``ModulePathTracer`` writes
  ``module_path`` on the graphs users trace with it);
- TorchDynamo's graph of one call, for the graph transforms: :func:`dynamo_graph`,
  :class:`DynamoGraph`, :func:`no_torch_function_modes`, :func:`flat_graph_inputs`, and the
  parts of a capture's cache key a tool's own cache reuses (:func:`call_state`,
  :func:`hook_key`) and the routes that give a graph (:data:`GRAPH_ROUTE_NAMES`);
- the one eager op recorder, :class:`OpRecorder`, whose ``record`` a tool overrides.

>>> from unitscale.capture.toolkit import GRAPH_ROUTE_NAMES
>>> GRAPH_ROUTE_NAMES  # the routes that give a graph; "eager" gives a record of ops
('fx', 'export', 'export-strict', 'dynamo')
"""

from unitscale.capture._cache import call_state, hook_key
from unitscale.capture._capture import GRAPH_ROUTE_NAMES
from unitscale.capture._dynamo import DynamoGraph, dynamo_graph, no_torch_function_modes
from unitscale.capture._eager import OpRecorder
from unitscale.capture._meta import copy_origin, normalise_graph, normalise_path, stack_entries
from unitscale.capture._verify import flat_graph_inputs

__all__ = [
    "normalise_graph",
    "normalise_path",
    "stack_entries",
    "copy_origin",
    "DynamoGraph",
    "dynamo_graph",
    "no_torch_function_modes",
    "flat_graph_inputs",
    "call_state",
    "hook_key",
    "GRAPH_ROUTE_NAMES",
    "OpRecorder",
]
