"""What a graph route would lose of the model, found while it captures, and refused by name.

A captured graph must compute the model's forward *and its backward*. Two routes run the
model's Python on stand-ins: ``torch.fx`` on proxies, ``torch.export`` on fake tensors.
Where that Python calls a custom :class:`torch.autograd.Function`, they record the ops of
its ``forward``, and the graph's backward is the derivative of those ops, not the
Function's ``backward``: a straight-through estimator (``round`` forward, identity
backward) gets gradient 0. ``torch.export`` also runs the body of a reentrant
``torch.utils.checkpoint`` under ``no_grad``, so no gradient flows through it. And
``torch.fx`` traces the root's ``forward`` directly, so hooks on the root never run.

:func:`functions_applied` sees every ``Function.apply`` while a route traces (``apply``
is wrapped for that time, as ``torch.fx`` patches ``math`` functions while it traces);
:func:`refuse_lost_functions` and :func:`refuse_root_hooks` raise
:class:`~unitscale.errors.LostBehaviourError`, which is the route's reason:
``route="auto"`` moves on to a route that keeps the behaviour (TorchDynamo keeps
Functions; the eager route runs the model itself), a forced route refuses.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from unitscale.capture._where import show_frame, user_code_frame
from unitscale.errors import LostBehaviourError

__all__ = ["FunctionCall", "functions_applied", "refuse_lost_functions", "refuse_root_hooks"]


@dataclass(frozen=True)
class FunctionCall:
    """One ``Function.apply`` seen while a route traced: the class, the module it ran in, the user's line."""

    function: type
    module_path: str
    module_type: str
    source: str

    def describe(self) -> str:
        where = f"module '{self.module_path}'" if self.module_path else "the root"
        where += f" ({self.module_type})"
        name = f"{self.function.__module__}.{self.function.__qualname__}"
        return f"{name} in {where}" + (f" at {self.source}" if self.source else "")


_lock = threading.RLock()
_recorders: list[tuple[nn.Module, dict[int, str], list[FunctionCall]]] = []
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


def _recording_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if _recorders:
        root, paths, calls = _recorders[-1]
        caller = sys._getframe(1)
        path, kind = _module_of(caller, paths, root)
        user = user_code_frame(caller)
        source = show_frame(user.f_code.co_filename, user.f_lineno) if user is not None else ""
        calls.append(FunctionCall(cls, path, kind, source))
    return _original_apply.__func__(cls, *args, **kwargs)


@contextmanager
def functions_applied(root: nn.Module) -> Iterator[list[FunctionCall]]:
    """Every custom ``autograd.Function`` applied inside the block, with the module of ``root`` it ran in.

    >>> import torch
    >>> from unitscale.capture._faithful import functions_applied
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
    global _original_apply
    calls: list[FunctionCall] = []
    paths = {id(m): name for name, m in root.named_modules()}
    with _lock:
        if not _recorders:
            _original_apply = torch.autograd.Function.__dict__["apply"]
            torch.autograd.Function.apply = classmethod(_recording_apply)  # type: ignore[method-assign,assignment]
        _recorders.append((root, paths, calls))
    try:
        yield calls
    finally:
        with _lock:
            _recorders.remove((root, paths, calls))
            if not _recorders:
                torch.autograd.Function.apply = _original_apply  # type: ignore[method-assign]


def _is_reentrant_checkpoint(function: type) -> bool:
    return function.__module__ == "torch.utils.checkpoint" and function.__name__ == "CheckpointFunction"


def _is_backward_hook(function: type) -> bool:
    return function.__module__ == "torch.utils.hooks" and function.__name__ == "BackwardHookFunction"


def refuse_lost_functions(calls: list[FunctionCall], route: str, module: nn.Module) -> None:
    """Raise :class:`~unitscale.errors.LostBehaviourError` for the Functions ``route`` recorded as forward ops.

    On the ``fx`` route a reentrant ``torch.utils.checkpoint`` is kept: its body is traced
    as ops with their own derivatives, which recompute-and-differentiate gives too.
    """
    lost = [c for c in calls if not (route == "fx" and _is_reentrant_checkpoint(c.function))]
    if not lost:
        return
    first = lost[0]
    name = first.function.__qualname__
    more = f" (and {len(lost) - 1} more call(s): {', '.join(sorted({c.function.__qualname__ for c in lost[1:]}))})"
    more = more if len(lost) > 1 else ""
    tool = "torch.fx" if route == "fx" else "torch.export"
    if _is_reentrant_checkpoint(first.function):
        lost_what = (
            f"torch.utils.checkpoint(use_reentrant=True) in {first.describe().split(' in ', 1)[1]}: {tool} runs "
            "the checkpointed forward under no_grad, so the graph would compute no gradient through it"
        )
        fix = "use use_reentrant=False, or route='auto' (another route keeps it)"
    elif _is_backward_hook(first.function):
        lost_what = (
            f"a full backward hook (register_full_backward_hook) in {first.describe().split(' in ', 1)[1]}: "
            f"{tool} records the hook's identity Function as ops, so the hook would never run"
        )
        fix = "route='auto' moves on to a route that runs it"
    else:
        lost_what = (
            f"the custom autograd.Function {first.describe()}: {tool} records the ops of {name}.forward, so the "
            f"graph's backward would be their derivative instead of {name}.backward (the model's gradient is lost)"
        )
        fix = "route='auto' moves on to a route that keeps it (TorchDynamo, or the eager record)"
    raise LostBehaviourError(
        f"the {route} route cannot capture {type(module).__name__} faithfully: {lost_what}{more}; {fix}"
    )


_HOOK_DICTS = (
    ("_forward_pre_hooks", "forward pre-hook"),
    ("_forward_hooks", "forward hook"),
    ("_backward_pre_hooks", "backward pre-hook"),
    ("_backward_hooks", "backward hook"),
)


def root_hooks(module: nn.Module) -> list[str]:
    """The kinds of hook registered on ``module`` itself (``"forward pre-hook"``, ...)."""
    return [kind for attr, kind in _HOOK_DICTS if getattr(module, attr, None)]


def refuse_root_hooks(module: nn.Module) -> None:
    """``torch.fx`` traces the root's ``forward`` itself: its hooks would not run; refuse by name."""
    kinds = root_hooks(module)
    if kinds:
        raise LostBehaviourError(
            f"the fx route cannot capture {type(module).__name__} faithfully: it has {' and '.join(kinds)}(s) "
            f"registered on it, and torch.fx traces {type(module).__name__}.forward without running them; "
            "route='auto' moves on to a route that runs them (torch.export, TorchDynamo or the eager record)"
        )
