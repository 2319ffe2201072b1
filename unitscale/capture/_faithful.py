"""What a graph route would lose of the model's forward or backward, refused by name as the route's reason.

Why each is lost: "A graph is the model, backward included" in ``unitscale/capture/README.md``.
"""

from __future__ import annotations

import torch
from torch import nn

from unitscale.errors import LostBehaviourError
from unitscale.fx.autograd_functions import FunctionCall
from unitscale.fx.module_state import registered_hooks

__all__ = ["refuse_lost_functions", "refuse_root_hooks"]


def _is_reentrant_checkpoint(function: type) -> bool:
    return function.__module__ == "torch.utils.checkpoint" and function.__name__ == "CheckpointFunction"


def _is_backward_hook(function: type) -> bool:
    return function.__module__ == "torch.utils.hooks" and function.__name__ == "BackwardHookFunction"


def refuse_lost_functions(calls: list[FunctionCall], route: str, module: nn.Module) -> None:
    """Raise :class:`~unitscale.errors.LostBehaviourError` for the Functions ``route`` recorded as forward ops.

    The ``fx`` route keeps a reentrant checkpoint (its traced ops differentiate alike) unless it is
    applied to the inputs alone: its parameters' gradient then hangs on an input requiring grad.
    """
    lost = [c for c in calls if not (route == "fx" and _is_reentrant_checkpoint(c.function) and not c.inputs_only)]
    if not lost:
        return
    first = lost[0]
    name = first.function.__qualname__
    if "ApplyTemplate" in name:  # strict export meets the Function as TorchDynamo's autograd_function_apply
        name = "the Function"
    more = f" (and {len(lost) - 1} more call(s): {', '.join(sorted({c.function.__qualname__ for c in lost[1:]}))})"
    more = more if len(lost) > 1 else ""
    tool = "torch.fx" if route == "fx" else "torch.export"
    where = first.describe().split(" in ", 1)[1]
    if first.function is torch.no_grad:
        lost_what = (
            f"grad mode switched off (torch.no_grad() or set_grad_enabled(False)) in {where}: torch.fx records "
            "no grad mode, so the graph would compute gradients through ops the model computes without them"
        )
        fix = "route='auto' moves on to a route that keeps it (torch.export, TorchDynamo or the eager record)"
    elif _is_reentrant_checkpoint(first.function):
        lost_what = f"torch.utils.checkpoint(use_reentrant=True) in {where}" + (
            ", applied to the model's inputs alone: when none of them requires grad, torch runs it under no_grad "
            "and its parameters get no gradient, but the graph would give them one"
            if route == "fx"
            else f": {tool} runs the checkpointed forward under no_grad, so the graph would compute no gradient "
            "through it"
        )
        fix = "use use_reentrant=False, or route='auto' (another route keeps it)"
    elif _is_backward_hook(first.function):
        lost_what = (
            f"a full backward hook (register_full_backward_hook) in {where}: "
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


def refuse_root_hooks(module: nn.Module) -> None:
    """``torch.fx`` traces the root's ``forward`` itself: its hooks would not run; refuse by name."""
    if kinds := registered_hooks(module):
        raise LostBehaviourError(
            f"the fx route cannot capture {type(module).__name__} faithfully: it has {' and '.join(kinds)}(s) "
            f"registered on it, and torch.fx traces {type(module).__name__}.forward without running them; "
            "route='auto' moves on to a route that runs them (torch.export, TorchDynamo or the eager record)"
        )
