"""The graph transforms users call: :func:`unit_scale`, :func:`simulate_format`, :func:`apply_transform`."""

from __future__ import annotations

import copy
import logging
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

import unitscale.functional as U
from unitscale.errors import (
    FormatError,
    InputError,
    NotAModuleError,
    NotCallableError,
    NothingQuantisedWarning,
    ReplaceMapError,
    UnscaledOpsError,
)
from unitscale.formats import FP8_E4M3, FP8_E5M2, FPFormat
from unitscale.transforms._graph import _function_of, _lookup
from unitscale.transforms.transformed_module import GraphTransform, TransformedModule, _check_route_inputs
from unitscale.transforms.unit_scale_pass import UnitScalePass

__all__ = ["TransformedModule", "apply_transform", "simulate_format", "simulate_fp8", "unit_scale"]

logger = logging.getLogger(__name__)


def _check_module(module: Any, caller: str) -> None:
    """Refuse a non-module in the words of the function the user called."""
    if not isinstance(module, nn.Module):
        raise NotAModuleError(f"{caller}: expected an nn.Module, got {type(module).__name__}")


def apply_transform(
    module: nn.Module,
    transform: GraphTransform,
    example_inputs: Any = None,
    example_kwargs: dict[str, Any] | None = None,
    route: str | Sequence[str] = "auto",
) -> TransformedModule:
    """Wrap ``module`` so that ``transform`` runs over its captured graph.

    The graph handed to ``transform`` reads parameters and buffers as ``get_attr`` nodes
    named as in ``module``, holds torch functions (an exported graph's aten ops are read as
    them), and carries an ``example_value`` and the capture layer's ``module_path``,
    ``module_type`` and ``source`` in each node's meta. Without ``example_inputs`` the graph is
    TorchDynamo's, captured on the first call per input signature; with them it is captured
    now by the first route of :func:`unitscale.capture.capture` that takes the model (or the
    ``route`` forced), and ``result.route`` says which. Applied to a :class:`TransformedModule`,
    the transform runs after its transforms, on shared parameters, captured with its example
    inputs again; ``module`` itself is not changed.

    Args:
        module: any module TorchDynamo (or, with example inputs, any capture route)
            can capture in one graph.
        example_inputs: a tensor or tuple of positional inputs: capture now.
        route: ``"auto"`` (every graph route, in order), a route name or a tuple of
            them (needs ``example_inputs``).

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        NotCallableError: ``transform`` is not callable.
        TransformError: (at capture) ``transform`` raised or did not return an ``fx.GraphModule``.
        InputError: ``route`` without ``example_inputs``, or inputs the model cannot take.
        NoRouteError: (with ``example_inputs``) no allowed route captured the model;
            the message lists each route's reason.

    >>> import torch
    >>> from unitscale.transforms import apply_transform
    >>> def double_relu(x, inplace=False):
    ...     return 2 * torch.relu(x)
    >>> def double_relus(gm):
    ...     for node in gm.graph.nodes:
    ...         if node.target is torch.nn.functional.relu:
    ...             node.target = double_relu
    ...     gm.recompile()
    ...     return gm
    >>> model = apply_transform(torch.nn.ReLU(), double_relus)
    >>> model(torch.tensor([-1.0, 3.0])).tolist()
    [0.0, 6.0]
    """
    _check_module(module, "apply_transform")
    if not callable(transform):
        raise NotCallableError(
            f"apply_transform: transform must be callable (GraphModule -> GraphModule), got {transform!r}"
        )
    _check_route_inputs(example_inputs, route)
    outer, model, earlier = _unwrap(module)
    return _captured(TransformedModule.wrap(model, (*earlier, transform)), outer, example_inputs, example_kwargs, route)


def _unwrap(module: nn.Module) -> tuple[TransformedModule | None, nn.Module, tuple[GraphTransform, ...]]:
    """``(module, its model, its transforms)`` for a :class:`TransformedModule`, else ``(None, module, ())``."""
    if isinstance(module, TransformedModule):
        return module, module.module, module.transforms
    return None, module, ()


def _captured(
    wrapped: TransformedModule,
    inner: TransformedModule | None,
    example_inputs: Any,
    example_kwargs: dict[str, Any] | None,
    route: str | Sequence[str],
) -> TransformedModule:
    """Capture ``wrapped`` now if example inputs are given, or if ``inner`` was captured with some."""
    if example_inputs is None and inner is not None and inner._eager_spec is not None:
        example_inputs, example_kwargs, route = inner._eager_spec
    if example_inputs is None:
        return wrapped
    return wrapped.capture_now(example_inputs, example_kwargs, route)


def _check_replace(replace: Any) -> dict[Any, Callable[..., Any]]:
    if replace is None:
        return {}
    if not isinstance(replace, Mapping):
        raise ReplaceMapError(
            f"unit_scale: replace must be a mapping (torch function -> replacement), got {type(replace).__name__}"
        )
    for key, value in replace.items():
        if not callable(key):
            raise ReplaceMapError(
                f"unit_scale: replace key {key!r} is not callable; keys are the torch functions to replace"
            )
        if not callable(value):
            raise ReplaceMapError(
                f"unit_scale: replace[{getattr(key, '__name__', key)!r}] = {value!r} is not callable; "
                f"map each torch function to a function with the same signature"
            )
    return dict(replace)


def unit_scale(
    module: nn.Module,
    replace: Mapping[Any, Callable[..., Any]] | None = None,
    strict: bool = False,
    example_inputs: Any = None,
    example_kwargs: dict[str, Any] | None = None,
    route: str | Sequence[str] = "auto",
    check: bool = True,
) -> TransformedModule:
    """Unit-scale a model: swap every torch op for its unit-scaled twin in its captured graph.

    The forward is captured as :func:`apply_transform` captures it. The pass is an ordered list
    of named rules (:func:`~unitscale.transforms.rule_names`, :func:`~unitscale.transforms.register_rule`);
    tutorials 7a and 7b show what it does to residual adds, hand-written ops and batch norm.

    Parameters are an independent copy of ``module``'s (``module`` is not changed),
    re-initialised on the first call by the role the graph gives them (weights and embeddings
    ``N(0, 1)``, biases 0, norm gains 1, batch-norm running statistics 0 and 1), only where
    every op that reads them was unit-scaled; a ``state_dict`` loaded before the first call is kept.
    Batch norm's gradient growth is measured by the first backward pass and frozen in
    ``result.grad_scales`` (buffers, saved in ``state_dict``), so backward stays linear.

    Ops left as they were are logged on the ``unitscale.transforms.passes`` logger. Each capture
    runs the new graph once more, forward and backward, on the capturing call's inputs (buffers and
    random number generator put back), into ``result.scale_check``; when that is off unit scale
    (outside [0.5, 2]) its summary is logged on the ``unitscale.transforms.transformed_module``
    logger: a report, not an error.

    Applied to a :class:`TransformedModule`, unit scaling runs before any :func:`simulate_format`
    among its transforms, so ``unit_scale(simulate_fp8(m))`` computes what
    ``simulate_fp8(unit_scale(m))`` does. The wrapper starts in the mode of ``module``.

    Args:
        replace: extra or overriding replacements, ``{torch function: replacement}``.
        strict: ``True``: raise :class:`~unitscale.errors.UnscaledOpsError` instead of logging.
        example_inputs: a tensor or tuple of positional inputs: capture now, as :func:`apply_transform` does.
        route: ``"auto"`` (every graph route, in order), one route name or a tuple of
            them (needs ``example_inputs``).
        check: ``False`` skips the extra forward and backward pass of ``result.scale_check``
            (and the memory its gradients take).

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        ReplaceMapError: ``replace`` is not a mapping of callables to callables.
        InputError: ``strict`` or ``check`` is not a bool, ``route`` without ``example_inputs``,
            example inputs the model cannot take, or a batch norm in training mode with
            ``momentum=None`` (a cumulative average, not implemented here).
        NoRouteError: (with ``example_inputs``) no allowed route captured the model; the
            message lists each route's reason with the user's file and line.
        CaptureError: (on the first call) TorchDynamo cannot capture the forward in one graph,
            or the forward returns an object that is not a tensor or a plain value (a
            ``transformers`` KV cache: build the model with ``use_cache=False``).
        UnscaledOpsError: (at capture, with ``strict=True``) some ops were left unscaled.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import unit_scale
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    >>> x = torch.randn(512, 256)
    >>> round(model(x).std().item(), 2), round(unit_scale(model)(x).std().item(), 1)
    (0.2, 1.1)
    >>> scaled = unit_scale(model, example_inputs=x)
    >>> scaled.route, round(scaled(x[:64]).std().item(), 1)
    ('fx', 1.1)
    """
    _check_module(module, "unit_scale")
    for name, flag in (("strict", strict), ("check", check)):
        if not isinstance(flag, bool):
            raise InputError(f"unit_scale: {name}={flag!r:.60} is a {type(flag).__name__}; pass True or False")
    replacements = _check_replace(replace)
    _check_route_inputs(example_inputs, route)
    outer, inner, earlier = _unwrap(module)
    _check_batch_norm_momentum(inner)
    # Unit scaling comes first: rounding before it would round values at the original initialisation's scale.
    first_format = next((i for i, t in enumerate(earlier) if isinstance(t, _SimulateFormat)), len(earlier))
    scaling: GraphTransform = _UnitScale(replacements, strict, check)
    transforms = (*earlier[:first_format], scaling, *earlier[first_format:])
    wrapped = TransformedModule.wrap(copy.deepcopy(inner), transforms)
    return _captured(wrapped, outer, example_inputs, example_kwargs, route)


def _check_batch_norm_momentum(module: nn.Module) -> None:
    """Refuse a training batch norm with ``momentum=None``: else the capture fails and blames control flow."""
    for name, m in module.named_modules():
        cumulative = isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is None
        if cumulative and m.training and m.track_running_stats:
            raise InputError(
                f"unit_scale: {name or 'the model'} ({type(m).__name__}) has momentum=None, a cumulative "
                "average of the batch statistics, which unit-scaled batch norm keeps for its first 1 / momentum "
                "batches only; set its momentum to a number (torch's default is 0.1), or call .eval() first"
            )


class _UnitScale(UnitScalePass):
    def __init__(self, replace: Mapping[Any, Callable[..., Any]], strict: bool, check: bool) -> None:
        super().__init__(replace, U.torch_map)
        self.strict = strict
        self.checks_scale = check  # TransformedModule measures the std along each graph it makes

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        gm = super().__call__(gm)
        left = gm.meta["unscaled_ops"]
        if left and self.strict:
            raise UnscaledOpsError(
                f"unit_scale(strict=True) left {len(left)} op(s) unscaled: {'; '.join(left)}. "
                f"Pass replace={{op: unit-scaled function}} for them, or strict=False to accept them"
            )
        if left:
            logger.warning("unit_scale left %d op(s) unscaled: %s", len(left), "; ".join(left))
        return gm


# Matmul-like ops and the positions of their operands (a bias is added in high precision).
_MATMUL_LIKE: dict[Any, tuple[int, ...]] = {
    F.linear: (0, 1), torch.matmul: (0, 1), torch.Tensor.matmul: (0, 1), operator.matmul: (0, 1),
    torch.mm: (0, 1), torch.bmm: (0, 1), F.conv1d: (0, 1), F.conv2d: (0, 1), F.conv3d: (0, 1),
    torch.addmm: (1, 2), torch.Tensor.addmm: (1, 2),
    U.linear: (0, 1), U.matmul: (0, 1), U.conv2d: (0, 1), U.addmm: (1, 2),
    F.scaled_dot_product_attention: (0, 1, 2), U.scaled_dot_product_attention: (0, 1, 2),
}  # fmt: skip


class _SimulateFormat:
    """Quantise the float tensor inputs of matmul-like ops (forward) and their gradients (backward)."""

    __name__ = "simulate_format"

    def __init__(self, fwd_format: FPFormat, bwd_format: FPFormat, caller: str = "simulate_format") -> None:
        self.fwd_format, self.bwd_format, self.caller = fwd_format, bwd_format, caller

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        graph = gm.graph
        fwd, bwd = self.fwd_format._op_args(), self.bwd_format._op_args()
        rounded = 0
        for node in list(graph.nodes):
            if node.op not in ("call_function", "call_method"):
                continue
            positions = [i for i in _lookup(_MATMUL_LIKE, _function_of(node)) or () if i < len(node.args)]
            for arg in dict.fromkeys(a for a in (node.args[i] for i in positions) if isinstance(a, fx.Node)):
                value = arg.meta.get("example_value")
                if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
                    continue
                with graph.inserting_before(node):
                    q = graph.call_function(torch.ops.unitscale.quantise_fwd, (arg, *fwd))
                    q.meta["example_value"] = value
                    q = graph.call_function(torch.ops.unitscale.quantise_bwd, (q, *bwd))
                    q.meta["example_value"] = value
                node.replace_input_with(arg, q)
                rounded += 1
        if not rounded:
            warnings.warn(
                f"{self.caller}: the graph of {type(gm).__name__.removesuffix('Graph')} has no matmul-like op "
                f"(linear, matmul, mm, bmm, addmm, conv1d/2d/3d, scaled_dot_product_attention) with a float "
                f"operand, so nothing was rounded to {self.fwd_format!r} / {self.bwd_format!r}: the model runs "
                f"in full precision as it was",
                NothingQuantisedWarning,
                stacklevel=2,
            )
        graph.lint()
        gm.recompile()
        return gm


def simulate_format(
    module: nn.Module,
    fwd_format: FPFormat,
    bwd_format: FPFormat,
    example_inputs: Any = None,
    example_kwargs: dict[str, Any] | None = None,
    route: str | Sequence[str] = "auto",
) -> TransformedModule:
    """Simulate a number format around every matmul-like op (linear, matmul, conv, attention).

    Each float tensor input of such an op is rounded to ``fwd_format``, and the gradient flowing
    back into it to ``bwd_format``. Parameters are shared with ``module``; nests with :func:`unit_scale`.

    Args:
        example_inputs: capture now, as :func:`apply_transform` does.
        route: the capture routes to try (needs ``example_inputs``).

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        FormatError: a format is not an :class:`~unitscale.formats.FPFormat`.

    Warns:
        NothingQuantisedWarning: (at capture) the graph has no matmul-like op with a float operand.

    >>> import torch
    >>> from unitscale.transforms import simulate_format
    >>> from unitscale.formats import FP16, FP8_E4M3
    >>> model = simulate_format(torch.nn.Linear(1, 1, bias=False), FP8_E4M3, FP16)
    >>> with torch.no_grad():
    ...     _ = model.module.weight.fill_(1.0)
    >>> model(torch.tensor([[0.3]])).item()
    0.3125
    """
    return _simulate(module, fwd_format, bwd_format, example_inputs, example_kwargs, route, "simulate_format")


def _simulate(
    module: nn.Module,
    fwd_format: FPFormat,
    bwd_format: FPFormat,
    example_inputs: Any,
    example_kwargs: dict[str, Any] | None,
    route: str | Sequence[str],
    caller: str,
) -> TransformedModule:
    _check_module(module, caller)
    for name, fmt in (("fwd_format", fwd_format), ("bwd_format", bwd_format)):
        if not isinstance(fmt, FPFormat):
            raise FormatError(f"{caller}: {name}={fmt!r} is not an FPFormat (e.g. unitscale.formats.FP8_E4M3)")
    transform = _SimulateFormat(fwd_format, bwd_format, caller)
    return apply_transform(module, transform, example_inputs, example_kwargs, route)


def simulate_fp8(module: nn.Module) -> TransformedModule:
    """:func:`simulate_format` with FP8 E4M3 forward and E5M2 backward, as FP8 training does.

    >>> import torch
    >>> from unitscale import simulate_fp8
    >>> model = simulate_fp8(torch.nn.Linear(4, 4))
    >>> model(torch.randn(2, 4)).shape
    torch.Size([2, 4])
    """
    return _simulate(module, FP8_E4M3, FP8_E5M2, None, None, "auto", "simulate_fp8")
