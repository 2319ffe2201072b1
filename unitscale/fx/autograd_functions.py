"""Which custom ``torch.autograd.Function`` s a block of code applies: what a trace would lose.

A trace records the ops of ``SomeFunction.forward``, whose derivative is not ``SomeFunction.backward``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from unitscale.fx.trace_errors import TOOL_DIRS, user_line

__all__ = ["FunctionCall", "functions_applied"]


@dataclass(frozen=True)
class FunctionCall:
    """One ``Function.apply`` seen while a route traced: the class, the module it ran in, the user's line.

    ``inputs_only``: the traced tensors it was applied to depend only on the graph's inputs.
    """

    function: type
    module_path: str
    module_type: str
    source: str
    inputs_only: bool = False

    def describe(self) -> str:
        where = f"module '{self.module_path}'" if self.module_path else "the root"
        where += f" ({self.module_type})"
        name = f"{self.function.__module__}.{self.function.__qualname__}"
        if "ApplyTemplate" in name:  # what TorchDynamo (strict export) makes of a user's Function
            name = "(a Function TorchDynamo rewrote as autograd_function_apply)"
        return f"{name} in {where}" + (f" at {self.source}" if self.source else "")


_lock = threading.RLock()
# (thread, root, module paths, calls): a block records only what its own thread applies, so a
# model another thread runs meanwhile is neither recorded nor refused
_recorders: list[tuple[int, nn.Module, dict[int, str], list[FunctionCall]]] = []
_original_apply: Any = None


def _module_of(frame: Any, paths: dict[int, str], root: nn.Module) -> tuple[str, str]:
    """The innermost module of the root whose code is on the stack (its ``self``), and its type."""
    depth = 0
    while frame is not None and depth < 64:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in paths:
            return paths[id(owner)], type(owner).__name__
        frame, depth = frame.f_back, depth + 1
    return "", type(root).__name__


_applying = threading.local()  # Functions this thread is applying: their forward's grad switches are theirs
_original_set_grad: Any = None
_watch_grad = [0]


def _recorder() -> tuple[nn.Module, dict[int, str], list[FunctionCall]] | None:
    """The innermost block of this thread, if any."""
    me = threading.get_ident()
    for thread, root, paths, calls in reversed(_recorders):
        if thread == me:
            return root, paths, calls
    return None


def _inputs_only(args: tuple[Any, ...]) -> bool:
    """Whether some of ``args`` are fx proxies, and none depends on a parameter, buffer or submodule."""
    todo = [a.node for a in args if isinstance(a, fx.Proxy)]
    seen: set[fx.Node] = set()
    while todo:
        node = todo.pop()
        if node.op in ("get_attr", "call_module"):
            return False
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return bool(seen)


def _record(function: Any, caller: Any, args: tuple[Any, ...] = ()) -> None:
    found = _recorder()
    if found is None:
        return
    root, paths, calls = found
    path, kind = _module_of(caller, paths, root)
    calls.append(FunctionCall(function, path, kind, user_line(caller), _inputs_only(args)))


def _kept_by_every_route(cls: Any) -> bool:
    """A Function torch makes for a ``torch.library`` custom op's backward: every route keeps the op whole."""
    return str(getattr(cls, "__module__", "")).startswith("torch._library")


def _recording_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if _recorders and not _kept_by_every_route(cls):
        _record(cls, sys._getframe(1), args)
    _applying.depth = getattr(_applying, "depth", 0) + 1
    try:
        return _original_apply.__func__(cls, *args, **kwargs)
    finally:
        _applying.depth -= 1


def _by_the_model(frame: Any) -> bool:
    """Whether the first caller outside torch is the model's code (not a tracer's own bookkeeping)."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/" not in name:
            return not name.startswith(TOOL_DIRS)
        frame = frame.f_back
    return False


def _recording_set_grad(enabled: bool) -> None:
    if _recorders and not enabled and torch.is_grad_enabled() and not getattr(_applying, "depth", 0):
        caller = sys._getframe(1)
        if _by_the_model(caller):
            _record(torch.no_grad, caller)
    _original_set_grad(enabled)


@contextmanager
def functions_applied(root: nn.Module, grad_switches: bool = False) -> Iterator[list[FunctionCall]]:
    """Every custom ``autograd.Function`` this thread applies inside the block, with the module of ``root`` it ran in.

    With ``grad_switches``, every switch of grad mode off outside a Function's ``forward`` is
    listed too, as a call of ``torch.no_grad``: a symbolic trace records no grad mode.

    >>> import torch
    >>> from unitscale.fx.autograd_functions import functions_applied
    >>> class Twice(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x): return x * 2
    ...     @staticmethod
    ...     def backward(ctx, g): return g * 2
    >>> with functions_applied(torch.nn.Identity()) as calls:
    ...     _ = Twice.apply(torch.ones(1))
    >>> [c.function.__name__ for c in calls]
    ['Twice']
    """
    global _original_apply, _original_set_grad
    calls: list[FunctionCall] = []
    paths = {id(m): name for name, m in root.named_modules()}
    with _lock:
        if not _recorders:
            _original_apply = torch.autograd.Function.__dict__["apply"]
            torch.autograd.Function.apply = classmethod(_recording_apply)  # type: ignore[method-assign,assignment]
        if grad_switches:
            if not _watch_grad[0]:
                _original_set_grad = torch._C._set_grad_enabled
                torch._C._set_grad_enabled = _recording_set_grad
            _watch_grad[0] += 1
        entry = (threading.get_ident(), root, paths, calls)
        _recorders.append(entry)
    try:
        yield calls
    finally:
        with _lock:
            _recorders.remove(entry)
            if grad_switches:
                _watch_grad[0] -= 1
                if not _watch_grad[0]:
                    torch._C._set_grad_enabled = _original_set_grad
            if not _recorders:
                torch.autograd.Function.apply = _original_apply  # type: ignore[method-assign]
