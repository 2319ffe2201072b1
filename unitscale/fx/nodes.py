"""One home for what every graph tool agrees on about nodes: the ``node.meta`` keys and op kinds.

Meta keys, and what writes them:

==================  =====================================================  ==========================================
key                 value                                                  written by
==================  =====================================================  ==========================================
``module_path``     qualified name of the module the node came from        :class:`~unitscale.fx.ModulePathTracer`,
                    (``""`` for the root)                                  the capture layer (every route)
``module_type``     qualified class name of that module                    the capture layer (every route)
``source``          ``"file.py:123"`` of the user code that made the node  the capture layer, where the route knows it
``tag``             whatever a tag function returned                       :class:`~unitscale.fx.TaggingTracer`
``inlined_from``    qualified name of the module an inlined node came from :func:`~unitscale.fx.inline`
==================  =====================================================  ==========================================

>>> from unitscale.fx.nodes import COMPUTE_OPS, MODULE_PATH_KEY
>>> MODULE_PATH_KEY, "call_module" in COMPUTE_OPS
('module_path', True)
"""

from __future__ import annotations

__all__ = [
    "MODULE_PATH_KEY",
    "MODULE_TYPE_KEY",
    "SOURCE_KEY",
    "TAG_KEY",
    "INLINED_FROM_KEY",
    "COMPUTE_OPS",
]

MODULE_PATH_KEY = "module_path"
MODULE_TYPE_KEY = "module_type"
SOURCE_KEY = "source"
TAG_KEY = "tag"
INLINED_FROM_KEY = "inlined_from"

#: ``node.op`` values of nodes that compute something (the others move values in and out).
COMPUTE_OPS = ("call_function", "call_method", "call_module")
