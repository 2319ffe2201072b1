"""The eager route: run the model once and record its ops and module calls as they happen."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

from unitscale.capture._meta import type_name
from unitscale.fx.global_state import GLOBAL_STATE_LOCK
from unitscale.fx.nodes import op_name
from unitscale.fx.trace_errors import TOOL_DIRS, UNITSCALE_DIR, user_line

__all__ = ["OpRecorder", "RecordedOp", "record_eager"]


class OpRecorder(TorchFunctionMode):
    """Runs a model once and hands every torch function it calls to :meth:`record`, which a subclass overrides.

    Each call gets a unique name as an fx node would (``linear``, ``linear_1``) and the innermost
    module it ran in. Property reads (``x.shape``) are not calls, nor are the ops inside a
    recorded function (the pieces of ``layer_norm``) or those :meth:`record` computes.

    Attributes:
        module_calls: the path of each module call in pre-hook order (the root's is ``""``).
        stack: the modules of the root whose ``forward`` is running, innermost last.

    >>> import torch
    >>> from unitscale.capture.toolkit import OpRecorder
    >>> class Shapes(OpRecorder):
    ...     def record(self, name, op, func, args, kwargs, out):
    ...         print(name, op, repr(self.module_path), tuple(out.shape))
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    >>> _ = Shapes(model).run(torch.ones(1, 2))
    linear linear '0' (1, 3)
    relu relu '1' (1, 3)
    """

    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.root = root
        self.paths = {id(m): name for name, m in root.named_modules()}
        self.stack: list[nn.Module] = []
        self.module_calls: list[str] = []
        self._counts: Counter[str] = Counter()
        self._ops: dict[Any, str] = {}
        self._thread = threading.get_ident()

    @property
    def module(self) -> nn.Module:
        """The innermost module of the root whose ``forward`` is running (the root outside any)."""
        return self.stack[-1] if self.stack else self.root

    @property
    def module_path(self) -> str:
        """Its qualified name (``""``: the root)."""
        return self.paths[id(self.stack[-1])] if self.stack else ""

    def record(self, name: str, op: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Keep what a tool needs of one call (nothing here): ``out = func(*args, **kwargs)``, named ``name``."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _called_by_library(sys._getframe(1)):
            # unitscale's own work (a scale tracker nested in the model, a transform's check)
            # is not the model's: run it unrecorded
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            op = self._ops[func]
        except (KeyError, TypeError):  # TypeError: a function that does not hash
            if getattr(func, "__name__", "") == "__get__":  # property reads (x.shape, x.T)
                return out
            op = op_name(func)
            with contextlib.suppress(TypeError):
                self._ops[func] = op
        base = op.removeprefix("Tensor.")
        n = self._counts[base]
        self._counts[base] = n + 1
        self.record(base if n == 0 else f"{base}_{n}", op, func, args, kwargs, out)
        return out

    def enter_module(self, module: nn.Module, *_: Any) -> None:
        """A module's forward starts (a global forward pre-hook while :meth:`run` runs)."""
        path = self.paths.get(id(module))
        # global hooks see every thread; inside a compiled module (TorchDynamo traces this hook,
        # and cannot trace threading) the call is this thread's
        if path is not None and (torch.compiler.is_compiling() or threading.get_ident() == self._thread):
            self.stack.append(module)
            self.module_calls.append(path)

    def leave_module(self, module: nn.Module, *_: Any) -> None:
        """A module's forward returned (a global forward hook while :meth:`run` runs)."""
        mine = torch.compiler.is_compiling() or threading.get_ident() == self._thread
        if self.stack and self.stack[-1] is module and mine:
            self.stack.pop()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """``root(*args, **kwargs)`` with every torch function call of this thread recorded; returns the output."""
        # one record at a time: the global hooks are process-wide state, and two records at once
        # in two threads were measured to mix their rows (tests/test_safety_threads.py)
        with GLOBAL_STATE_LOCK:
            self._thread = threading.get_ident()
            pre = register_module_forward_pre_hook(self.enter_module)
            post = register_module_forward_hook(self.leave_module)
            try:
                with self:
                    return self.root(*args, **kwargs)
            finally:
                pre.remove()
                post.remove()


# Frames looked through: a recorder's handler (a recorder nested in another hands the model's ops
# on) and the runner of one graph node, shared by the tools' own checks and by the tracked run.
_HERE = UNITSCALE_DIR + "capture/_eager.py"
_LOOKED_THROUGH = {(_HERE, "__torch_function__"), (UNITSCALE_DIR + "fx/plain_run.py", "run_plainly")}
# Frames of the tools that run the model itself: what is called under them is the model's.
_RUN_THE_MODEL = {(_HERE, "run"), (UNITSCALE_DIR + "tracking/compiled.py", "run_node")}
_kinds: dict[Any, str] = {}


def _frame_kind(code: Any) -> str:
    kind = _kinds.get(code)
    if kind is None:
        name = code.co_filename.replace("\\", "/")
        if (name, code.co_name) in _LOOKED_THROUGH:
            kind = "through"
        elif (name, code.co_name) in _RUN_THE_MODEL:
            kind = "model"
        elif "/torch/" in name:
            kind = "through"
        elif name.startswith(TOOL_DIRS):
            kind = "library"
        else:
            kind = "model"
        _kinds[code] = kind
    return kind


def _called_by_library(frame: Any) -> bool:
    """Whether unitscale's tools (not the model) called the torch function: the first caller outside torch decides."""
    while frame is not None:
        kind = _frame_kind(frame.f_code)
        if kind != "through":
            return kind == "library"
        frame = frame.f_back
    return False


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


class _OpList(OpRecorder):
    """The eager route's recorder: a :class:`RecordedOp` per call."""

    def __init__(self, root: nn.Module) -> None:
        super().__init__(root)
        self.ops: list[RecordedOp] = []
        self.params = {id(p): name for name, p in root.named_parameters(remove_duplicate=False)}

    def record(self, name: str, op: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        inputs = torch.utils._pytree.tree_leaves((args, kwargs))
        params = tuple(self.params[id(a)] for a in inputs if isinstance(a, nn.Parameter) and id(a) in self.params)
        self.ops.append(
            RecordedOp(
                name,
                op,
                self.module_path,
                type_name(type(self.module)),
                user_line(sys._getframe(1)),
                tuple(tuple(t.shape) for t in tensors),
                tuple(str(t.dtype).removeprefix("torch.") for t in tensors),
                params,
            )
        )


def record_eager(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _OpList:
    """Run ``module(*args, **kwargs)`` and record its ops and module calls (the recorder's ``ops``, ``module_calls``).

    >>> import torch
    >>> from unitscale.capture._eager import record_eager
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> rec = record_eager(model, (torch.ones(1, 2),), {})
    >>> rec.module_calls, [(op.name, op.module_path, op.params) for op in rec.ops]
    (['', '0'], [('linear', '0', ('0.weight', '0.bias'))])
    """
    recorder = _OpList(module)
    recorder.run(*args, **kwargs)
    return recorder
