"""A cached trace run as compiled code records what the interpreter records: rows, numbers, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale import track_scales
from unitscale.errors import InputError
from unitscale.examples import MLP, TinyGPT, resnet18
from unitscale.fx.trace_cache import clear_trace_cache, trace_for_scales
from unitscale.tracking import analysis
from unitscale.tracking.compiled import _instrumented, _steps, compiled_tracking


class Views(nn.Module):
    """Chains of views (one record per chain), a view of a tensor with other users, a dtype view."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = h.view(-1, 2, 4).transpose(1, 2).reshape(-1, 8)  # h's only user is a view
        b = h.flatten()  # h2 has two users: b, and the sum below
        h2 = torch.relu(h)
        c = h2.view(-1) * 2
        return a.sum() + b.sum() + c.sum() + h2.sum() + h2.view(torch.int32).float().mean()


def _interpreted(model: nn.Module, inputs: object, abs_max: bool = True) -> list[tuple]:
    """The rows ``track_scales`` gives through the fx interpreter (the route before compiled code)."""
    compiled = analysis._capture_compiled
    analysis._capture_compiled = lambda m, t, i, a: analysis._capture_fx(m, t.graph, i + t.extra_inputs, a)
    try:
        torch.manual_seed(1)  # the same unit-normal output gradient in both runs
        return list(track_scales(model, inputs, abs_max=abs_max).rows)
    finally:
        analysis._capture_compiled = compiled


def _compiled_rows(model: nn.Module, inputs: object, abs_max: bool = True) -> list[tuple]:
    trace = trace_for_scales(model)
    assert compiled_tracking(model, trace) is not None
    torch.manual_seed(1)
    return list(track_scales(model, inputs, abs_max=abs_max).rows)


def _same(expected: list[tuple], got: list[tuple]) -> None:
    assert [r[:5] for r in got] == [r[:5] for r in expected]  # node, path, op, shape, dtype
    for e, g in zip(expected, got, strict=True):
        for a, b in zip(e[5:8], g[5:8], strict=True):
            assert (a is None) == (b is None), (e, g)
            if a is not None:
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b)), (e, g)


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: MLP(8), (4, 8)),
        (lambda: Views(), (4, 8)),
        (lambda: resnet18(num_classes=3, width=8), (2, 3, 16, 16)),
    ],
    ids=["MLP", "Views", "resnet18"],
)
def test_compiled_rows_equal_the_interpreters(build, shape) -> None:
    torch.manual_seed(0)
    model = build()
    x = torch.randn(shape)
    expected = _interpreted(model, x)
    _same(expected, _compiled_rows(model, x))


def test_compiled_rows_equal_the_interpreters_on_tiny_gpt() -> None:
    torch.manual_seed(0)
    model = TinyGPT(32, 16, 1, 2, 8)
    ids = torch.randint(0, 32, (2, 8))
    expected = _interpreted(model, ids, abs_max=False)
    got = _compiled_rows(model, ids, abs_max=False)
    _same(expected, got)
    assert len(got) > 40


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 6), st.floats(-3, 3), st.booleans())
def test_compiled_views_share_records_as_the_interpreter_does(batch: int, shift: float, abs_max: bool) -> None:
    model = Views()
    x = torch.randn(batch, 8) + shift
    grad = None  # a scalar output: gradient 1, the same in both runs
    expected = _interpreted(model, x, abs_max)
    got = _compiled_rows(model, x, abs_max)
    _same(expected, got)
    assert track_scales(model, x, grad).scales == track_scales(model, x, grad).scales


def test_a_parameter_replaced_after_compiling_is_the_one_read() -> None:
    model = MLP(4)
    x = torch.randn(8, 4)
    _compiled_rows(model, x)
    with torch.no_grad():
        model.fc1.weight = nn.Parameter(torch.full((16, 4), 3.0))  # a new object; the trace is still valid
    report = track_scales(model, x)
    assert report["fc1_weight"].scale.forward == 0.0
    assert report["fc1_weight"].abs_max == 3.0


def test_a_failure_in_compiled_code_names_the_node() -> None:
    model = MLP(4)
    _compiled_rows(model, torch.randn(2, 4))
    with pytest.raises(
        InputError,
        match=r"MLP failed at node 'linear' \(call_function linear\) on inputs of shape \(2, 5\): "
        r"mat1 and mat2 shapes cannot be multiplied \(2x5 and 4x16\)\. Check that the inputs have the shapes",
    ):
        track_scales(model, torch.randn(2, 5))
    # and the hooks of the failed run are gone: the next run is as before
    x = torch.randn(2, 4)
    expected = _interpreted(model, x)
    torch.manual_seed(1)
    _same(expected, list(track_scales(model, x).rows))


def test_code_not_as_fx_writes_it_is_left_to_the_interpreter() -> None:
    model = MLP(4)
    trace = trace_for_scales(model)
    nodes = [n for n in trace.graph.nodes if n.op != "output"]
    steps = _steps(model, nodes)
    assert _instrumented(trace.code, nodes, steps) is not None
    assert _instrumented(trace.code.replace("def forward(self", "def run(self"), nodes, steps) is None
    assert _instrumented(trace.code.replace("relu = ", "relu_x = "), nodes, steps) is None


def test_a_trace_is_compiled_once() -> None:
    clear_trace_cache()
    model = MLP(4)
    trace = trace_for_scales(model)
    program = compiled_tracking(model, trace)
    assert program is not None and compiled_tracking(model, trace) is program
    clear_trace_cache()
    assert compiled_tracking(model, trace_for_scales(model)) is not program  # a new trace, compiled again


def apply_fn(fn, x: torch.Tensor) -> torch.Tensor:
    return fn(x) * 2


class Applies(nn.Module):
    """Passes a function to an autowrapped function: the trace makes it an extra placeholder."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_fn(torch.tanh, self.fc(x))


def test_a_function_argument_is_passed_to_compiled_code_as_the_interpreter_passes_it() -> None:
    model = Applies()
    x = torch.randn(3, 4)
    trace = trace_for_scales(model, autowrap_functions=(apply_fn,))
    assert trace.extra_inputs == (torch.tanh,)
    compiled = analysis._capture_compiled
    analysis._capture_compiled = lambda m, t, i, a: analysis._capture_fx(m, t.graph, i + t.extra_inputs, a)
    try:
        torch.manual_seed(1)
        expected = list(track_scales(model, x, autowrap_functions=(apply_fn,)).rows)
    finally:
        analysis._capture_compiled = compiled
    assert compiled_tracking(model, trace) is not None
    torch.manual_seed(1)
    got = list(track_scales(model, x, autowrap_functions=(apply_fn,)).rows)
    _same(expected, got)
    assert got[-1].op == "apply_fn" and got[-1].forward is not None and got[-1].backward is not None


def test_an_exported_graph_runs_compiled_with_the_interpreters_rows() -> None:
    torch.manual_seed(0)
    model = Views()
    x = torch.randn(4, 8)
    compiled = analysis._capture_compiled
    analysis._capture_compiled = lambda m, t, i, a: analysis._capture_fx(m, t.graph, i + t.extra_inputs, a)
    try:
        expected = track_scales(model, x, capture="export")
    finally:
        analysis._capture_compiled = compiled
    gm = analysis._exported_graph(model, (x,))
    assert compiled_tracking(gm, analysis._exported_trace(gm)) is not None
    got = track_scales(model, x, capture="export")
    _same(list(expected.rows), list(got.rows))
    assert got.code == expected.code and got.capture == "export"
    assert analysis._exported_trace(gm) is analysis._exported_trace(gm)  # the code is written once
