"""Normalised node meta: one writer of the keys of :mod:`unitscale.fx.nodes`, one reader of each route's spelling.

``torch.fx`` leaves a ``module_path``; ``torch.export`` and TorchDynamo an ``nn_module_stack``
(``{key: (path, type)}``, outermost first) and a ``stack_trace``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from torch import fx, nn

from unitscale.capture._where import innermost_frame
from unitscale.fx.nodes import MODULE_PATH_KEY, MODULE_TYPE_KEY, SOURCE_KEY

__all__ = ["Origin", "normalise_path", "type_name", "node_origin", "write_origin", "copy_origin", "stack_entries"]


class Origin(NamedTuple):
    """Where a node came from, whatever the route."""

    module_path: str
    module_type: str
    source: str


# torch.export's key and path for a node it adds without a module (the sym_size_int that reads a
# dynamic batch size): torch/_export/passes/_node_metadata_hook.py, _EMPTY_NN_MODULE_STACK_KEY.
_NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"

_GETATTR = re.compile(r"getattr\(([^()]+?),\s*['\"]?([\w]+)['\"]?\)")
_ROOT = re.compile(r"^(?:L\['self'\]|L\[\"self\"\]|L__self__|self)")
_MODULES_ITEM = re.compile(r"\._modules\[['\"](\w+)['\"]\]")
_ITEM = re.compile(r"\[['\"]?(\w+)['\"]?\]")


def normalise_path(path: str) -> str:
    """A module path as a qualified name, whichever route spelt it.

    >>> from unitscale.capture.toolkit import normalise_path
    >>> normalise_path("L['self'].model.layers[0].self_attn")
    'model.layers.0.self_attn'
    >>> normalise_path("getattr(L['self'].model.layers, '1')._modules['mlp']")
    'model.layers.1.mlp'
    >>> normalise_path("L['self']")
    ''
    """
    while (new := _GETATTR.sub(r"\1.\2", path)) != path:
        path = new
    path = _ROOT.sub("", path)
    path = _MODULES_ITEM.sub(r".\1", path)
    path = _ITEM.sub(r".\1", path)
    return path.strip(".")


def type_name(kind: Any) -> str:
    """``module.QualName`` of a class (or the string a route already wrote).

    >>> type_name(nn.Linear)
    'torch.nn.modules.linear.Linear'
    """
    if isinstance(kind, type):
        return f"{kind.__module__}.{kind.__qualname__}"
    return str(kind)


def stack_entries(node: fx.Node) -> list[tuple[str, str, str]] | None:
    """``(key, path, type)`` per module but the root on the node's ``nn_module_stack``, outermost first.

    ``None`` when the node has no stack. Paths are qualified names (:func:`normalise_path`).

    >>> import torch
    >>> from unitscale.capture import capture
    >>> from unitscale.capture.toolkit import stack_entries
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> cap = capture(model, torch.randn(1, 2), route="export")
    >>> [stack_entries(n) for n in cap.nodes(compute_only=True)]
    [[('L__self__0', '0', 'torch.nn.modules.linear.Linear')]]
    """
    stack = node.meta.get("nn_module_stack")
    if stack is None:
        return None
    entries = []
    for key, (path, kind) in stack.items():
        if key == _NO_MODULE:
            continue
        path = normalise_path(str(path))
        if path:
            entries.append((str(key), path, type_name(kind)))
    return entries


def node_origin(node: fx.Node, root: nn.Module, names: dict[str, nn.Module]) -> Origin:
    """Read where ``node`` came from out of any route's meta; ``names`` is ``dict(root.named_modules())``."""
    entries = stack_entries(node)
    if MODULE_PATH_KEY in node.meta:  # fx (ModulePathTracer), or a graph normalised before
        candidates = [str(node.meta[MODULE_PATH_KEY])]
    elif entries:
        candidates = [path for _, path, _ in reversed(entries)]
    elif node.op == "get_attr":  # the module that owns the attribute
        candidates = [str(node.target).rpartition(".")[0]]
    else:
        candidates = []
    path = next((known for c in candidates if (known := _known_prefix(c, names))), "")
    return Origin(path, type_name(type(names.get(path, root))), innermost_frame(node.meta.get("stack_trace")))


def _known_prefix(path: str, names: dict[str, nn.Module]) -> str:
    """``path`` if the root has a module of that name, else its longest prefix that is one (``""``: none)."""
    while path and path not in names:
        path = path.rpartition(".")[0]
    return path


def write_origin(node: fx.Node, origin: Origin) -> None:
    """The one writer of ``module_path``, ``module_type`` and ``source``."""
    node.meta[MODULE_PATH_KEY] = origin.module_path
    node.meta[MODULE_TYPE_KEY] = origin.module_type
    node.meta[SOURCE_KEY] = origin.source


#: What says where a node came from: the normalised origin and the route's own spelling of it.
_ORIGIN_KEYS = (MODULE_PATH_KEY, MODULE_TYPE_KEY, SOURCE_KEY, "nn_module_stack", "stack_trace")


def copy_origin(node: fx.Node, like: fx.Node) -> None:
    """Give ``node``, made by a rewrite, the origin keys (the route's own too) of ``like``, the node it stands for.

    >>> import torch
    >>> from unitscale.capture import capture
    >>> from unitscale.capture.toolkit import copy_origin
    >>> cap = capture(torch.nn.Linear(2, 2), torch.randn(1, 2), flat=True)
    >>> linear = next(iter(cap.nodes(compute_only=True)))
    >>> with cap.graph_module.graph.inserting_after(linear):
    ...     scaled = cap.graph_module.graph.call_function(torch.mul, (linear, 0.5))
    >>> copy_origin(scaled, linear)
    >>> scaled.meta["module_path"], scaled.meta["module_type"]
    ('', 'torch.nn.modules.linear.Linear')
    """
    for key in _ORIGIN_KEYS:
        if key in like.meta:
            node.meta[key] = like.meta[key]


def normalise_graph(gm: fx.GraphModule, root: nn.Module) -> None:
    """Write the normalised origin onto every node of ``gm`` made outside :func:`~unitscale.capture.capture`.

    >>> import torch
    >>> from unitscale.capture.toolkit import normalise_graph
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> gm = torch.export.export(model, (torch.randn(1, 2),)).module()
    >>> normalise_graph(gm, model)
    >>> calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    >>> [(n.name, n.meta["module_path"], n.meta["module_type"]) for n in calls]
    [('linear', '0', 'torch.nn.modules.linear.Linear')]
    """
    names = dict(root.named_modules(remove_duplicate=False))
    for node in gm.graph.nodes:
        write_origin(node, node_origin(node, root, names))
