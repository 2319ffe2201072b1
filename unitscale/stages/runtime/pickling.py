"""What travels to the pipeline's workers: stages, loss and inputs pickled one by one, so that what
cannot travel is named, and what names the caller's ``__main__`` is noticed (the workers then run it).

A stage travels as its graph's nodes, not as ``torch.fx``'s pickle of a ``GraphModule``: that
retraces on loading, running a higher-order op such as ``wrap_with_set_grad_enabled`` (a
``torch.no_grad()`` block) instead of recording it, so the stage computed gradients it should not.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._ops import OpOverload
from torch.fx.node import map_aggregate

from unitscale.errors import PipelineError

__all__ = ["check_importable", "main_script", "pickled"]


class _MainSpotter(pickle.Pickler):
    """A pickler that notes the names it pickles by reference to ``__main__``."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.from_main: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        owner = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        if getattr(owner, "__module__", None) == "__main__":
            self.from_main.append(getattr(owner, "__qualname__", repr(owner)))
        if isinstance(obj, fx.GraphModule):
            return _graph_module_reduction(obj)
        return NotImplemented


@dataclass(frozen=True)
class _Ref:
    """A node (``overload=None``; not a tuple, which ``map_aggregate`` would enter) or an op overload
    (``aten::tanh``, ``default``: it does not pickle) in a graph, as it travels."""

    name: str
    overload: str | None = None


def _as_ref(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return _Ref(a.name)
    return _Ref(a._schema.name, a._overloadname) if isinstance(a, OpOverload) else a


def _graph_module_reduction(gm: fx.GraphModule) -> Any:
    """``gm`` as its state and its graph's nodes, rebuilt by :func:`_graph_module_from_nodes`; ``NotImplemented``
    (torch's own pickle) where a node's target or constant cannot be pickled by itself."""
    nodes = [(n.op, n.name, _as_ref(n.target), map_aggregate((n.args, n.kwargs), _as_ref)) for n in gm.graph.nodes]
    try:
        pickle.dumps((nodes, gm.graph._codegen))
    except Exception:
        return NotImplemented
    return _graph_module_from_nodes, ({k: v for k, v in gm.__dict__.items() if k != "_graph"}, nodes, gm.graph._codegen)


def _graph_module_from_nodes(state: dict[str, Any], nodes: list[Any], codegen: Any) -> fx.GraphModule:
    """The ``GraphModule`` :func:`_graph_module_reduction` took apart: its state, then its graph, compiled."""
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}

    def back(a: Any) -> Any:
        if not isinstance(a, _Ref):
            return a
        if a.overload is None:
            return made[a.name]
        namespace, name = a.name.split("::")
        return getattr(getattr(getattr(torch.ops, namespace), name), a.overload)

    for op, name, target, (args, kwargs) in nodes:
        made[name] = graph.create_node(op, back(target), *map_aggregate((args, kwargs), back), name=name)
    graph._codegen = codegen
    gm = fx.GraphModule.__new__(fx.GraphModule)
    gm.__dict__.update(state)
    gm.graph = graph  # compiles its forward
    return gm


def pickled(what: str, value: Any, from_main: list[str]) -> bytes:
    """``value`` pickled; names it takes from ``__main__`` are appended to ``from_main``.

    >>> from unitscale.stages.runtime.pickling import pickled
    >>> names: list[str] = []
    >>> len(pickled("the inputs", (1, 2), names)) > 0, names
    (True, [])
    """
    buffer = io.BytesIO()
    pickler = _MainSpotter(buffer)
    try:
        pickler.dump(value)
    except Exception as exc:
        raise PipelineError(
            f"{what} cannot be pickled for the worker processes ({type(exc).__name__}: {exc}); "
            "use a module-level function or an nn.Module instead of a lambda or local function"
        ) from exc
    data = buffer.getvalue()
    if b"__main__" in data and not pickler.from_main:
        # e.g. a GraphModule's import block naming a function wrapped in the script
        pickler.from_main.append(f"something {what} imports from __main__")
    from_main.extend(name for name in pickler.from_main if name not in from_main)
    return data


def check_importable(what: str, value: Any) -> None:
    """Workers import ``__main__`` only when it is a file; a notebook's or ``-c``'s objects cannot travel."""
    owner = value if callable(value) and not isinstance(value, torch.nn.Module) else type(value)
    main = sys.modules.get("__main__")
    if getattr(owner, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise PipelineError(
            f"{what} {getattr(owner, '__qualname__', owner)!r} is defined in __main__ (a notebook or python -c), "
            "which the worker processes cannot import; define it in a module, or use a torch loss such as "
            "nn.CrossEntropyLoss()"
        )


def main_script(from_main: list[str]) -> tuple[str | None, str]:
    """The caller's script the workers must run first (``None``: none), and the advice to add when one fails."""
    if not from_main:
        return None, ""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file:
        raise PipelineError(
            f"{', '.join(from_main[:3])} is defined in __main__ (a notebook, stdin or python -c), which the "
            "worker processes cannot import; define it in a module of its own"
        )
    hint = (
        f"; the workers re-import your script for {', '.join(from_main[:3])} (defined in __main__): "
        'guard its top level with `if __name__ == "__main__":` or move them into a module'
    )
    return os.path.abspath(main_file), hint
