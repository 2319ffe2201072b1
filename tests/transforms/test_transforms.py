"""unit_scale, simulate_format / simulate_fp8 and apply_transform on TorchDynamo graphs."""

from __future__ import annotations

import inspect
import logging
import operator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import unitscale.functional as U
from unitscale.errors import (
    CaptureError,
    FormatError,
    NotAModuleError,
    NotCallableError,
    ReplaceMapError,
    TraceError,
    UnscaledOpsError,
)
from unitscale.examples.models import MLP, TinyGPT
from unitscale.formats import FP8_E4M3, FP8_E5M2
from unitscale.fx import DeepTracer
from unitscale.tracking import analyse_module, track_scales
from unitscale.transforms import apply_transform, simulate_format, simulate_fp8, unit_scale


class FunctionalMLP(nn.Module):
    """The same network as ``nn.Sequential(Linear, GELU, Linear)``, written with functional calls."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(hidden, d) * 0.02)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.randn(d, hidden) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(F.gelu(F.linear(x, self.w1, self.b1)), self.w2.t())


def _module_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))


def _std_out_and_grad(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(torch.randn_like(y))
    return y.std().item(), x.grad.std().item()


@pytest.fixture(scope="module")
def gpt() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=32, d_model=32, n_layers=2, n_heads=2, seq_len=16)
    idx = torch.randint(0, 32, (8, 16))
    scaled = unit_scale(model)
    scaled(idx)
    return model, scaled, idx


@pytest.mark.parametrize("make", [_module_mlp, lambda: FunctionalMLP(64, 256)], ids=["modules", "functional"])
def test_unit_scale_gives_unit_output_and_grad_std_for_module_and_functional_style(make) -> None:
    torch.manual_seed(0)
    model = make()
    x = torch.randn(512, 64)
    plain_out, _ = _std_out_and_grad(model, x)
    out, grad = _std_out_and_grad(unit_scale(model), x)
    assert plain_out < 0.5
    # GELU's output has mean 0.48 after unit scaling, so the last matmul's output std is sqrt(1 + 0.23).
    assert 0.9 < out < 1.25
    assert 0.85 < grad < 1.15


@settings(max_examples=5, deadline=None)
@given(d=st.sampled_from([32, 64, 128]), hidden=st.sampled_from([64, 256, 512]), bias=st.booleans())
def test_unit_scaled_mlps_of_any_width_keep_unit_scale(d: int, hidden: int, bias: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, d, bias=bias))
    out, grad = _std_out_and_grad(unit_scale(model), torch.randn(256, d))
    assert 0.9 < out < 1.25
    assert 0.85 < grad < 1.15


def test_unit_scale_never_touches_the_users_module() -> None:
    torch.manual_seed(0)
    model = _module_mlp()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    scaled = unit_scale(model)
    scaled(torch.randn(4, 64)).sum().backward()
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]) and param.grad is None
    assert not {id(p) for p in scaled.parameters()} & {id(p) for p in model.parameters()}


def test_unit_scale_reinitialises_weights_unit_normal_biases_zero_norm_gains_one(gpt) -> None:
    _, scaled, _ = gpt
    params = dict(scaled.module.named_parameters())
    assert params["blocks.0.mlp.fc1.weight"].std().item() == pytest.approx(1.0, abs=0.1)
    assert params["tok_emb.weight"].std().item() == pytest.approx(1.0, abs=0.1)
    assert torch.all(params["blocks.0.mlp.fc1.bias"] == 0)
    assert torch.all(params["blocks.0.ln1.weight"] == 1) and torch.all(params["blocks.0.ln1.bias"] == 0)


def test_residual_adds_become_split_and_add_with_attention_tau(gpt) -> None:
    _, scaled, _ = gpt
    nodes = list(scaled.graph_module.graph.nodes)
    splits = [n.args[1] for n in nodes if n.target is U.residual_split]
    joins = [n.args[2] for n in nodes if n.target is U.residual_add]
    assert splits == joins == [0.01, 0.5, 0.01, 1 / 3]  # the attention add passes the MLP chain on
    (embedding_add,) = [n for n in nodes if n.target is U.add]
    assert embedding_add.kwargs["constraint"] is None
    linears = [n for n in nodes if n.target is U.linear]
    # Before the last residual add the default constraint stays; the head after it is unconstrained.
    assert [n.kwargs.get("constraint", "gmean") for n in linears] == ["gmean"] * 8 + [None]
    assert scaled.unscaled_ops == []


def test_unit_scaled_tinygpt_has_unit_scale_logits_and_parameter_grads(gpt) -> None:
    model, scaled, idx = gpt
    logits = scaled(idx)
    logits.backward(torch.randn_like(logits))
    grads = [p.grad.std().item() for name, p in scaled.module.named_parameters() if not name.endswith("ln1.weight")]
    assert logits.std().item() == pytest.approx(1.0, abs=0.2)
    assert model(idx).std().item() < 0.8
    assert all(0.5 < g < 2.5 for g in grads)


# the line of MLP.forward's body, where the activation is called
MLP_LINE = inspect.getsourcelines(MLP.forward)[1] + 1


def test_unscaled_ops_are_logged_and_listed(caplog) -> None:
    torch.manual_seed(0)
    scaled = unit_scale(MLP(8, activation=nn.Tanh()))
    with caplog.at_level(logging.WARNING, logger="unitscale.transforms"):
        scaled(torch.randn(4, 8))
    assert scaled.unscaled_ops == [f"torch.tanh (node tanh, module act) at models.py:{MLP_LINE}"]
    assert (
        f"unit_scale left 1 op(s) unscaled: torch.tanh (node tanh, module act) at models.py:{MLP_LINE}" in caplog.text
    )


def test_strict_raises_unscaled_ops_error_naming_the_op() -> None:
    with pytest.raises(
        UnscaledOpsError,
        match=rf"left 1 op\(s\) unscaled: torch.tanh \(node tanh, module act\) at models.py:{MLP_LINE}",
    ):
        unit_scale(MLP(8, activation=nn.Tanh()), strict=True)(torch.randn(4, 8))


def test_user_replacements_come_before_the_default_map() -> None:
    calls = []

    def my_relu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        calls.append(x.shape)
        return torch.relu(x) * 2**0.5

    def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append("add")
        return a + b

    class Adder(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(x) + x

    scaled = unit_scale(Adder(), replace={F.relu: my_relu, operator.add: my_add}, strict=True)
    scaled(torch.randn(3, 2))
    # the call, then unit_scale's check of the std along the new graph
    assert calls == [torch.Size([3, 2]), "add"] * 2
    calls.clear()
    unchecked = unit_scale(Adder(), replace={F.relu: my_relu, operator.add: my_add}, check=False)
    unchecked(torch.randn(3, 2))
    assert calls == [torch.Size([3, 2]), "add"] and unchecked.scale_check is None
    assert not any(n.target is U.residual_add for n in scaled.graph_module.graph.nodes)


@pytest.mark.parametrize(
    ("replace", "error"),
    [
        ({F.relu: "relu"}, r"replace\['relu'\] = 'relu' is not callable"),
        ({"relu": F.relu}, r"replace key 'relu' is not callable"),
        ([F.relu], r"replace must be a mapping \(torch function -> replacement\), got list"),
    ],
)
def test_replace_with_non_callables_raises_replace_map_error(replace, error) -> None:
    with pytest.raises(ReplaceMapError, match=error):
        unit_scale(MLP(4), replace=replace)


def test_graph_break_raises_capture_error_naming_the_line() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(
        CaptureError,
        match=r"could not capture Branchy.forward in one graph at .*test_transforms.py:\d+ \(if x.sum\(\) > 0:\)",
    ):
        unit_scale(Branchy())(torch.randn(2, 2))


def test_bad_modules_and_transforms_raise_typed_errors() -> None:
    with pytest.raises(NotAModuleError, match="unit_scale: expected an nn.Module, got function"):
        unit_scale(F.relu)
    with pytest.raises(NotCallableError, match="transform must be callable"):
        apply_transform(nn.ReLU(), "double")
    with pytest.raises(FormatError, match=r"simulate_format: bwd_format='e5m2' is not an FPFormat"):
        simulate_format(nn.ReLU(), FP8_E4M3, "e5m2")


def test_simulate_fp8_rounds_matmul_inputs_forward_and_their_gradients_backward() -> None:
    layer = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(3))
    x = torch.tensor([[0.3, 500.0, 1e-3]], requires_grad=True)
    y = simulate_fp8(layer)(x)
    g = torch.tensor([[0.1, 70000.0, 1e-6]])
    y.backward(g)
    assert y.tolist() == FP8_E4M3.round(x.detach()).tolist() == [[0.3125, 448.0, 0.001953125]]
    assert x.grad.tolist() == FP8_E5M2.round(g).tolist() == [[0.09375, 57344.0, 0.0]]
    assert torch.equal(layer.weight, torch.eye(3))


def test_transforms_nest_and_compile_matches_eager() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(_module_mlp())
    nested = simulate_fp8(scaled)
    x = torch.randn(16, 64)
    eager = nested(x)
    targets = [n.target for n in nested.graph_module.graph.nodes if n.op == "call_function"]
    assert targets.count(U.linear) == 2 and targets.count(torch.ops.unitscale.quantise_fwd) == 4
    assert nested.module is scaled.module
    compiled = torch.compile(nested, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, rtol=0.07, atol=0.07)
    assert (eager - scaled(x)).abs().max() > 0  # quantisation did something


def test_a_new_input_shape_is_captured_again() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(_module_mlp())
    assert scaled(torch.randn(4, 64)).shape == (4, 64)
    assert scaled(torch.randn(2, 3, 64)).shape == (2, 3, 64)
    assert len(scaled._captured) == 2


def test_track_scales_sees_unit_scaled_ops_as_single_nodes(gpt) -> None:
    _, scaled, idx = gpt
    report = track_scales(scaled, idx)
    rows = {row.node: row for row in report}
    assert rows["x_residual"].module_path == "module.blocks.0"
    assert rows["linear"].module_path == "module.blocks.0.attn.qkv"
    assert rows["linear_8"].scale.forward == pytest.approx(1.0, abs=0.2)
    assert "mul" not in rows
    code = analyse_module(scaled, idx, syntax_highlight=False)
    assert "unitscale_functional_residual_add(linear_1, x_skip, 0.01)" in code


def test_tracing_a_transformed_module_before_its_first_call_raises_trace_error() -> None:
    with pytest.raises(TraceError, match="was transformed but never called: call it once on real inputs"):
        DeepTracer().trace(unit_scale(MLP(4)))


def test_output_structure_inputs_and_constants_pass_through() -> None:
    class Structured(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, scale: float) -> dict:
            return {"y": self.fc(x) * scale, "x": x, "n": 3}

    x = torch.randn(2, 4)
    out = simulate_fp8(Structured())(x, 2.0)
    assert set(out) == {"y", "x", "n"} and out["x"] is x and out["n"] == 3
    assert out["y"].shape == (2, 4)
    assert torch.equal(unit_scale(nn.Identity())(x), x)


def test_simulate_format_rounds_the_unit_scaled_operands_of_a_unit_scaled_matmul() -> None:
    # The fan-in scale must act on the matmul's result, not be folded into the weight:
    # otherwise the rounded weight sits at std 1/sqrt(fan_in), among a format's subnormals.
    from unitscale import nn as unn

    torch.manual_seed(0)
    layer = unn.Linear(256, 64)
    x = torch.randn(128, 256, requires_grad=True)
    simulated = simulate_format(layer, FP8_E4M3, FP8_E5M2)
    simulated(x)
    seen: dict[str, list[float]] = {"fwd": [], "bwd": []}
    quantise_fwd, quantise_bwd = torch.ops.unitscale.quantise_fwd, torch.ops.unitscale.quantise_bwd

    class Record(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):  # type: ignore[no-untyped-def]
            out = super().call_function(target, args, kwargs)
            if target == quantise_fwd:
                seen["fwd"].append(args[0].std().item())
            if target == quantise_bwd and out.requires_grad:
                out.register_hook(lambda g: seen["bwd"].append(g.std().item()))
            return out

    (y,) = Record(simulated.graph_module).run(x)
    y.backward(torch.randn_like(y))
    assert len(seen["fwd"]) == 2 and all(0.9 < s < 1.1 for s in seen["fwd"]), seen
    # the gradient that reaches the input's rounding point is the unit-scaled one (constraint: gmean)
    assert seen["bwd"] and 0.5 < seen["bwd"][0] < 2.0, seen
