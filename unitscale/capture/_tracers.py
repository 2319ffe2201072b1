"""The fx route's tracers, which write each node's normalised origin as they make it (no second pass)."""

from __future__ import annotations

import sys
import typing
from typing import Any

from torch import fx, nn

from unitscale.capture._meta import Origin, type_name, write_origin
from unitscale.fx import DeepTracer, ModulePathTracer
from unitscale.fx.trace_errors import show_frame, user_code_frame

__all__ = ["CaptureTracer", "DeepCaptureTracer", "FlatCaptureTracer"]


class CaptureTracer(ModulePathTracer):
    """``torch.fx``'s standard leaf rule; a node's ``source`` is also kept as a one-line ``stack_trace``."""

    #: Find each node's ``source`` (one walk up the stack per node).
    record_sources = True

    def trace(self, root: nn.Module | Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self._types: dict[str, str] = {}
        return super().trace(root, concrete_args)

    def record_origin(self, node: fx.Node) -> None:
        super().record_origin(node)
        source, output = "", node.op == "output"
        frame = user_code_frame(sys._getframe(1)) if not output and self.record_sources else None
        if frame is not None:
            code = frame.f_code
            node.meta["stack_trace"] = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
            source = show_frame(code.co_filename, frame.f_lineno)
        path = "" if output else self.current_module_path  # the output: the root's
        module_type = self._types.get(path)
        if module_type is None:
            module_type = self._types[path] = type_name(type(self.root.get_submodule(path)))
        write_origin(node, Origin(path, module_type, source))


class FlatCaptureTracer(CaptureTracer):
    """Traces through every module, ``torch.nn`` ones too: a graph of torch functions, no ``call_module``."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return False


class DeepCaptureTracer(CaptureTracer, DeepTracer):
    """A :class:`~unitscale.fx.DeepTracer` that writes each node's origin (scale tracking's tracer).

    String annotations are resolved to types, or dropped (the ``GraphModule`` would not pickle).
    Nodes get ``source == ""``: scale tracking shows none, and finding it costs a tenth of the trace.

    >>> from unitscale.capture._tracers import DeepCaptureTracer
    >>> from unitscale.examples import MLP
    >>> graph = DeepCaptureTracer().trace(MLP(4))
    >>> for n in graph.nodes:
    ...     if n.op == "call_function":
    ...         print(n.name, n.meta["module_path"], n.meta["module_type"])
    linear fc1 torch.nn.modules.linear.Linear
    relu act torch.nn.modules.activation.ReLU
    linear_1 fc2 torch.nn.modules.linear.Linear
    """

    record_sources = False

    def trace(self, root: nn.Module | Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        graph = super().trace(root, concrete_args)
        if any(isinstance(n.type, str) for n in graph.nodes):
            fn = root.forward if isinstance(root, nn.Module) else root
            try:
                hints = typing.get_type_hints(fn)
            except Exception:
                hints = {}
            for n in graph.nodes:
                if isinstance(n.type, str):
                    key = "return" if n.op == "output" else n.target
                    n.type = hints.get(key) if isinstance(hints.get(key), type) else None
        return graph
