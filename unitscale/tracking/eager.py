"""Scale tracking without ``torch.fx``: record the ops of a model as they run.

Running the model under a :class:`torch.overrides.TorchFunctionMode` sees every torch function
it calls, data-dependent control flow included; each float result is recorded like a graph node.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from unitscale.capture.toolkit import OpRecorder
from unitscale.fx.nodes import VIEW_FUNCTIONS, VIEW_METHODS, in_place_name, op_name
from unitscale.tracking.recording import ScaleRecording, Step

__all__ = ["ScaleRecorder", "SAME_VALUE_OPS", "record_ops"]

# Methods that return their input itself when there is nothing to do (x.float() of a float32 x)
_ITSELF_METHODS = frozenset(
    {"contiguous", "to", "float", "double", "half", "bfloat16", "type", "type_as", "cpu", "cuda"}
)
_SAME_VALUE_METHODS = _ITSELF_METHODS | {"clone", "detach"}

#: Ops (as :func:`~unitscale.fx.nodes.op_name` names them) whose output holds the same values as
#: their first argument where it keeps its dtype and size (views, copies, casts that cast nothing).
SAME_VALUE_OPS: frozenset[str] = frozenset(
    {f"Tensor.{m}" for m in VIEW_METHODS | _SAME_VALUE_METHODS}
    | {op_name(f) for f in VIEW_FUNCTIONS}
    | {"clone", "detach"}
)


# Ops that return their input itself when they change nothing (dropout in eval mode) and
# another tensor with other values otherwise: only the first case shares a record.
_SAME_OBJECT_OPS = frozenset(
    {"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d"}
)


class ScaleRecorder(OpRecorder):
    """The eager route of scale tracking: records every floating-point tensor an op returns.

    An op returning several tensors gives a row per float tensor, ``name[i]``.

    Args:
        captured: where rows, records and hooks go (and whether abs-maxes are recorded).

    >>> import torch
    >>> from unitscale.tracking.eager import ScaleRecorder
    >>> from unitscale.tracking.recording import ScaleRecording
    >>> captured = ScaleRecording()
    >>> class Net(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x.mul(3.0).sum()
    >>> _ = ScaleRecorder(Net(), captured).run(torch.ones(4))
    >>> [row.node for row, _ in captured.entries]
    ['mul', 'sum']
    """

    def __init__(self, root: nn.Module, captured: ScaleRecording) -> None:
        super().__init__(root)
        self.captured = captured

    def record(self, name: str, op: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        source = args[0] if args else None
        if isinstance(out, torch.Tensor):
            # dropout in eval mode returns its input itself: then it holds its values
            same = source is not None and (op in SAME_VALUE_OPS or (op in _SAME_OBJECT_OPS and out is source))
            in_place = out is source and (kwargs.get("inplace") is True or in_place_name(op.removeprefix("Tensor.")))
            step = Step(name, "call_function", self.module_path, op, from_source=same, in_place=in_place)
            self.captured.record(out, step, source)
        elif isinstance(out, (tuple, list)):
            tensors = [t for t in out if isinstance(t, torch.Tensor) and t.is_floating_point()]
            for i, t in enumerate(tensors):
                self.captured.record(t, Step(f"{name}[{i}]", "call_function", self.module_path, op))


def record_ops(module: nn.Module, inputs: tuple[Any, ...], captured: ScaleRecording) -> None:
    """Run ``module(*inputs)`` eagerly, recording the scale of every op's float output in ``captured``.

    Inputs are recorded under their parameter names; the output goes to ``captured.output``.
    The caller closes ``captured.cleanup`` after the backward pass (or on an error).

    >>> import torch
    >>> from unitscale.tracking.eager import record_ops
    >>> class Net(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x * 2 if x.sum() > 0 else x.relu()
    >>> captured = ScaleRecording()
    >>> record_ops(Net(), (torch.ones(3),), captured)
    >>> [(row.node, row.op) for row, _ in captured.entries]
    [('x', 'input'), ('sum', 'Tensor.sum'), ('mul', 'Tensor.mul')]
    >>> captured.cleanup.close()
    """
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        names = []
    names += [f"input_{i}" for i in range(len(names), len(inputs))]
    args = [captured.record(v, Step(name, "placeholder", "", "input")) for v, name in zip(inputs, names, strict=False)]
    captured.leaves.extend(p for p in module.parameters() if p.requires_grad)
    captured.output = ScaleRecorder(module, captured).run(*args)
    captured.share_view_gradients()
