"""What a tool built on :func:`~unitscale.capture.capture` uses beside it: lent to other rooms.

The face holds what users call; this module what ``tracking``, ``transforms``, ``stages`` (or a
tool of your own) need to read, rewrite or re-run a capture's graph as every route writes it:
the normalised node meta (with ``write_origin`` inside, :func:`copy_origin` is the only writer
of a node's origin), TorchDynamo's graph of one call with its cache-key parts, and the one
eager op recorder, :class:`OpRecorder`, whose ``record`` a tool overrides.

>>> from unitscale.capture.toolkit import GRAPH_ROUTE_NAMES
>>> GRAPH_ROUTE_NAMES  # the routes that give a graph
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
