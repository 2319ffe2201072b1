"""The backward pass of scale tracking: which outputs (every float tensor that requires grad), which gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from unitscale.errors import BackwardShapeError, BackwardValueError, NoFloatOutputError

__all__ = ["flatten_tensors", "float_outputs", "gradients_for", "run_backward"]


def flatten_tensors(value: Any, path: str = "output") -> list[tuple[str, torch.Tensor]]:
    """Every tensor inside nested tuples, lists and dicts, with a path naming it.

    >>> [p for p, _ in flatten_tensors({"a": torch.ones(1), "b": (torch.ones(1), 3)})]
    ["output['a']", "output['b'][0]"]
    """
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in flatten_tensors(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in flatten_tensors(v, f"{path}[{k!r}]")]
    return []


def float_outputs(output: Any, model_name: str) -> list[tuple[str, torch.Tensor]]:
    """The floating-point tensors of a model's output, with their paths.

    Raises:
        NoFloatOutputError: if there is none.
    """
    tensors = flatten_tensors(output)
    floats = [(p, t) for p, t in tensors if t.is_floating_point()]
    if not floats:
        got = ", ".join(f"{p}: {t.dtype}" for p, t in tensors) or type(output).__name__
        raise NoFloatOutputError(
            f"{model_name} returned no floating-point tensor (got {got}); scale tracking needs a "
            "float output to take the backward pass from. Return the logits or the loss as a float tensor."
        )
    return floats


def gradients_for(outputs: Sequence[tuple[str, torch.Tensor]], backward: Any) -> list[torch.Tensor]:
    """One gradient per output: from ``backward`` if given, else 1 (scalar) or ``randn``.

    ``backward`` is ``None``, a tensor (when there is exactly one float output), or a
    tuple/list/dict shaped like the model's output.

    Raises:
        BackwardShapeError: a gradient is missing, not a tensor, or of the wrong shape.
        BackwardValueError: a gradient on the ``meta`` device (it holds no values).
    """
    if backward is None:
        return [torch.ones_like(t) if t.numel() == 1 else torch.randn_like(t) for _, t in outputs]
    if isinstance(backward, torch.Tensor):
        if len(outputs) != 1:
            names = ", ".join(p for p, _ in outputs)
            raise BackwardShapeError(
                f"backward is one tensor but the model has {len(outputs)} float outputs ({names}); "
                "pass a tuple, list or dict of gradients shaped like the output, or None"
            )
        given = {outputs[0][0]: backward}
    elif isinstance(backward, (tuple, list, dict)):
        given = dict(flatten_tensors(backward))
    else:
        raise BackwardShapeError(
            f"backward must be a tensor, a tuple/list/dict of tensors, or None; got {type(backward).__name__}"
        )
    grads = []
    for path, t in outputs:
        if path not in given:
            raise BackwardShapeError(
                f"backward has no gradient for {path} (shape {tuple(t.shape)}); "
                f"give one at the same place in the structure (got {', '.join(given) or 'nothing'})"
            )
        grad = given[path]
        if grad.device.type == "meta" and t.device.type != "meta":
            raise BackwardValueError(
                f"backward for {path} is a tensor on the meta device, which holds no values to backpropagate; "
                f"pass a gradient on {t.device} (or None for a unit-normal one)"
            )
        if grad.shape != t.shape:
            raise BackwardShapeError(
                f"backward for {path} has shape {tuple(grad.shape)} but {path} has shape {tuple(t.shape)}; "
                "pass a gradient of the output's shape, or None for a unit-normal one"
            )
        grads.append(grad.to(device=t.device, dtype=t.dtype))
    return grads


def run_backward(outputs: Sequence[tuple[str, torch.Tensor]], backward: Any, leaves: Sequence[torch.Tensor]) -> str:
    """Backpropagate gradients for ``outputs`` without touching any ``.grad`` of the model.

    Tensor hooks along the way see the gradients (with respect to ``leaves``); then they are dropped.

    Returns:
        ``""``, or why no backward pass ran (no output requires grad, no leaf does).
    """
    grads = gradients_for(outputs, backward)
    pairs = [(t, g) for (_, t), g in zip(outputs, grads, strict=True) if t.requires_grad]
    inputs = [leaf for leaf in leaves if leaf.requires_grad]
    if torch.is_inference_mode_enabled():
        return "called under torch.inference_mode(), where no operation records a backward"
    if not pairs:
        return "no output requires grad (no parameter of the model requires grad, and no input does)"
    if not inputs:
        return "no parameter or input requires grad"
    reached = _reentrant_checkpoint_leaves([t for t, _ in pairs])
    if reached is None:
        torch.autograd.grad([t for t, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
        return ""
    # A reentrant torch.utils.checkpoint refuses autograd.grad (its backward runs a backward of its
    # own): run the model's .backward() itself, with every .grad it could reach set aside and put back.
    kept = {id(t): (t, t.grad) for t in [*inputs, *reached]}
    try:
        for t, _ in kept.values():
            t.grad = None
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    finally:
        for t, grad in kept.values():
            t.grad = grad
    return ""


def _reentrant_checkpoint_leaves(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The leaves the backward of ``outputs`` accumulates into, if it passes a reentrant checkpoint; else ``None``.

    The checkpointed segment's own parameters are not among them: the caller sets the model's aside too.
    """
    fns = _grad_fns(outputs)
    if not any(type(fn).__name__ == "CheckpointFunctionBackward" for fn in fns):
        return None
    leaves = [getattr(fn, "variable", None) for fn in fns if type(fn).__name__ == "AccumulateGrad"]
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _grad_fns(tensors: Sequence[torch.Tensor]) -> list[Any]:
    """Every autograd node the backward pass of ``tensors`` goes through, each once."""
    seen = dict.fromkeys(t.grad_fn for t in tensors if t.grad_fn is not None)
    stack = list(seen)
    while stack:
        for fn, _ in stack.pop().next_functions:
            if fn is not None and fn not in seen:
                seen[fn] = None
                stack.append(fn)
    return list(seen)
