"""Every error scale tracking raises names the function the user called, and is typed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

from unitscale.errors import (
    BackwardShapeError,
    BackwardValueError,
    InputError,
    NoFloatOutputError,
    NotAModuleError,
    PredicateError,
    TraceError,
    UnitscaleError,
)
from unitscale.examples.models import MLP
from unitscale.tracking import ScaleTrackingInterpreter, analyse_module, track_scales

ENTRY_POINTS: dict[str, Callable[..., Any]] = {"track_scales": track_scales, "analyse_module": analyse_module}


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


class IntOut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)


X = torch.randn(2, 4)
BAD_CALLS: dict[str, tuple[Callable[[Callable[..., Any]], Any], type[UnitscaleError]]] = {
    "not-a-module": (lambda f: f(42, X), NotAModuleError),
    "inputs-str": (lambda f: f(MLP(4), "x"), InputError),
    "inputs-too-many": (lambda f: f(MLP(4), (X, X)), InputError),
    "inputs-wrong-shape": (lambda f: f(MLP(4), torch.randn(2, 5)), InputError),
    "route-unknown": (lambda f: f(MLP(4), X, route="jit"), InputError),
    "recurse-not-bool": (lambda f: f(MLP(4), X, recurse_modules=1), InputError),
    "autowrap-str": (lambda f: f(MLP(4), X, autowrap_modules="math"), PredicateError),
    "route-fx-untraceable": (lambda f: f(Branchy(), X, route="fx"), TraceError),
    "backward-shape": (lambda f: f(MLP(4), X, torch.randn(3, 4)), BackwardShapeError),
    "backward-meta": (lambda f: f(MLP(4), X, torch.empty(2, 4, device="meta")), BackwardValueError),
    "int-output": (lambda f: f(IntOut(), X), NoFloatOutputError),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS), ids=list(ENTRY_POINTS))
@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_every_error_is_typed_and_starts_with_the_function_called(entry: str, case: str) -> None:
    call, kind = BAD_CALLS[case]
    with pytest.raises(kind) as info:
        call(ENTRY_POINTS[entry])
    message = str(info.value)
    assert message.startswith(f"{entry}("), message
    other = {"track_scales": "analyse_module", "analyse_module": "track_scales"}[entry]
    assert f"{other}(" not in message, message


def test_a_meta_gradient_says_what_to_pass() -> None:
    with pytest.raises(BackwardValueError, match=r"backward for output is a tensor on the meta device.*on cpu"):
        track_scales(MLP(4), X, torch.empty(2, 4, device="meta"))


@pytest.mark.parametrize(
    "args, kind, words",
    [
        ((42,), NotAModuleError, "ScaleTrackingInterpreter() got int 42"),
        ((MLP(4),), NotAModuleError, "which has no graph; pass a GraphModule"),
        ((fx.symbolic_trace(MLP(4)), "graph"), InputError, "ScaleTrackingInterpreter(graph=...) got str"),
    ],
    ids=["int", "module-without-graph", "graph-str"],
)
def test_the_interpreter_refuses_what_it_cannot_run(args: tuple[Any, ...], kind: type[Exception], words: str) -> None:
    with pytest.raises(kind) as info:
        ScaleTrackingInterpreter(*args)
    assert words in str(info.value)
