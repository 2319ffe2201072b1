"""Bad inputs over the whole public API: each raises a typed error that says what it got.

Every case names the call, the :mod:`unitscale.errors` type it must raise and the words of
the message that matter (the argument, the value given, what is accepted). Calls that take
a module are made on a fresh model whose state is compared afterwards: parameters and
buffers bitwise equal, hooks and attributes as they were, the training flag unchanged, no
``Proxy`` left behind, and ``state_dict()`` still saves.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

import unitscale.functional as U
import unitscale.nn as unn
from unitscale import (
    ScaleReport,
    analyse_module,
    inline,
    invert,
    partition,
    run_pipeline,
    simulate_fp8,
    track_scales,
    unit_scale,
)
from unitscale.capture import trace_exec_order
from unitscale.errors import (
    BackwardShapeError,
    CaptureError,
    ConfigError,
    CostError,
    FormatError,
    InputError,
    MonitorSettingError,
    NodeNotFoundError,
    NoFloatOutputError,
    NoRecordsError,
    NotAModuleError,
    NotCallableError,
    NotInvertibleError,
    PipelineError,
    PredicateError,
    ReplaceMapError,
    ScaleValueError,
    StageCountError,
    TraceError,
    TransformError,
    UnitscaleError,
    UnknownConstraintError,
    UnknownScheduleError,
    UnknownStatError,
)
from unitscale.examples import MLP, MarkovSource, TinyGPT, resnet18
from unitscale.formats import FP8_E4M3, FP16, FPFormat
from unitscale.fx import (
    DeepTracer,
    ExecOrderTracer,
    LeafTracer,
    ModulePathTracer,
    TaggingTracer,
    fx_exec_order,
    register_inverse,
)
from unitscale.scaling import amean, gmean, hmean, to_grad_input_scale, to_output_scale
from unitscale.stages import bubble_fraction
from unitscale.tracking import ScaleMonitor, ScalePair, ScaleTracker
from unitscale.tracking.report import ScaleRow
from unitscale.transforms import apply_transform, simulate_format

NAN, INF = math.nan, math.inf


# -- models whose state is checked after each failing call ------------------------------------


class Probe(nn.Module):
    """Assigns to itself in forward: a buffer update and a stored activation."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        y = self.lin(x)
        self.last = y
        return y


class Branchy(Probe):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        y = self.lin(x)
        self.last = y
        if y.sum() > 0:
            return y
        return -y


class ItemShape(nn.Module):
    """Uses a tensor as a Python number."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(int(x.shape[0].item()))


class IntOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).argmax(-1)


class Widths(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class InPlaceParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a.weight.add_(1)
        return self.a(x)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "probe": Probe,
    "branchy": Branchy,
    "item": ItemShape,
    "intout": IntOut,
    "widths": Widths,
    "inplace": InPlaceParam,
    "mlp": lambda: MLP(4),
    "seq": lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)),
}


class Snapshot(NamedTuple):
    tensors: dict[str, torch.Tensor]
    training: list[bool]
    attrs: list[list[str]]
    hooks: list[list[tuple[str, list[int]]]]


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks")


def snapshot(model: nn.Module) -> Snapshot:
    return Snapshot(
        {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        [m.training for m in model.modules()],
        [sorted(vars(m)) for m in model.modules()],
        [[(h, list(getattr(m, h, {}))) for h in _HOOKS] for m in model.modules()],
    )


def assert_unchanged(model: nn.Module, before: Snapshot) -> None:
    after = snapshot(model)
    assert after.tensors.keys() == before.tensors.keys()
    for name, t in before.tensors.items():
        now = after.tensors[name]
        assert now.dtype == t.dtype and now.shape == t.shape, name
        assert torch.equal(now.view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), f"{name} changed"
    assert after.training == before.training
    assert after.attrs == before.attrs
    assert after.hooks == before.hooks
    for m in model.modules():
        assert not any(isinstance(v, fx.Proxy) for v in vars(m).values())
        assert not any(isinstance(v, fx.Proxy) for v in m._buffers.values())
    torch.save(model.state_dict(), io.BytesIO())


# -- the cases --------------------------------------------------------------------------------

X = torch.randn(4, 4)


def _plan() -> Any:
    return partition(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)), 2, X)


def _report(forward: float = 1.0) -> ScaleReport:
    return ScaleReport([ScaleRow("x", "", "input", (2,), "float32", forward, 1.0, 1.0)], "Net")


def _raise(*args: Any) -> Any:
    raise ValueError("boom")


def _none(gm: fx.GraphModule) -> None:
    return None


def _cost(value: Any) -> Callable[[fx.Node], Any]:
    return lambda node: value


class Case(NamedTuple):
    call: Callable[[], Any]
    error: type[UnitscaleError]
    words: tuple[str, ...]


class ModelCase(NamedTuple):
    model: str
    call: Callable[[nn.Module], Any]
    error: type[UnitscaleError]
    words: tuple[str, ...]


CASES: dict[str, Case] = {
    # constraints
    "gmean-zero": Case(lambda: gmean(0, 1), ScaleValueError, ("gmean", "output_scale=0.0", "finite number > 0")),
    "gmean-negative": Case(lambda: gmean(-1, 1), ScaleValueError, ("output_scale=-1.0", "> 0")),
    "gmean-nan": Case(lambda: gmean(NAN, 1), ScaleValueError, ("output_scale=nan",)),
    "gmean-inf": Case(lambda: gmean(INF, 1), ScaleValueError, ("output_scale=inf",)),
    "gmean-str": Case(lambda: gmean("a", 1), ScaleValueError, ("output_scale='a'", "str")),
    "gmean-bool": Case(lambda: gmean(True, 1), ScaleValueError, ("output_scale=True", "bool")),
    "gmean-grad-zero": Case(lambda: gmean(1, 0), ScaleValueError, ("grad_input_scale=0.0",)),
    "gmean-third-zero": Case(lambda: gmean(1, 1, 0), ScaleValueError, ("grad_input_scale #2=0.0",)),
    "hmean-zero": Case(lambda: hmean(0, 1), ScaleValueError, ("hmean", "output_scale=0.0")),
    "hmean-negative-grad": Case(lambda: hmean(1, -2), ScaleValueError, ("grad_input_scale=-2.0",)),
    "hmean-nan": Case(lambda: hmean(NAN, 1), ScaleValueError, ("output_scale=nan",)),
    "amean-nan": Case(lambda: amean(NAN, 1), ScaleValueError, ("amean", "output_scale=nan")),
    "amean-inf-grad": Case(lambda: amean(1, INF), ScaleValueError, ("grad_input_scale=inf",)),
    "amean-none": Case(lambda: amean(None, 1), ScaleValueError, ("output_scale=None", "NoneType")),
    "to_output_scale-zero": Case(
        lambda: to_output_scale(0, 1), ScaleValueError, ("to_output_scale", "output_scale=0.0")
    ),
    "to_output_scale-str-grad": Case(lambda: to_output_scale(1, "x"), ScaleValueError, ("grad_input_scale='x'",)),
    "to_grad_input_scale-zero": Case(
        lambda: to_grad_input_scale(1, 0), ScaleValueError, ("to_grad_input_scale", "grad_input_scale=0.0")
    ),
    "to_grad_input_scale-nan-third": Case(
        lambda: to_grad_input_scale(1, 1, NAN), ScaleValueError, ("grad_input_scale #2=nan",)
    ),
    "constraint-unknown-name": Case(
        lambda: U.linear(X, torch.randn(4, 4), constraint="geomean"),
        UnknownConstraintError,
        ("unknown constraint 'geomean'", "'gmean'"),
    ),
    "constraint-int": Case(lambda: U.gelu(X, constraint=3), UnknownConstraintError, ("not int 3", "or None")),
    # formats
    "fpformat-exponent-9": Case(lambda: FPFormat(9, 2), FormatError, ("exponent_bits=9", "2..8")),
    "fpformat-exponent-1": Case(lambda: FPFormat(1, 2), FormatError, ("exponent_bits=1", "2..8")),
    "fpformat-mantissa-24": Case(lambda: FPFormat(4, 24), FormatError, ("mantissa_bits=24", "0..23")),
    "fpformat-mantissa-negative": Case(lambda: FPFormat(4, -1), FormatError, ("mantissa_bits=-1",)),
    "fpformat-float-bits": Case(lambda: FPFormat(4.0, 3), FormatError, ("exponent_bits=4.0", "must be an int")),
    "fpformat-str-bits": Case(lambda: FPFormat("4", 3), FormatError, ("exponent_bits='4'", "must be an int")),
    "fpformat-bool-bits": Case(lambda: FPFormat(True, 3), FormatError, ("exponent_bits=True", "must be an int")),
    "fpformat-rounding-up": Case(
        lambda: FPFormat(4, 3, rounding="up"), FormatError, ("rounding='up'", "'nearest' or 'stochastic'")
    ),
    "fpformat-rounding-none": Case(lambda: FPFormat(4, 3, rounding=None), FormatError, ("rounding=None",)),  # type: ignore[arg-type]
    "fpformat-saturate-str": Case(
        lambda: FPFormat(4, 3, saturate="no"), FormatError, ("saturate='no'", "True or False")
    ),  # type: ignore[arg-type]
    "fpformat-saturate-int": Case(lambda: FPFormat(4, 3, saturate=1), FormatError, ("saturate=1", "True or False")),  # type: ignore[arg-type]
    "fpformat-infinities-str": Case(lambda: FPFormat(4, 3, infinities="yes"), FormatError, ("infinities='yes'",)),  # type: ignore[arg-type]
    "fpformat-fn-no-mantissa": Case(
        lambda: FPFormat(4, 0, infinities=False), FormatError, ("infinities=False needs mantissa_bits >= 1",)
    ),
    "fpformat-round-int-tensor": Case(
        lambda: FP8_E4M3.round(torch.arange(3)), FormatError, ("floating-point", "torch.int64")
    ),
    "fpformat-replace-bad": Case(lambda: FP8_E4M3.replace(exponent_bits=0), FormatError, ("exponent_bits=0",)),
    "report-plot-unknown-format": Case(
        lambda: _report().plot(formats=("FP4",)), FormatError, ("formats=", "'FP4'", "'FP16'")
    ),
    "report-plot-format-str": Case(
        lambda: _report().plot(formats="FP16"), FormatError, ("formats=", "str", "tuple of names")
    ),  # type: ignore[arg-type]
    "report-plot-format-int": Case(lambda: _report().plot(formats=5), FormatError, ("formats=", "int")),  # type: ignore[arg-type]
    "report-unknown-node": Case(lambda: _report()["nope"], NodeNotFoundError, ("no tensor named 'nope'", "x")),
    # tracers
    "leaftracer-leaf-types-class": Case(
        lambda: LeafTracer(leaf_types=nn.Linear), NotAModuleError, ("leaf_types=", "tuple of module classes")
    ),  # type: ignore[arg-type]
    "leaftracer-leaf-types-int": Case(
        lambda: LeafTracer(leaf_types=(int,)), NotAModuleError, ("leaf_types=", "<class 'int'>", "nn.Module subclass")
    ),  # type: ignore[arg-type]
    "leaftracer-leaf-types-str": Case(
        lambda: LeafTracer(leaf_types=("Linear",)), NotAModuleError, ("'Linear'", "nn.Module subclass")
    ),  # type: ignore[arg-type]
    "leaftracer-trace-types-class": Case(
        lambda: LeafTracer(trace_types=nn.ReLU), NotAModuleError, ("trace_types=", "tuple")
    ),  # type: ignore[arg-type]
    "leaftracer-trace-types-int": Case(lambda: LeafTracer(trace_types=(3,)), NotAModuleError, ("trace_types=", "3")),  # type: ignore[arg-type]
    "leaftracer-is-leaf-int": Case(lambda: LeafTracer(is_leaf=3), PredicateError, ("is_leaf=", "int 3")),  # type: ignore[arg-type]
    "leaftracer-is-leaf-raises": Case(
        lambda: LeafTracer(is_leaf=_raise).trace(MLP(4)),
        PredicateError,
        ("is_leaf predicate raised ValueError: boom", "module"),
    ),
    "leaftracer-is-leaf-str": Case(
        lambda: LeafTracer(is_leaf=lambda m, n: "yes").trace(MLP(4)), PredicateError, ("returned 'yes'", "True (leaf)")
    ),
    "taggingtracer-tag-fn-int": Case(lambda: TaggingTracer(tag_fn=5), PredicateError, ("tag_fn=", "int 5")),  # type: ignore[arg-type]
    "taggingtracer-tag-fn-raises": Case(
        lambda: TaggingTracer(tag_fn=_raise).trace(MLP(4)), PredicateError, ("tag_fn raised ValueError: boom", "node")
    ),
    "deeptracer-autowrap-modules-str": Case(
        lambda: DeepTracer(autowrap_modules="math"), PredicateError, ("autowrap_modules=", "str 'math'", "tuple")
    ),  # type: ignore[arg-type]
    "deeptracer-autowrap-modules-names": Case(
        lambda: DeepTracer(autowrap_modules=("math",)),
        PredicateError,
        ("autowrap_modules=", "'math'", "imported Python modules"),
    ),  # type: ignore[arg-type]
    "deeptracer-autowrap-modules-function": Case(
        lambda: DeepTracer(autowrap_modules=(len,)), PredicateError, ("autowrap_modules=", "len", "modules")
    ),  # type: ignore[arg-type]
    "deeptracer-autowrap-functions-str": Case(
        lambda: DeepTracer(autowrap_functions=("relu",)),
        PredicateError,
        ("autowrap_functions=", "'relu'", "Python functions"),
    ),  # type: ignore[arg-type]
    "deeptracer-autowrap-functions-bare": Case(
        lambda: DeepTracer(autowrap_functions=_raise), PredicateError, ("autowrap_functions=", "function", "tuple")
    ),  # type: ignore[arg-type]
    "deeptracer-autowrap-functions-builtin": Case(
        lambda: DeepTracer(autowrap_functions=(len,)), PredicateError, ("autowrap_functions=", "len", "not builtins")
    ),
    "deeptracer-trace-int": Case(
        lambda: DeepTracer().trace(5), NotAModuleError, ("DeepTracer.trace got int 5", "nn.Module")
    ),  # type: ignore[arg-type]
    "deeptracer-recurse-modules-str": Case(
        lambda: DeepTracer(recurse_modules="yes"),  # type: ignore[arg-type]
        InputError,
        ("DeepTracer(recurse_modules=...) got str 'yes'", "True", "False"),
    ),
    "leaftracer-positional-int": Case(
        lambda: LeafTracer(42), PredicateError, ("LeafTracer(autowrap_modules=...) got int 42", "tuple")
    ),
    "modulepathtracer-unknown-keyword": Case(
        lambda: ModulePathTracer(leaf_types=(nn.ReLU,)),
        InputError,
        ("ModulePathTracer() got arguments it does not take", "leaf_types", "by keyword"),
    ),
    "execordertracer-positional-str": Case(
        lambda: ExecOrderTracer("math"), PredicateError, ("ExecOrderTracer(autowrap_modules=...) got str 'math'",)
    ),
    "taggingtracer-key-list": Case(
        lambda: TaggingTracer(key=[]),  # type: ignore[arg-type]
        InputError,
        ("TaggingTracer(key=...) got list []", "str"),
    ),
    "fx-exec-order-int": Case(lambda: fx_exec_order(5), NotAModuleError, ("fx_exec_order() got int 5",)),  # type: ignore[arg-type]
    "deeptracer-trace-str": Case(lambda: DeepTracer().trace("model"), NotAModuleError, ("got str", "nn.Module")),  # type: ignore[arg-type]
    "modulepathtracer-trace-none": Case(
        lambda: ModulePathTracer().trace(None), NotAModuleError, ("ModulePathTracer.trace got NoneType",)
    ),  # type: ignore[arg-type]
    "execordertracer-function": Case(
        lambda: ExecOrderTracer().trace(_raise), NotAModuleError, ("ExecOrderTracer.trace got function", "nn.Module")
    ),
    "trace-exec-order-int": Case(lambda: trace_exec_order(5), NotAModuleError, ("got int 5",)),  # type: ignore[arg-type]
    # inline / invert
    "inline-int": Case(lambda: inline(5), NotAModuleError, ("inline() got int 5", "nn.Module")),  # type: ignore[arg-type]
    "inline-predicate-int": Case(lambda: inline(MLP(4), 3), PredicateError, ("predicate=", "int 3")),  # type: ignore[arg-type]
    "inline-predicate-raises": Case(
        lambda: inline(MLP(4), _raise), PredicateError, ("inline predicate raised ValueError: boom",)
    ),
    "inline-predicate-str": Case(
        lambda: inline(MLP(4), lambda m, n: "yes"), PredicateError, ("returned 'yes'", "True or False")
    ),
    "invert-int": Case(lambda: invert(5), NotAModuleError, ("5",)),  # type: ignore[arg-type]
    "invert-relu": Case(lambda: invert(lambda x: torch.relu(x)), NotInvertibleError, ("cannot invert node 'relu'",)),
    "invert-times-zero": Case(lambda: invert(lambda x: x * 0), NotInvertibleError, ("0", "loses the input")),
    "invert-times-zero-tensor": Case(
        lambda: invert(lambda x: x * torch.zeros(())),
        NotInvertibleError,
        ("node 'mul'", "multiplies by a tensor holding 0", "loses the input"),
    ),
    "invert-times-a-tensor-with-a-zero": Case(
        lambda: invert(lambda x: x * torch.tensor([1.0, 0.0])),
        NotInvertibleError,
        ("node 'mul'", "holding 0 (1 of 2 elements)"),
    ),
    "invert-times-nan": Case(
        lambda: invert(lambda x: x * NAN), NotInvertibleError, ("node 'mul'", "is nan", "would return NaN")
    ),
    "invert-times-inf": Case(
        lambda: invert(lambda x: x * INF), NotInvertibleError, ("node 'mul'", "is inf", "would return NaN")
    ),
    "invert-plus-inf-tensor": Case(
        lambda: invert(lambda x: x + torch.full((2,), INF)),
        NotInvertibleError,
        ("node 'add'", "2 NaN or infinite value(s) of 2"),
    ),
    "invert-divided-by-inf": Case(lambda: invert(lambda x: x / INF), NotInvertibleError, ("node 'truediv'", "is inf")),
    "invert-constant-output": Case(
        lambda: invert(lambda x: torch.ones(3)), NotInvertibleError, ("does not depend on its input",)
    ),
    "register-inverse-int": Case(lambda: register_inverse(5, torch.exp), NotCallableError, ("5",)),  # type: ignore[arg-type]
    "register-inverse-int-inverse": Case(lambda: register_inverse(torch.log, 5), NotCallableError, ("5",)),  # type: ignore[arg-type]
    # scale tracking without a module
    "track-scales-int": Case(
        lambda: track_scales(5, X), NotAModuleError, ("track_scales() expects a torch.nn.Module", "got int")
    ),  # type: ignore[arg-type]
    "analyse-module-function": Case(
        lambda: analyse_module(_raise, X), NotAModuleError, ("expects a torch.nn.Module", "function")
    ),  # type: ignore[arg-type]
    "analyse-module-str": Case(
        lambda: analyse_module("mlp", X), NotAModuleError, ("analyse_module() expects", "got str")
    ),  # type: ignore[arg-type]
    # functional ops
    "U-softmax-dim-none": Case(lambda: U.softmax(X, dim=None), InputError, ("softmax: dim=None", "dim=-1")),  # type: ignore[arg-type]
    "U-dropout-p-above-1": Case(lambda: U.dropout(X, p=1.5), InputError, ("dropout", "p=1.5", "[0, 1]")),
    "U-dropout-p-negative": Case(lambda: U.dropout(X, p=-0.1), InputError, ("p=-0.1", "probability")),
    "U-dropout-p-str": Case(lambda: U.dropout(X, p="half"), InputError, ("p='half'",)),  # type: ignore[arg-type]
    "U-residual-split-tau-2": Case(lambda: U.residual_split(X, tau=2.0), InputError, ("residual_split", "tau=2.0")),
    "U-residual-add-tau-negative": Case(
        lambda: U.residual_add(X, X, tau=-1.0), InputError, ("residual_add", "tau=-1.0")
    ),
    "U-sdpa-dropout-1": Case(
        lambda: U.scaled_dot_product_attention(X[None], X[None], X[None], dropout_p=1.0),
        InputError,
        ("dropout_p=1", "below 1"),
    ),
    "U-matmul-constraint-name": Case(lambda: U.matmul(X, X, constraint="mean"), UnknownConstraintError, ("'mean'",)),
    "U-add-constraint-list": Case(lambda: U.add(X, X, constraint=["gmean"]), UnknownConstraintError, ("list",)),  # type: ignore[arg-type]
    "U-gelu-constraint-raises": Case(
        lambda: U.gelu(X.requires_grad_(), constraint=_raise), PredicateError, ("constraint", "ValueError: boom")
    ),
    "U-gelu-constraint-str-result": Case(
        lambda: U.gelu(X.requires_grad_(), constraint=lambda *s: "1"), PredicateError, ("constraint", "'1'")
    ),
    "U-linear-constraint-zero-result": Case(
        lambda: U.linear(X, torch.randn(4, 4), constraint=lambda *s: 0.0), PredicateError, ("constraint", "0.0")
    ),
    "U-scale-nan": Case(lambda: U.scale(X, NAN, 1.0), InputError, ("scale: fwd_scale=nan", "finite number")),
    "U-scale-str": Case(lambda: U.scale(X, 1.0, "a"), InputError, ("bwd_scale='a'",)),
    "U-scale-inf": Case(lambda: U.scale(X, INF, INF), InputError, ("fwd_scale=inf",)),
    "U-linear-str-input": Case(
        lambda: U.linear("x", torch.randn(4, 4)), InputError, ("linear: input is a str", "tensor")
    ),
    "U-linear-widths": Case(
        lambda: U.linear(X, torch.randn(3, 5)), InputError, ("(4, 4)", "weight of shape (3, 5)", "last size")
    ),
    "U-matmul-widths": Case(
        lambda: U.matmul(X, torch.randn(3, 5)), InputError, ("matmul", "other of shape (3, 5)", "second-to-last")
    ),
    "U-matmul-scalar": Case(lambda: U.matmul(X, torch.tensor(2.0)), InputError, ("matmul", "shape ()")),
    "U-gelu-approximate": Case(
        lambda: U.gelu(X, approximate="fast"), InputError, ("gelu: approximate='fast'", "'none' or 'tanh'")
    ),
    "U-softmax-dim-str": Case(lambda: U.softmax(X, dim="last"), InputError, ("softmax: dim='last'", "int")),  # type: ignore[arg-type]
    "U-dropout-training-str": Case(
        lambda: U.dropout(X, 0.5, training="yes"), InputError, ("training='yes'", "True or False")
    ),  # type: ignore[arg-type]
    "U-residual-split-tau-str": Case(lambda: U.residual_split(X, tau="a"), InputError, ("tau='a'", "between 0 and 1")),  # type: ignore[arg-type]
    "U-residual-split-tau-nan": Case(lambda: U.residual_split(X, tau=NAN), InputError, ("tau=nan",)),
    # nn modules
    "unn-linear-negative": Case(lambda: unn.Linear(-1, 4), InputError, ("Linear: in_features=-1", "int >= 0")),
    "unn-linear-float": Case(lambda: unn.Linear(4, 2.5), InputError, ("out_features=2.5",)),  # type: ignore[arg-type]
    "unn-embedding-negative": Case(lambda: unn.Embedding(-1, 4), InputError, ("Embedding: num_embeddings=-1",)),
    "unn-gelu-approximate": Case(lambda: unn.GELU(approximate="fast"), InputError, ("GELU: approximate='fast'",)),
    "unn-softmax-dim-str": Case(lambda: unn.Softmax(dim="a"), InputError, ("Softmax: dim='a'",)),  # type: ignore[arg-type]
    "unn-mhsa-str-size": Case(lambda: unn.MHSA("8", 2), InputError, ("MHSA: hidden_size='8'",)),  # type: ignore[arg-type]
    "unn-dropout-str": Case(lambda: unn.Dropout(p="a"), InputError, ("Dropout: p='a'", "probability")),  # type: ignore[arg-type]
    # scale records and reports
    "scalepair-str": Case(
        lambda: ScalePair("a", 1.0), InputError, ("ScalePair(forward=...) got str 'a'", "float or None")
    ),  # type: ignore[arg-type]
    "scalepair-bool-backward": Case(lambda: ScalePair(1.0, True), InputError, ("backward=", "bool")),
    "scaletracker-record-str": Case(
        lambda: ScaleTracker.apply(X, "record"), InputError, ("ScaleTracker.apply", "str", "ScaleRecord()")
    ),
    "report-plot-ax-int": Case(lambda: _report().plot(ax=5), InputError, ("plot(ax=...) got int 5", "Axes")),  # type: ignore[arg-type]
    "trace-exec-order-concrete-args": Case(
        lambda: trace_exec_order(MLP(4), concrete_args=5), InputError, ("concrete_args=", "int 5", "dict")
    ),  # type: ignore[arg-type]
    "unn-linear-constraint": Case(lambda: unn.Linear(4, 4, constraint="bogus"), UnknownConstraintError, ("'bogus'",)),
    "U-embedding-weight-1d": Case(
        lambda: U.embedding(torch.tensor([1, 2]), torch.randn(10)),
        InputError,
        ("embedding: input=(2,) int64, weight=(10,) float32 do not fit", "weight is 2-D (vocab, dim)", "must be 2-D"),
    ),
    "U-embedding-float-indices": Case(
        lambda: U.embedding(X[0], X), InputError, ("embedding: input=(4,) float32", "integer indices")
    ),
    "U-embedding-index-out-of-range": Case(
        lambda: U.embedding(torch.tensor([12]), X), InputError, ("weight=(4, 4) float32", "below weight.shape[0]")
    ),
    "U-cross-entropy-batch": Case(
        lambda: U.cross_entropy(torch.randn(4, 5), torch.randint(0, 5, (3,))),
        InputError,
        ("cross_entropy: input=(4, 5) float32, target=(3,) int64 do not fit", "(batch, classes, ...)", "batch_size"),
    ),
    "U-cross-entropy-0d": Case(
        lambda: U.cross_entropy(torch.tensor(1.0), torch.tensor(0)), InputError, ("input=() float32", "(classes,)")
    ),
    "U-layer-norm-shape": Case(
        lambda: U.layer_norm(X, (5,)),
        InputError,
        ("layer_norm: input=(4, 4) float32, normalized_shape=(5,) do not fit", "trailing dims must equal"),
    ),
    "U-layer-norm-weight": Case(
        lambda: U.layer_norm(X, (4,), torch.ones(3)), InputError, ("weight=(3,) float32", "weight and bias")
    ),
    "U-sdpa-head-dims": Case(
        lambda: U.scaled_dot_product_attention(X[None], torch.randn(1, 4, 6), X[None]),
        InputError,
        ("scaled_dot_product_attention: query=(1, 4, 4) float32, key=(1, 4, 6) float32", "key (..., S, E)"),
    ),
    "U-sdpa-1d": Case(
        lambda: U.scaled_dot_product_attention(X[0], X[0], X[0]), InputError, ("query=(4,) float32", "(..., L, E)")
    ),
    "unn-gelu-constraint": Case(lambda: unn.GELU(constraint=3), UnknownConstraintError, ("int 3",)),  # type: ignore[arg-type]
    "unn-softmax-constraint": Case(lambda: unn.Softmax(-1, constraint="x"), UnknownConstraintError, ("'x'",)),
    "unn-dropout-p-2": Case(lambda: unn.Dropout(p=2.0), InputError, ("p=2.0", "[0, 1]")),
    "unn-mhsa-heads": Case(lambda: unn.MHSA(10, 3), InputError, ("MHSA", "10", "3")),
    "unn-mhsa-dropout-1": Case(lambda: unn.MHSA(8, 2, dropout_p=1.0), InputError, ("dropout_p=1", "below 1")),
    "unn-transformer-heads": Case(lambda: unn.TransformerLayer(10, 3), InputError, ("10", "3")),
    "unn-mlp-constraint": Case(lambda: unn.MLP(4, constraint="nope"), UnknownConstraintError, ("'nope'",)),
    # transforms without a module
    "unit-scale-int": Case(lambda: unit_scale(5), NotAModuleError, ("unit_scale: expected an nn.Module", "int")),  # type: ignore[arg-type]
    "unit-scale-replace-int": Case(
        lambda: unit_scale(MLP(4), replace=5), ReplaceMapError, ("replace must be a mapping", "int")
    ),  # type: ignore[arg-type]
    "unit-scale-replace-key": Case(
        lambda: unit_scale(MLP(4), replace={1: torch.relu}), ReplaceMapError, ("replace key 1 is not callable",)
    ),  # type: ignore[dict-item]
    "unit-scale-replace-value": Case(
        lambda: unit_scale(MLP(4), replace={torch.relu: 5}), ReplaceMapError, ("replace['relu'] = 5 is not callable",)
    ),  # type: ignore[dict-item]
    "unit-scale-strict-str": Case(
        lambda: unit_scale(MLP(4), strict="yes"), InputError, ("unit_scale: strict='yes' is a str", "True or False")
    ),  # type: ignore[arg-type]
    "simulate-format-str": Case(
        lambda: simulate_format(MLP(4), "fp8", FP16), FormatError, ("fwd_format='fp8'", "not an FPFormat")
    ),  # type: ignore[arg-type]
    "simulate-format-bwd-int": Case(lambda: simulate_format(MLP(4), FP16, 5), FormatError, ("bwd_format=5",)),  # type: ignore[arg-type]
    "simulate-fp8-int": Case(
        lambda: simulate_fp8(5),  # type: ignore[arg-type]
        NotAModuleError,
        ("simulate_fp8: expected an nn.Module", "int"),
    ),
    "simulate-format-int": Case(
        lambda: simulate_format(5, FP8_E4M3, FP16),  # type: ignore[arg-type]
        NotAModuleError,
        ("simulate_format: expected an nn.Module", "int"),
    ),
    "apply-transform-int": Case(
        lambda: apply_transform(5, _none), NotAModuleError, ("apply_transform: expected an nn.Module", "int")
    ),  # type: ignore[arg-type]
    "apply-transform-not-callable": Case(
        lambda: apply_transform(MLP(4), 5), NotCallableError, ("transform must be callable", "5")
    ),  # type: ignore[arg-type]
    # partition
    "partition-int": Case(lambda: partition(5, 2, X), NotAModuleError, ("partition() needs a torch.nn.Module", "int")),  # type: ignore[arg-type]
    "partition-stages-zero": Case(lambda: partition(MLP(4), 0, X), StageCountError, ("num_stages=0", "int >= 1")),
    "partition-stages-negative": Case(lambda: partition(MLP(4), -1, X), StageCountError, ("num_stages=-1",)),
    "partition-stages-float": Case(lambda: partition(MLP(4), 2.5, X), StageCountError, ("num_stages=2.5",)),  # type: ignore[arg-type]
    "partition-stages-str": Case(lambda: partition(MLP(4), "2", X), StageCountError, ("num_stages='2'",)),  # type: ignore[arg-type]
    "partition-stages-bool": Case(lambda: partition(MLP(4), True, X), StageCountError, ("num_stages=True",)),  # type: ignore[arg-type]
    "partition-stages-too-many": Case(lambda: partition(MLP(4), 50, X), StageCountError, ("num_stages=50", "pieces")),
    "partition-cost-unknown": Case(
        lambda: partition(MLP(4), 2, X, cost="weight"), CostError, ("unknown cost model 'weight'", "'params'")
    ),
    "partition-cost-str-value": Case(
        lambda: partition(MLP(4), 2, X, cost=_cost("3")), CostError, ("returned '3'", "not a number")
    ),
    "partition-cost-none-value": Case(
        lambda: partition(MLP(4), 2, X, cost=_cost(None)), CostError, ("returned None", "not a number")
    ),
    "partition-cost-nan": Case(
        lambda: partition(MLP(4), 2, X, cost=_cost(NAN)), CostError, ("returned nan", "finite and >= 0")
    ),
    "partition-cost-negative": Case(lambda: partition(MLP(4), 2, X, cost=_cost(-1.0)), CostError, ("returned -1.0",)),
    "partition-cost-inf": Case(lambda: partition(MLP(4), 2, X, cost=_cost(INF)), CostError, ("returned inf", "finite")),
    "partition-cost-huge-sum": Case(
        lambda: partition(MLP(4), 2, X, cost=_cost(1e308)), CostError, ("sum to more than a float holds",)
    ),
    "partition-cost-raises": Case(
        lambda: partition(MLP(4), 2, X, cost=_raise), CostError, ("cost callable raised ValueError: boom",)
    ),
    "partition-cost-bool": Case(
        lambda: partition(MLP(4), 2, X, cost=_cost(True)), CostError, ("returned True", "not a number")
    ),
    "partition-method-unknown": Case(
        lambda: partition(MLP(4), 2, X, method="greedy"), CostError, ("unknown method 'greedy'",)
    ),
    "partition-repeats-negative": Case(
        lambda: partition(MLP(4), 2, X, cost="time", repeats=-1), CostError, ("repeats=-1", "int >= 1", "cost='time'")
    ),
    "partition-repeats-float": Case(lambda: partition(MLP(4), 2, X, repeats=2.5), CostError, ("repeats=2.5",)),  # type: ignore[arg-type]
    "bubble-fraction-zero-stages": Case(
        lambda: bubble_fraction(0, 1), StageCountError, ("bubble_fraction: num_stages=0", "int >= 1")
    ),
    "bubble-fraction-zero-microbatches": Case(
        lambda: bubble_fraction(2, 0), InputError, ("bubble_fraction: num_microbatches=0", "int >= 1")
    ),
    "bubble-fraction-float-stages": Case(lambda: bubble_fraction(2.0, 4), StageCountError, ("num_stages=2.0",)),  # type: ignore[arg-type]
    "partition-boundary-depth-zero": Case(
        lambda: partition(MLP(4), 2, X, boundary_depth=0), StageCountError, ("boundary_depth=0",)
    ),
    "partition-inputs-count": Case(
        lambda: partition(MLP(4), 2, (X, X)), InputError, ("MLP.forward(x)", "cannot take 2 positional input(s)")
    ),
    "partition-untraceable": Case(
        lambda: partition(Branchy(), 1, X),
        TraceError,
        ("no route could capture Branchy", "fx: TraceError", "symbolically traced", "export:"),
    ),
    # run_pipeline (refused before any worker starts)
    "pipeline-plan-int": Case(lambda: run_pipeline(5, X, 2), InputError, ("plan=", "int", "StagePlan")),  # type: ignore[arg-type]
    "pipeline-timeout-zero": Case(
        lambda: run_pipeline(_plan(), X, 2, timeout=0),
        InputError,
        ("timeout=", "got 0", "finite number of seconds > 0"),
    ),
    "pipeline-timeout-negative": Case(lambda: run_pipeline(_plan(), X, 2, timeout=-1), InputError, ("got -1",)),
    "pipeline-timeout-nan": Case(lambda: run_pipeline(_plan(), X, 2, timeout=NAN), InputError, ("got nan",)),
    "pipeline-timeout-inf": Case(lambda: run_pipeline(_plan(), X, 2, timeout=INF), InputError, ("got inf",)),
    "pipeline-timeout-str": Case(lambda: run_pipeline(_plan(), X, 2, timeout="60"), InputError, ("got '60'",)),  # type: ignore[arg-type]
    "pipeline-microbatches-zero": Case(
        lambda: run_pipeline(_plan(), X, 0), InputError, ("num_microbatches=0", "int >= 1")
    ),
    "pipeline-microbatches-str": Case(lambda: run_pipeline(_plan(), X, "2"), InputError, ("num_microbatches='2'",)),  # type: ignore[arg-type]
    "pipeline-microbatches-bool": Case(lambda: run_pipeline(_plan(), X, True), InputError, ("num_microbatches=True",)),  # type: ignore[arg-type]
    "pipeline-microbatches-more-than-batch": Case(
        lambda: run_pipeline(_plan(), X, 8), InputError, ("batch size 4", "fewer than num_microbatches=8")
    ),
    "pipeline-microbatches-uneven": Case(
        lambda: run_pipeline(_plan(), torch.randn(5, 4), 2), InputError, ("batch size 5", "does not divide", "[1, 5]")
    ),
    "pipeline-inputs-str": Case(
        lambda: run_pipeline(_plan(), "x", 1), InputError, ("pipeline input 0 is a str", "tensor inputs")
    ),
    "pipeline-inputs-empty": Case(lambda: run_pipeline(_plan(), (), 1), InputError, ("no inputs",)),
    "pipeline-inputs-scalar": Case(lambda: run_pipeline(_plan(), torch.tensor(1.0), 1), InputError, ("batch size 0",)),
    "pipeline-inputs-mismatched": Case(
        lambda: run_pipeline(_plan(), (X, torch.randn(6, 4)), 2),
        InputError,
        ("input 1 has batch size 6", "input 0 has 4"),
    ),
    "pipeline-schedule": Case(
        lambda: run_pipeline(_plan(), X, 2, schedule="zb"), UnknownScheduleError, ("unknown schedule 'zb'", "'gpipe'")
    ),
    "pipeline-target-without-loss": Case(
        lambda: run_pipeline(_plan(), X, 2, target=X), InputError, ("pass both loss_fn and target",)
    ),  # type: ignore[call-overload]
    "pipeline-loss-without-target": Case(
        lambda: run_pipeline(_plan(), X, 2, loss_fn=nn.MSELoss()), InputError, ("pass both loss_fn and target",)
    ),  # type: ignore[call-overload]
    "pipeline-target-batch": Case(
        lambda: run_pipeline(_plan(), X, 2, loss_fn=nn.MSELoss(), target=torch.randn(6, 4)),
        InputError,
        ("target=", "batch size 6", "the inputs have 4"),
    ),
    "pipeline-target-list": Case(
        lambda: run_pipeline(_plan(), X, 2, loss_fn=nn.MSELoss(), target=[1, 2]), InputError, ("target=", "list")
    ),  # type: ignore[arg-type]
    "pipeline-loss-int": Case(
        lambda: run_pipeline(_plan(), X, 2, loss_fn=5, target=X), InputError, ("loss_fn=", "int 5", "callable")
    ),  # type: ignore[arg-type]
    "pipeline-loss-lambda": Case(
        lambda: run_pipeline(_plan(), X, 2, loss_fn=lambda o, t: o.sum(), target=X),
        PipelineError,
        ("loss_fn cannot be pickled",),
    ),
    "stageplan-verify-bad-inputs": Case(
        lambda: _plan().verify(torch.randn(4, 3)), InputError, ("verify() could not run",)
    ),
    # examples
    "tinygpt-heads": Case(
        lambda: TinyGPT(d_model=10, n_heads=3), ConfigError, ("TinyGPT", "d_model=10", "n_heads=3", "[1, 2, 5, 10]")
    ),
    "tinygpt-vocab-zero": Case(lambda: TinyGPT(vocab_size=0), ConfigError, ("vocab_size=0", "int >= 1")),
    "tinygpt-layers-negative": Case(lambda: TinyGPT(n_layers=-1), ConfigError, ("n_layers=-1", "int >= 0")),
    "tinygpt-seq-len-str": Case(lambda: TinyGPT(seq_len="8"), ConfigError, ("seq_len='8'", "str")),  # type: ignore[arg-type]
    "tinygpt-d-model-float": Case(lambda: TinyGPT(d_model=16.0), ConfigError, ("d_model=16.0", "float")),  # type: ignore[arg-type]
    "mlp-d-zero": Case(lambda: MLP(0), ConfigError, ("MLP", "d=0", "int >= 1")),
    "mlp-hidden-zero": Case(lambda: MLP(4, hidden=0), ConfigError, ("hidden=0",)),
    "mlp-d-out-str": Case(lambda: MLP(4, d_out="2"), ConfigError, ("d_out='2'",)),  # type: ignore[arg-type]
    "mlp-activation-str": Case(lambda: MLP(4, activation="relu"), ConfigError, ("activation='relu'", "nn.GELU()")),  # type: ignore[arg-type]
    "resnet18-classes-zero": Case(lambda: resnet18(num_classes=0), ConfigError, ("num_classes=0", "int >= 1")),
    "resnet18-width-float": Case(lambda: resnet18(width=8.5), ConfigError, ("width=8.5",)),  # type: ignore[arg-type]
    "markov-vocab-1": Case(lambda: MarkovSource(vocab_size=1), ConfigError, ("vocab_size=1", "2..256")),
    "markov-vocab-huge": Case(lambda: MarkovSource(vocab_size=10**6), ConfigError, ("vocab_size=1000000", "2..256")),
    "markov-vocab-bool": Case(lambda: MarkovSource(vocab_size=True), ConfigError, ("vocab_size=True", "bool")),  # type: ignore[arg-type]
    "markov-concentration-zero": Case(
        lambda: MarkovSource(concentration=0), ConfigError, ("concentration=0", "finite number > 0")
    ),
    "markov-concentration-nan": Case(lambda: MarkovSource(concentration=NAN), ConfigError, ("concentration=nan",)),
    "markov-concentration-inf": Case(lambda: MarkovSource(concentration=INF), ConfigError, ("concentration=inf",)),
    "markov-concentration-str": Case(lambda: MarkovSource(concentration="a"), ConfigError, ("concentration='a'",)),  # type: ignore[arg-type]
    "markov-seed-negative": Case(lambda: MarkovSource(seed=-1), ConfigError, ("seed=-1", "int >= 0")),
    "markov-sample-batch-zero": Case(lambda: MarkovSource(4).sample(0, 8), ConfigError, ("batch=0", "int >= 1")),
    "markov-sample-seq-len-1": Case(lambda: MarkovSource(4).sample(2, 1), ConfigError, ("seq_len=1", "int >= 2")),
    "markov-sample-generator": Case(
        lambda: MarkovSource(4).sample(2, 4, generator=5), ConfigError, ("generator=5", "torch.Generator")
    ),  # type: ignore[arg-type]
    "markov-loss-floor-seq-len": Case(lambda: MarkovSource(4).loss_floor(1), ConfigError, ("seq_len=1", "int >= 2")),
}

MODEL_CASES: dict[str, ModelCase] = {
    # a scale monitor that cannot watch, or has nothing to show, leaves the model unhooked
    "scalemonitor-every-zero": ModelCase(
        "probe", lambda m: ScaleMonitor(m, every=0), MonitorSettingError, ("every=0", "int >= 1")
    ),
    "scalemonitor-heatmap-before-records": ModelCase(
        "probe", lambda m: ScaleMonitor(m).heatmap(), NoRecordsError, ("nothing recorded", "step % every == 0")
    ),
    "scalemonitor-heatmap-unknown-stat": ModelCase(
        "probe", lambda m: ScaleMonitor(m).heatmap(stat="mean"), UnknownStatError, ("stat='mean'", "std, absmax")
    ),
    # tracers and execution order on models that cannot be traced
    "deeptracer-untraceable": ModelCase(
        "branchy", lambda m: DeepTracer().trace(m), TraceError, ("could not trace Branchy", "control flow")
    ),
    "deeptracer-item": ModelCase(
        "item",
        lambda m: DeepTracer().trace(m),
        TraceError,
        ("could not trace ItemShape at", "test_adversarial.py", "int(x.shape[0].item())", "Python value"),
    ),
    "leaftracer-untraceable": ModelCase(
        "branchy", lambda m: LeafTracer().trace(m), TraceError, ("could not trace Branchy",)
    ),
    "modulepathtracer-item": ModelCase(
        "item", lambda m: ModulePathTracer().trace(m), TraceError, ("could not trace ItemShape",)
    ),
    "trace-exec-order-untraceable": ModelCase("branchy", trace_exec_order, TraceError, ("could not trace Branchy",)),
    "trace-exec-order-item": ModelCase("item", trace_exec_order, TraceError, ("could not trace ItemShape",)),
    "inline-untraceable": ModelCase("branchy", inline, TraceError, ("could not trace Branchy",)),
    "inline-item": ModelCase("item", inline, TraceError, ("could not trace ItemShape",)),
    "inline-example-inputs-tensor": ModelCase(
        "probe",
        lambda m: inline(m, example_inputs=X),
        InputError,
        ("example_inputs=", "tensor of shape (4, 4)", "e.g. example_inputs=(x,)"),
    ),  # type: ignore[arg-type]
    "inline-example-inputs-str": ModelCase(
        "probe", lambda m: inline(m, example_inputs="abc"), InputError, ("example_inputs=", "str 'abc'")
    ),  # type: ignore[arg-type]
    "inline-example-inputs-int": ModelCase(
        "probe", lambda m: inline(m, example_inputs=5), InputError, ("example_inputs=", "int 5")
    ),  # type: ignore[arg-type]
    "inline-example-inputs-shape": ModelCase(
        "probe",
        lambda m: inline(m, example_inputs=(torch.randn(2, 3),)),
        InputError,
        ("example_inputs=", "Probe fails on inputs of shape ((2, 3))", "mat1 and mat2"),
    ),
    "inline-example-inputs-count": ModelCase(
        "probe", lambda m: inline(m, example_inputs=(X, X)), InputError, ("example_inputs=", "TypeError")
    ),
    "inline-predicate-raises-on-probe": ModelCase(
        "probe", lambda m: inline(m, _raise), PredicateError, ("inline predicate raised ValueError: boom",)
    ),
    "leaftracer-is-leaf-raises-on-probe": ModelCase(
        "probe", lambda m: LeafTracer(is_leaf=_raise).trace(m), PredicateError, ("is_leaf predicate raised",)
    ),
    "taggingtracer-raises-on-probe": ModelCase(
        "probe", lambda m: TaggingTracer(tag_fn=_raise).trace(m), PredicateError, ("tag_fn raised",)
    ),
    # scale tracking
    "track-scales-inputs-str": ModelCase(
        "probe",
        lambda m: track_scales(m, "x"),
        InputError,
        ("track_scales(inputs=...) must be a torch.Tensor", "got str"),
    ),
    "track-scales-inputs-numpy": ModelCase(
        "probe",
        lambda m: track_scales(m, (np.ones((4, 4)),)),
        InputError,
        ("inputs[0] is a numpy ndarray", "torch.as_tensor"),
    ),
    "track-scales-inputs-count": ModelCase(
        "probe", lambda m: track_scales(m, (X, X)), InputError, ("Probe.forward cannot take the 2 input(s)",)
    ),
    "track-scales-inputs-shape": ModelCase(
        "probe",
        lambda m: track_scales(m, torch.randn(2, 3)),
        InputError,
        ("Probe failed at node", "(2, 3)", "shapes and dtypes"),
    ),
    "track-scales-eager-shape": ModelCase(
        "branchy", lambda m: track_scales(m, torch.randn(2, 3)), InputError, ("Branchy failed at", "(2, 3)")
    ),
    "track-scales-backward-shape": ModelCase(
        "probe", lambda m: track_scales(m, X, torch.randn(3)), BackwardShapeError, ("(3,)", "(4, 4)")
    ),
    "track-scales-backward-str": ModelCase("probe", lambda m: track_scales(m, X, "ones"), BackwardShapeError, ("str",)),
    "track-scales-abs-max-str": ModelCase(
        "probe", lambda m: track_scales(m, X, abs_max="yes"), InputError, ("abs_max=", "str 'yes'", "True or False")
    ),  # type: ignore[arg-type]
    "track-scales-recurse-int": ModelCase(
        "probe", lambda m: track_scales(m, X, recurse_modules=1), InputError, ("recurse_modules=", "int 1")
    ),  # type: ignore[arg-type]
    "track-scales-autowrap-str": ModelCase(
        "probe",
        lambda m: track_scales(m, X, autowrap_modules=("math",)),
        PredicateError,
        ("autowrap_modules=", "'math'"),
    ),  # type: ignore[arg-type]
    "analyse-module-highlight-str": ModelCase(
        "probe", lambda m: analyse_module(m, X, syntax_highlight="no"), InputError, ("syntax_highlight=", "str 'no'")
    ),  # type: ignore[arg-type]
    "deeptracer-concrete-args-list": ModelCase(
        "probe",
        lambda m: DeepTracer().trace(m, concrete_args=[1]),
        InputError,
        ("DeepTracer.trace(concrete_args=...) got list",),
    ),  # type: ignore[arg-type]
    "track-scales-capture": ModelCase(
        "probe",
        lambda m: track_scales(m, X, route="jit"),
        InputError,
        ("track_scales(route=...) got 'jit'", "'auto', 'fx', 'export' or 'eager'"),
    ),
    "track-scales-int-output": ModelCase("intout", lambda m: track_scales(m, X), NoFloatOutputError, ("IntOut",)),
    "track-scales-fx-untraceable": ModelCase(
        "branchy",
        lambda m: track_scales(m, X, route="fx"),
        TraceError,
        ("could not trace Branchy at", "if y.sum() > 0:", "route='auto'"),
    ),
    "track-scales-inplace-parameter": ModelCase(
        "inplace", lambda m: track_scales(m, X), InputError, ("in-place", "torch.no_grad()")
    ),
    "analyse-module-fx-untraceable": ModelCase(
        "branchy",
        lambda m: analyse_module(m, X, route="fx"),
        TraceError,
        ("analyse_module(): ", "could not trace Branchy"),
    ),
    "analyse-module-shape": ModelCase(
        "probe", lambda m: analyse_module(m, torch.randn(2, 3)), InputError, ("Probe failed", "(2, 3)")
    ),
    "analyse-module-backward": ModelCase(
        "mlp", lambda m: analyse_module(m, X, torch.randn(2)), BackwardShapeError, ("(2,)",)
    ),
    # transforms (the failure comes on the first call, when TorchDynamo captures)
    "apply-transform-returns-none": ModelCase(
        "mlp",
        lambda m: apply_transform(m, _none)(X),
        TransformError,
        ("'_none' returned NoneType None", "not an fx.GraphModule", "return gm"),
    ),
    "apply-transform-raises": ModelCase(
        "mlp", lambda m: apply_transform(m, _raise)(X), TransformError, ("'_raise' raised ValueError: boom", "MLP")
    ),
    "unit-scale-widths": ModelCase(
        "widths",
        lambda m: unit_scale(m)(X),
        CaptureError,
        ("Widths.forward fails at", "test_adversarial.py", "same reduction dim", "widths"),
    ),
    "unit-scale-inplace-parameter": ModelCase(
        "inplace",
        lambda m: unit_scale(m)(X),
        CaptureError,
        ("InPlaceParam.forward fails", "in-place", "torch.no_grad()"),
    ),
    "unit-scale-inputs-shape": ModelCase(
        "seq", lambda m: unit_scale(m)(torch.randn(2, 3)), CaptureError, ("Sequential.forward fails", "shapes")
    ),
    "simulate-fp8-shape": ModelCase("seq", lambda m: simulate_fp8(m)(torch.randn(2, 3)), CaptureError, ("fails",)),
    # partition on a model
    "partition-example-inputs-shape": ModelCase(
        "seq",
        lambda m: partition(m, 2, torch.randn(2, 3)),
        InputError,
        ("Sequential failed on the example inputs ((2, 3))", "mat1 and mat2"),
    ),
    "partition-probe-untraceable": ModelCase(
        "branchy", lambda m: partition(m, 2, X), TraceError, ("could not trace Branchy",)
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_raises_a_typed_error_naming_it(case: Case) -> None:
    with pytest.raises(case.error) as info:
        case.call()
    assert isinstance(info.value, UnitscaleError)
    message = str(info.value)
    for words in case.words:
        assert words in message, f"{words!r} not in {message!r}"


@pytest.mark.parametrize("case", list(MODEL_CASES.values()), ids=list(MODEL_CASES))
def test_bad_input_with_a_module_leaves_the_module_as_it_was(case: ModelCase) -> None:
    torch.manual_seed(0)
    model = MODELS[case.model]()
    model.train(False)  # a flag a tool might flip
    # the user's own hook stays: one on a parameter's gradient, which every route keeps (a module
    # hook makes fx and inline refuse the model, tests/capture/test_faithful.py)
    # (ItemShape has no parameter: it gets none)
    param = next(model.parameters(), None)
    handle = param.register_hook(lambda g: None) if param is not None else None
    before = snapshot(model)
    with pytest.raises(case.error) as info:
        case.call(model)
    message = str(info.value)
    for words in case.words:
        assert words in message, f"{words!r} not in {message!r}"
    assert_unchanged(model, before)
    if handle is not None:
        handle.remove()


# -- hypothesis: where inputs vary --------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    e=st.integers(-5, 20),
    m=st.integers(-5, 30),
    inf=st.booleans(),
    saturate=st.sampled_from([True, False, 0, 1, "no", None]),
)
def test_fpformat_accepts_exactly_the_valid_formats(e: int, m: int, inf: bool, saturate: Any) -> None:
    valid = 2 <= e <= 8 and 0 <= m <= 23 and isinstance(saturate, bool) and (inf or m >= 1)
    if valid:
        fmt = FPFormat(e, m, infinities=inf, saturate=saturate)
        assert fmt.max_value > fmt.min_normal > 0
    else:
        with pytest.raises(FormatError, match=r"^FPFormat: "):
            FPFormat(e, m, infinities=inf, saturate=saturate)


scales = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.sampled_from(["1", None, True])
)


@settings(max_examples=100, deadline=None)
@given(out=scales, grad=scales)
def test_constraints_return_a_finite_positive_scale_or_refuse(out: Any, grad: Any) -> None:
    def ok(s: Any) -> bool:
        return not isinstance(s, (bool, str)) and s is not None and 0 < s < math.inf

    for constraint in (gmean, hmean, amean, to_output_scale, to_grad_input_scale):
        if ok(out) and ok(grad):
            value = constraint(out, grad)
            assert 0 < value < math.inf or value == 0.0 and min(out, grad) < 1e-300  # underflow of a tiny mean
        else:
            with pytest.raises(ScaleValueError, match=rf"^{constraint.__name__}: .*(finite number > 0|pass a)"):
                constraint(out, grad)


@settings(max_examples=30, deadline=None)
@given(timeout=st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf)))
def test_pipeline_timeouts_that_are_not_positive_and_finite_are_refused(timeout: float) -> None:
    with pytest.raises(InputError, match=r"^run_pipeline\(timeout=\.\.\.\) got"):
        run_pipeline(PLAN, X, 2, timeout=timeout)


PLAN = _plan()


# Each call gives a number where the model (or plan) goes. The error must name the function the
# user called, not a helper it delegates to (``simulate_fp8`` once blamed ``apply_transform``).
NAMED_CALLS: dict[str, Callable[[], Any]] = {
    "track_scales": lambda: track_scales(42, X),  # type: ignore[arg-type]
    "analyse_module": lambda: analyse_module(42, X),  # type: ignore[arg-type]
    "unit_scale": lambda: unit_scale(42),  # type: ignore[arg-type]
    "simulate_fp8": lambda: simulate_fp8(42),  # type: ignore[arg-type]
    "simulate_format": lambda: simulate_format(42, FP8_E4M3, FP16),  # type: ignore[arg-type]
    "apply_transform": lambda: apply_transform(42, _none),  # type: ignore[arg-type]
    "partition": lambda: partition(42, 2, X),  # type: ignore[arg-type]
    "run_pipeline": lambda: run_pipeline(42, X, 2),  # type: ignore[arg-type]
    "inline": lambda: inline(42),  # type: ignore[arg-type]
    "invert": lambda: invert(42),  # type: ignore[arg-type]
    "fx_exec_order": lambda: fx_exec_order(42),  # type: ignore[arg-type]
    "trace_exec_order": lambda: trace_exec_order(42),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", list(NAMED_CALLS))
def test_a_number_given_for_the_model_is_refused_in_the_name_of_the_function_called(name: str) -> None:
    with pytest.raises(UnitscaleError) as info:
        NAMED_CALLS[name]()
    assert str(info.value).startswith(name), str(info.value)
