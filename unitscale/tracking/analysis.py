"""Scale tracking's entry points: :func:`track_scales`, and :func:`analyse_module`, the same run as annotated code."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from unitscale.capture import DeepTracing, capture, no_kv_cache
from unitscale.errors import InputError, NoRouteError, NotAModuleError, UnitscaleError
from unitscale.fx.module_state import module_state_kept
from unitscale.fx.tracers import check_autowrap
from unitscale.tracking.annotated import AnnotatedCode
from unitscale.tracking.compiled import track_pass
from unitscale.tracking.report import ScaleReport

__all__ = ["analyse_module", "track_scales"]


def _check_inputs(module: nn.Module, inputs: Any, fn: str) -> tuple[Any, ...]:
    name = type(module).__name__
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, tuple):
        raise InputError(
            f"{fn}(inputs=...) must be a torch.Tensor or a tuple/list of the positional inputs of {name}, "
            f"got {type(inputs).__name__}; convert arrays with torch.as_tensor"
        )
    for i, value in enumerate(inputs):
        if type(value).__module__ == "numpy":
            raise InputError(f"{fn}(): inputs[{i}] is a numpy {type(value).__name__}; convert it with torch.as_tensor")
    try:
        inspect.signature(module.forward).bind(*inputs)
    except TypeError as e:
        raise InputError(f"{fn}(): {name}.forward cannot take the {len(inputs)} input(s) given: {e}") from None
    except ValueError:
        pass
    return inputs


#: ``route=`` of :func:`track_scales` -> the routes :func:`unitscale.capture.capture` tries.
_ROUTES = {"auto": ("fx", "eager"), "fx": ("fx",), "export": ("export",), "eager": ("eager",)}


def _track(
    fn: str,
    module: Any,
    inputs: Any,
    backward: Any,
    route: Any,
    recurse_modules: Any,
    autowrap_modules: Any,
    autowrap_functions: Any,
    abs_max: Any,
) -> ScaleReport:
    """:func:`track_scales`, with ``fn`` the name of the function the user called (put before every error's message)."""
    try:
        if not isinstance(module, nn.Module):
            raise NotAModuleError(
                f"{fn}() expects a torch.nn.Module, got {type(module).__name__} {module!r:.60}; "
                "wrap a function in an nn.Module first"
            )
        if not isinstance(route, str) or route not in _ROUTES:
            raise InputError(f"{fn}(route=...) got {route!r:.60}; pass 'auto', 'fx', 'export' or 'eager'")
        for name, flag in (("recurse_modules", recurse_modules), ("abs_max", abs_max)):
            if not isinstance(flag, bool):
                raise InputError(f"{fn}({name}=...) got {type(flag).__name__} {flag!r:.60}; pass True or False")
        inputs = _check_inputs(module, inputs, fn)
        # checked here: a tracer refusing them would otherwise send "auto" to the eager route
        check_autowrap(autowrap_modules, autowrap_functions, caller=fn)
        deep = DeepTracing(recurse_modules, autowrap_modules, tuple(autowrap_functions))
        try:
            cache = not isinstance(module, fx.GraphModule)
            cap = capture(module, inputs, route=_ROUTES[route], deep=deep, check=False, cache=cache)
        except NoRouteError as e:
            if route == "fx":
                e.args = (f"{e.args[0]}\nUse route='auto' (or 'eager') to record the ops as they run.", *e.args[1:])
            raise
        # A caller's no_grad() would leave nothing to backpropagate; a forward that updates its
        # buffers or assigns to its module is undone (the caller's model is only observed); a
        # decoder's KV cache is off, as when it was captured (cap.kv_cache_disabled).
        with torch.enable_grad(), module_state_kept(module, values=True), no_kv_cache(module):
            return track_pass(cap, module, inputs, backward, abs_max)
    except UnitscaleError as e:  # every message starts with the call
        if e.args and isinstance(e.args[0], str) and not e.args[0].startswith(f"{fn}("):
            e.args = (f"{fn}(): {e.args[0]}", *e.args[1:])
        raise


def track_scales(
    module: nn.Module,
    inputs: Any,
    backward: Any = None,
    *,
    route: str = "auto",
    recurse_modules: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
    abs_max: bool = True,
) -> ScaleReport:
    """Run one forward and backward pass and report the scale of every float tensor.

    Args:
        module: the model (a ``GraphModule`` is run as it is, without re-tracing).
        inputs: a tensor, or a tuple/list of the model's positional inputs. As in a
            training step, an input's gradient is computed (and its row gets a backward
            std) only if it requires grad: pass ``x.requires_grad_()`` to see it. A model
            with no trainable parameter has its float inputs differentiated anyway.
        backward: the gradient of the output: a tensor, a tuple/list/dict shaped like
            the output, or ``None`` (1 for a one-element output such as a loss,
            unit-normal noise otherwise).
        route: how the model is captured (:func:`unitscale.capture.capture`, cached per
            module): ``"fx"`` (symbolic trace), ``"eager"`` (record ops as they run),
            ``"export"`` (``torch.export``: aten ops; its first call costs several tracked
            passes) or ``"auto"`` (fx, else eager). A route that would lose part of the
            backward (a custom ``autograd.Function``, a hook, a ``torch.no_grad()`` block)
            is not taken.
        recurse_modules: trace into submodules (``False``: one row per top-level call).
        autowrap_modules: modules whose functions stay single nodes (``None``: ``math``, ``einops``,
            ``unitscale.functional`` and those of :func:`~unitscale.fx.register_autowrap_module`).

    Returns:
        A :class:`ScaleReport`, one row per floating-point tensor in execution order; the
        model's ``.grad`` fields are untouched. Under ``torch.inference_mode()`` no backward
        pass runs: the report says why. A view recorded before the model changes its base in
        place through a view (``x.view(-1).add_(1)``) has no backward std (``n/a``): torch
        sends that gradient through the base.

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        InputError: wrong kind, number or shape of inputs, or an unknown ``route``.
        PredicateError: ``autowrap_modules`` or ``autowrap_functions`` are not tuples of
            modules and functions.
        BackwardShapeError: ``backward`` does not match the output.
        NoFloatOutputError: the model returns no floating-point tensor.
        NoRouteError: ``route="fx"`` or ``"export"`` and that route cannot capture the
            model (a :class:`~unitscale.errors.TraceError`) or would lose part of its backward.

    Every message starts with ``track_scales(``.

    >>> import torch
    >>> from unitscale.tracking import track_scales
    >>> from unitscale.examples import MLP
    >>> _ = torch.manual_seed(0)
    >>> report = track_scales(MLP(16), torch.randn(64, 16))
    >>> report["linear"].module_path, report["linear"].op
    ('fc1', 'linear')
    >>> report["x"].scale  # the input does not require grad: no gradient is computed
    (-> 0.98, <- n/a)
    """
    return _track(
        "track_scales", module, inputs, backward, route, recurse_modules, autowrap_modules, autowrap_functions, abs_max
    )


def analyse_module(
    module: nn.Module,
    inputs: Any,
    backward: Any = None,
    recurse_modules: bool = True,
    syntax_highlight: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
    *,
    route: str = "auto",
) -> AnnotatedCode:
    """The code view of :func:`track_scales`: the model's code, each line with ``(-> forward std, <- backward std)``.

    The same run as :func:`track_scales` (its report's ``code``), with Graphcore's
    ``unit_scaling.utils.analyse_module`` signature. A model ``torch.fx`` cannot trace gets
    a listing of its ops as they ran instead.

    Args:
        syntax_highlight: highlight with pygments (terminal and notebook).
        inputs, backward, recurse_modules, autowrap_modules, autowrap_functions, route: as in
            :func:`track_scales` (an input's backward std is shown where it requires grad).

    Raises:
        NotAModuleError, InputError, PredicateError, BackwardShapeError, NoFloatOutputError,
        NoRouteError: as :func:`track_scales`; every message starts with ``analyse_module(``.

    >>> import torch
    >>> from unitscale.tracking import analyse_module
    >>> from unitscale.examples import MLP
    >>> _ = torch.manual_seed(0)
    >>> model = MLP(256)
    >>> x = torch.randn(512, 256).requires_grad_()  # to see the input's gradient too
    >>> analyse_module(model, x, torch.randn(512, 256))  # doctest: +ELLIPSIS
    def forward(self, x):  # x (-> 0.999, <- 0.235)
        fc1_weight = self.fc1.weight  # (-> 0.0361, <- 4.61)
        fc1_bias = self.fc1.bias  # (-> 0.0363, <- 4.38)
        linear = torch._C._nn.linear(x, fc1_weight, fc1_bias)  # (-> 0.578, <- 0.204)
        relu = torch.nn.functional.relu(linear, ...)  # (-> 0.337, <- 0.288)
        fc2_weight = self.fc2.weight  # (-> 0.018, <- 9.01)
        fc2_bias = self.fc2.bias  # (-> 0.0182, <- 21.1)
        linear_1 = torch._C._nn.linear(relu, fc2_weight, ...)  # (-> 0.236, <- 0.998)
        return linear_1
    """
    if not isinstance(syntax_highlight, bool):
        raise InputError(
            f"analyse_module(syntax_highlight=...) got {type(syntax_highlight).__name__} "
            f"{syntax_highlight!r:.60}; pass True or False"
        )
    report = _track(
        "analyse_module", module, inputs, backward, route, recurse_modules, autowrap_modules, autowrap_functions, False
    )
    return AnnotatedCode(report.code, highlight=syntax_highlight)
