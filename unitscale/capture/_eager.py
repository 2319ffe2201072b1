"""The eager route: run the model once and record the ops and module calls as they happen.

Nothing here is a graph: a model no graph route can capture still has a list of the
torch functions it called, each with the module it ran in and the user's line, and the
order its modules were called in (what forward pre-hooks see). Tools that need a graph
ask :meth:`unitscale.capture.Capture.require_graph`, which raises
:class:`~unitscale.errors.NoGraphError` with every graph route's reason.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

from unitscale.capture._meta import type_name
from unitscale.capture._where import _is_machinery, _show

__all__ = ["RecordedOp", "EagerRecord", "record_eager"]


class RecordedOp(NamedTuple):
    """One torch function call seen by the eager route.

    Attributes:
        name: unique name (``linear``, ``linear_1``), like a node's.
        op: the function's name (``linear``, ``Tensor.view``).
        module_path: qualified name of the innermost module it ran in (``""``: the root).
        module_type: qualified class name of that module.
        source: ``"file.py:LINE"`` of the innermost frame outside torch.
        shapes: shapes of the tensors it returned.
        dtypes: their dtypes (``"float32"``).
        params: qualified names of the parameters it took as arguments.
    """

    name: str
    op: str
    module_path: str
    module_type: str
    source: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    params: tuple[str, ...] = ()


@dataclass
class EagerRecord:
    """What one eager run recorded: ops in order, module calls in pre-hook order, the output."""

    ops: list[RecordedOp] = field(default_factory=list)
    module_calls: list[str] = field(default_factory=list)
    output: Any = None


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        name = name[2:-2]
    owner = getattr(func, "__objclass__", None)
    if owner is not None and isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return f"Tensor.{name}"
    return name


def _source() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        if not _is_machinery(frame.f_code.co_filename, skip_unitscale=True):
            return _show(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class _Recorder(TorchFunctionMode):
    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.record = EagerRecord()
        self.names = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
        self.params = {id(p): name for name, p in root.named_parameters(remove_duplicate=False)}
        self.root_type = type_name(type(root))
        self.stack: list[nn.Module] = []
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "__get__":  # property reads (x.shape, x.T)
            return out
        op = _op_name(func)
        base = op.removeprefix("Tensor.")
        n = self.counts[base]
        self.counts[base] += 1
        tensors = torch.utils._pytree.tree_leaves(out)
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        inputs = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        params = tuple(self.params[id(a)] for a in inputs if isinstance(a, nn.Parameter) and id(a) in self.params)
        module = self.stack[-1] if self.stack else None
        self.record.ops.append(
            RecordedOp(
                base if n == 0 else f"{base}_{n}",
                op,
                self.names.get(id(module), "") if module is not None else "",
                type_name(type(module)) if module is not None else self.root_type,
                _source(),
                tuple(tuple(t.shape) for t in tensors),
                tuple(str(t.dtype).removeprefix("torch.") for t in tensors),
                params,
            )
        )
        return out

    def enter(self, module: nn.Module, *_: Any) -> None:
        if id(module) in self.names:
            self.stack.append(module)
            self.record.module_calls.append(self.names[id(module)])

    def leave(self, module: nn.Module, *_: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()


def record_eager(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EagerRecord:
    """Run ``module(*args, **kwargs)`` and record its ops and module calls.

    >>> rec = record_eager(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.ones(1, 2),), {})
    >>> rec.module_calls, [(op.name, op.module_path, op.params) for op in rec.ops]
    (['', '0'], [('linear', '0', ('0.weight', '0.bias'))])
    """
    recorder = _Recorder(module)
    pre = register_module_forward_pre_hook(recorder.enter)
    post = register_module_forward_hook(recorder.leave)
    try:
        with recorder:
            recorder.record.output = module(*args, **kwargs)
    finally:
        pre.remove()
        post.remove()
    return recorder.record
