"""A cached capture runs as compiled code: every row is torch's own std of the tensor and of its gradient.

The oracle runs the same captured graph under a plain :class:`torch.fx.Interpreter` (no
unitscale code), keeps every floating-point node output, takes its ``torch.std(correction=0)`` in float64,
and gets every gradient from :func:`torch.autograd.grad` with the same output gradient.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from unitscale.capture import DeepTracing, capture, clear_capture_cache
from unitscale.errors import InputError
from unitscale.examples.models import MLP, TinyGPT
from unitscale.tracking import stats, track_scales
from unitscale.tracking.compiled import _instrumented, compiled_tracking, graph_steps


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


def apply_fn(fn: Any, x: torch.Tensor) -> torch.Tensor:
    return fn(x) * 2


class Applies(nn.Module):
    """Passes a function to an autowrapped function: the trace makes it an extra placeholder."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_fn(torch.tanh, self.fc(x))


def _std(t: torch.Tensor) -> float:
    return t.detach().double().std(correction=0).item()


def _oracle(gm: fx.GraphModule, inputs: tuple[Any, ...], grad: torch.Tensor) -> dict[str, tuple[float, float | None]]:
    """``node -> (std, gradient's std or None)`` from torch alone: a plain interpreter and ``autograd.grad``."""
    kept: dict[str, torch.Tensor] = {}
    forward: dict[str, float] = {}

    class Keep(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if n.op != "output" and isinstance(out, torch.Tensor) and out.is_floating_point():
                kept[n.name], forward[n.name] = out, _std(out)  # the std as the node made it
            return out

    with torch.enable_grad():
        out = Keep(gm).run(*inputs)
        names = [name for name, t in kept.items() if t.requires_grad]
        grads = torch.autograd.grad(out, [kept[n] for n in names], grad, allow_unused=True)
    backward = {n: None if g is None else _std(g) for n, g in zip(names, grads, strict=True)}
    return {name: (std, backward.get(name)) for name, std in forward.items()}


def _check_rows(report: Any, expected: dict[str, tuple[float, float | None]]) -> None:
    assert [row.node for row in report] == list(expected)
    for row in report:
        fwd, bwd = expected[row.node]
        assert row.forward == pytest.approx(fwd, rel=1e-4, abs=1e-7), row
        if bwd is None:
            assert row.backward is None, row
        else:
            assert row.backward == pytest.approx(bwd, rel=1e-4, abs=1e-7), row


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().requires_grad_() if x.is_floating_point() else x


@pytest.mark.parametrize(
    "build, make_input",
    [
        (lambda: MLP(8), lambda: torch.randn(4, 8)),
        (Views, lambda: torch.randn(4, 8)),
        (lambda: TinyGPT(32, 16, 1, 2, 8), lambda: torch.randint(0, 32, (2, 8))),
        # forward(self, input): fx renames the input (input_1 = input), a line of its own
        (lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), lambda: torch.randn(4, 8)),
    ],
    ids=["MLP", "Views", "TinyGPT", "Sequential"],
)
def test_every_row_of_the_compiled_run_is_torchs_std_of_the_tensor_and_its_gradient(build, make_input) -> None:
    torch.manual_seed(0)
    model, x = build(), make_input()
    cap = capture(model, (x,), deep=DeepTracing(), check=False)
    out = model(x)
    grad = torch.randn_like(out) if out.numel() > 1 else torch.ones_like(out)
    expected = _oracle(cap.graph_module, (x,), grad)
    for _ in range(2):  # the first call compiles the code, the second runs the cached one
        _check_rows(track_scales(model, x, grad), expected)
    cached = capture(model, (x,), deep=DeepTracing(), check=False, cache=True)
    assert compiled_tracking(model, cached) is not None  # the rows above came from compiled code
    if x.is_floating_point():  # an input that requires grad gets its gradient's row too
        expected_leaf = _oracle(cap.graph_module, (_leaf(x),), grad)
        _check_rows(track_scales(model, _leaf(x), grad), expected_leaf)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 6), st.floats(-3, 3), st.integers(0, 2**31 - 1))
def test_views_share_records_and_keep_torchs_numbers(batch: int, shift: float, seed: int) -> None:
    torch.manual_seed(seed)  # the weights and the input: a failure replays with the same numbers
    model = Views()
    x = torch.randn(batch, 8) + shift
    expected = _oracle(
        fx.GraphModule(model, capture(model, x, deep=DeepTracing()).graph_module.graph), (x,), torch.ones(())
    )
    _check_rows(track_scales(model, x), expected)  # a scalar output: gradient 1


def test_a_view_chain_by_hand() -> None:
    class Chain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2).view(1, 2).reshape(2)

    x = torch.tensor([1.0, -1.0], requires_grad=True)
    report = track_scales(Chain(), x, torch.tensor([1.0, -1.0]))
    # x = (1, -1): std 1 (about the mean 0); y = 2x: std 2; dL/dy = (1, -1): std 1; dL/dx = (2, -2): std 2
    assert [(row.node, row.forward, row.backward) for row in report] == [
        ("x", pytest.approx(1.0), pytest.approx(2.0)),
        ("mul", pytest.approx(2.0), pytest.approx(1.0)),
        ("view", pytest.approx(2.0), pytest.approx(1.0)),
        ("reshape", pytest.approx(2.0), pytest.approx(1.0)),
    ]


def test_a_parameter_replaced_after_compiling_is_the_one_read() -> None:
    model = MLP(4)
    x = torch.randn(8, 4)
    track_scales(model, x)
    with torch.no_grad():
        model.fc1.weight = nn.Parameter(torch.full((16, 4), 3.0))  # a new object; the capture is still valid
    report = track_scales(model, x)
    assert report["fc1_weight"].scale.forward == 0.0
    assert report["fc1_weight"].abs_max == 3.0


def test_a_failure_in_compiled_code_names_the_node_and_leaves_no_hook() -> None:
    model = MLP(4)
    track_scales(model, torch.randn(2, 4))
    with pytest.raises(
        InputError,
        match=r"MLP failed at node 'linear' \(call_function linear\) on inputs of shape \(2, 5\): "
        r"mat1 and mat2 shapes cannot be multiplied \(2x5 and 4x16\)\. Check that the inputs have the shapes",
    ):
        track_scales(model, torch.randn(2, 5))
    assert all(not p._backward_hooks for p in model.parameters())
    x, grad = torch.randn(2, 4), torch.randn(2, 4)
    expected = _oracle(capture(model, x, deep=DeepTracing()).graph_module, (x,), grad)
    _check_rows(track_scales(model, x, grad), expected)


def test_code_not_as_fx_writes_it_is_left_to_the_interpreter() -> None:
    model = MLP(4)
    cap = capture(model, torch.randn(2, 4), deep=DeepTracing())
    code, _ = cap.python_code()
    nodes = [n for n in cap.graph_module.graph.nodes if n.op != "output"]
    steps = graph_steps(model, nodes)
    instrumented = _instrumented(code, nodes, steps)
    assert instrumented is not None and instrumented.count("_unitscale_track(") == len(nodes)
    assert _instrumented(code.replace("def forward(self", "def run(self"), nodes, steps) is None
    assert _instrumented(code.replace("relu = ", "relu_x = "), nodes, steps) is None


def test_a_capture_is_compiled_once() -> None:
    clear_capture_cache()
    model, x = MLP(4), torch.randn(2, 4)
    cap = capture(model, x, deep=DeepTracing(), check=False, cache=True)
    program = compiled_tracking(model, cap)
    assert program is not None and compiled_tracking(model, cap) is program
    clear_capture_cache()
    again = capture(model, x, deep=DeepTracing(), check=False, cache=True)
    assert again is not cap and compiled_tracking(model, again) is not program


def test_a_function_argument_is_passed_to_compiled_code_as_an_input() -> None:
    torch.manual_seed(0)
    model, x, grad = Applies(), torch.randn(3, 4), torch.randn(3, 4)
    deep = DeepTracing(autowrap_functions=(apply_fn,))
    cap = capture(model, x, deep=deep, check=False)
    assert cap.extra_inputs == (torch.tanh,)
    expected = _oracle(cap.graph_module, (x, *cap.extra_inputs), grad)
    report = track_scales(model, x, grad, autowrap_functions=(apply_fn,))
    _check_rows(report, expected)
    assert report.rows[-1].op == "apply_fn"
    # by hand: apply_fn's output is 2 tanh(fc(x)), its gradient the one given
    y = 2 * torch.tanh(model.fc(x))
    assert report.rows[-1].forward == pytest.approx(_std(y), rel=1e-5)
    assert report.rows[-1].backward == pytest.approx(_std(grad), rel=1e-5)


class ViewChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w
        return h.view(2, 4, 8).transpose(1, 2).reshape(-1, 8).unsqueeze(0) + h.float().view(1, 8, 8)


def test_an_exported_chain_of_aten_views_is_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """aten.view, transpose, reshape and unsqueeze hold the matmul's values: one record, two stds.

    An exported graph's views are ATen ops (``aten.view.default``), not the torch functions
    of an fx trace; each was measured again, forward and backward (a third of GPT-2's stds).
    ``aten.to.dtype`` to float32 of a float32 tensor is that tensor itself (a quarter of
    Llama's stds were such casts and their views). The numbers are torch's own (a plain
    interpreter and ``autograd.grad``).
    """
    model, x = ViewChain(), torch.randn(8, 8)
    grad = torch.randn(1, 8, 8)
    cap = capture(model, x, route="export")
    targets = {str(n.target) for n in cap.graph_module.graph.nodes}
    assert targets >= {"aten.view.default", "aten.transpose.int", "aten.to.dtype"}
    measured: list[torch.Size] = []
    std_stat = stats.std_stat
    monkeypatch.setattr(stats, "std_stat", lambda t: measured.append(t.shape) or std_stat(t))
    report = track_scales(model, x, grad, route="export")
    _check_rows(report, _oracle(cap.graph_module, (x,), grad))
    # w forward and backward, x forward, the matmul and the sum forward and backward: the views
    # and the cast take the matmul's forward numbers, and their gradients are the sum's own
    assert len(measured) == 7, measured


class Copies(nn.Module):
    """Casts that cast nothing, copies, a detach and a real cast of a tensor with other readers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = h.float() * 2
        b = h.clone().t() * x.t()
        c = h.detach() + 1
        d = h.to(torch.float64).sum()
        e = torch.clone(a).contiguous()
        return a.sum() + b.sum() + c.sum() + d.float() + e.pow(2).sum()


@pytest.mark.parametrize("route", ["fx", "export"])
def test_casts_copies_and_detach_take_their_inputs_numbers_as_torch_gives_them(route: str) -> None:
    torch.manual_seed(0)
    model, x = Copies(), torch.randn(4, 8)
    report = track_scales(model, x, route=route)
    deep = {"deep": DeepTracing(), "check": False} if route == "fx" else {}
    cap = capture(model, x, route=route, **deep)
    _check_rows(report, _oracle(cap.graph_module, (x,), torch.ones(())))
    assert report.route == route


def test_an_exported_graph_runs_compiled_with_torchs_numbers() -> None:
    torch.manual_seed(0)
    model, x = Views(), torch.randn(4, 8)
    report = track_scales(model, x, route="export")
    assert report.route == "export"
    cap = capture(model, x, route="export")
    expected = _oracle(cap.graph_module, (x,), torch.ones(()))
    _check_rows(report, expected)
    assert report.code.startswith("# Views: captured by torch.export")
    assert "# (-> " in report.code and "  fc" in report.code  # scales and module paths on the lines
