"""What crosses each stage boundary, for one microbatch: every stage's example inputs and outputs.

A :class:`~torch.distributed.pipelining.PipelineStage` built without them runs each later stage on
*uninitialised* tensors to infer them, where token ids or expert indices crossing a cut index out
of range; built with them, every receive buffer has the real shape and dtype.

>>> import torch
>>> from torch import nn
>>> from unitscale import partition
>>> from unitscale.stages.runtime.boundaries import stage_examples
>>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
>>> x = torch.randn(6, 4)
>>> stages = partition(model, 2, x).stage_modules()
>>> [[tuple(t.shape) for t in ins] for ins, _ in stage_examples(stages, (x,), 3)]
[[(2, 4)], [(2, 8)]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from unitscale.errors import InputError

__all__ = ["StageExample", "stage_examples"]

#: one stage's example inputs and outputs (tensors on the meta device: shapes, strides, dtypes, requires_grad)
StageExample = tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]


def _on_meta(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor with ``t``'s shape, strides, dtype and ``requires_grad`` (nothing to pickle but those)."""
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return meta.requires_grad_(t.requires_grad and (t.is_floating_point() or t.is_complex()))


def _received(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the next stage receives it: a leaf that needs a gradient where the sender's value has one."""
    return t.detach().requires_grad_(t.requires_grad)


def _shapes(values: Sequence[Any]) -> str:
    return ", ".join(str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__ for v in values)


def stage_examples(
    stages: Sequence[nn.Module],
    inputs: Sequence[Any],
    num_microbatches: int,
    training: bool = True,
    who: str | None = None,
    expected: Sequence[Any] | None = None,
) -> list[StageExample]:
    """Each stage's inputs and outputs for the first of ``num_microbatches`` microbatches of ``inputs``.

    Args:
        stages: the chained stage modules (:meth:`~unitscale.StagePlan.stage_modules`).
        inputs: the model's (flat) inputs for the whole batch; tensors are split on dim 0.
        training: run with autograd, so that which values need a gradient is known.
        who: the function the user called; given, a stage that cannot run on ``inputs`` raises
            :class:`~unitscale.errors.InputError` naming it, the inputs' shapes and ``expected``'s.
        expected: the example inputs the plan was made with.

    Returns:
        Per stage, ``(inputs, outputs)`` as tensors on the meta device (inputs that are not tensors,
        such as a ``None`` the first stage bakes in, are left out).
    """
    args = tuple(x.tensor_split(num_microbatches)[0] if isinstance(x, torch.Tensor) and x.dim() else x for x in inputs)
    examples: list[StageExample] = []
    with torch.set_grad_enabled(training):
        for s, stage in enumerate(stages):
            try:
                out = stage(*args)
                out = out if isinstance(out, tuple) else (out,)
            except Exception as exc:
                if who is None:
                    raise
                made = f"; the plan was made with example inputs of shapes {_shapes(expected)}" if expected else ""
                raise InputError(
                    f"{who}: stage {s} cannot run on inputs of shapes {_shapes(inputs)} "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}){made}; "
                    "pass inputs like those (any batch size)"
                ) from exc
            sent = tuple(_on_meta(a) for a in args if isinstance(a, torch.Tensor))
            examples.append((sent, tuple(_on_meta(o) for o in out)))
            args = tuple(_received(o) for o in out)
    return examples
