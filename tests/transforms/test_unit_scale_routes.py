"""unit_scale / simulate_format / apply_transform with example inputs: captured now, by the capture layer's routes.

Without example inputs a transformed module captures lazily with TorchDynamo; with them
it is captured at once by ``unitscale.capture.capture`` (fx traced flat, export,
strict export, dynamo). Both must give the same numbers for the same weights.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.real_models import BUILDERS, VOCAB
from unitscale.errors import InputError, NoGraphError, NoRouteError, UnknownRouteError, UnscaledOpsError
from unitscale.examples import resnet18
from unitscale.examples.models import MLP, TinyGPT
from unitscale.tracking import track_scales
from unitscale.transforms import TransformedModule, apply_transform, simulate_fp8, unit_scale

BAND = (0.25, 4.0)


def _main(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _out_and_grad_std(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[float, float]:
    torch.manual_seed(1)
    args = tuple(a.clone().requires_grad_() if a.is_floating_point() else a for a in args)
    out = _main(model(*args, **kwargs))
    out.backward(torch.randn_like(out))
    if args[0].is_floating_point():
        return out.std().item(), args[0].grad.std().item()
    params = dict(model.named_parameters())
    (table,) = [params[f"module.{name}"] for name in _TABLES if f"module.{name}" in params]
    return out.std().item(), table.grad.std().item()


_TABLES = ["tok_emb.weight", "transformer.wte.weight", "embeddings.word_embeddings.weight"]
_TABLES += ["model.embed_tokens.weight", "shared.weight"]


def _case(kind: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(64), (torch.randn(32, 64),), {}
    if kind == "tinygpt":
        model = TinyGPT(vocab_size=32, d_model=32, n_layers=2, n_heads=2, seq_len=16)
        return model, (torch.randint(0, 32, (8, 16)),), {}
    if kind == "resnet18":
        return resnet18(num_classes=10).eval(), (torch.randn(8, 3, 32, 32),), {}
    model = BUILDERS[kind]()[0]
    ids = torch.randint(0, VOCAB, (4, 16))
    return model, (ids,), ({"decoder_input_ids": ids} if kind == "t5" else {})


@functools.cache
def scaled(kind: str, route: str = "auto") -> tuple[TransformedModule, tuple[Any, ...], dict[str, Any]]:
    """``kind`` unit-scaled with example inputs by ``route``, once per session."""
    model, args, kwargs = _case(kind)
    torch.manual_seed(0)
    logging.disable(logging.WARNING)
    try:
        return unit_scale(model, example_inputs=args, example_kwargs=kwargs, route=route), args, kwargs
    finally:
        logging.disable(logging.NOTSET)


def _lazy_twin(eager: TransformedModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TransformedModule:
    """The same model unit-scaled lazily (TorchDynamo on the first call), with the eager one's weights."""
    logging.disable(logging.WARNING)
    try:
        lazy = unit_scale(eager.module)
        lazy(*args, **kwargs)  # capture (and re-initialise) first, then take the eager weights
    finally:
        logging.disable(logging.NOTSET)
    lazy.module.load_state_dict(eager.module.state_dict())
    return lazy


ROUTE_OF = {"mlp": "fx", "tinygpt": "fx", "resnet18": "fx", "gpt2": "export", "llama": "export"}
ROUTE_OF |= {"bert": "export", "t5": "export"}


@pytest.mark.parametrize("kind", sorted(ROUTE_OF))
def test_auto_route_unit_scales_every_model_with_output_and_grad_std_in_the_band(kind: str) -> None:
    model, args, kwargs = scaled(kind)
    assert model.route == ROUTE_OF[kind]
    # transformers models cannot be traced by torch.fx: that reason is kept
    assert list(model.reasons) == ([] if ROUTE_OF[kind] == "fx" else ["fx"])
    out, grad = _out_and_grad_std(model, args, kwargs)
    assert BAND[0] < out < BAND[1] and BAND[0] < grad < BAND[1], (kind, out, grad)
    if kind in ("gpt2", "llama", "tinygpt"):
        assert 0.7 < out < 1.3, (kind, out)


@pytest.mark.parametrize(("kind", "route"), [("tinygpt", "export"), ("tinygpt", "dynamo"), ("mlp", "export")])
def test_each_forced_route_unit_scales_small_models(kind: str, route: str) -> None:
    model, args, kwargs = scaled(kind, route)
    assert model.route == route and model.unscaled_ops == []
    out, grad = _out_and_grad_std(model, args, kwargs)
    assert 0.7 < out < 1.4 and 0.5 < grad < 2.0, (kind, route, out, grad)


@pytest.mark.parametrize(("kind", "route"), [("tinygpt", "auto"), ("tinygpt", "export"), ("llama", "auto")])
def test_eager_capture_matches_the_lazy_dynamo_capture_for_the_same_weights(kind: str, route: str) -> None:
    eager, args, kwargs = scaled(kind, route)
    lazy = _lazy_twin(eager, args, kwargs)
    assert lazy.route == "dynamo"
    torch.testing.assert_close(_main(eager(*args, **kwargs)), _main(lazy(*args, **kwargs)), rtol=1e-5, atol=1e-5)
    assert len(eager.kept_ops) == len(lazy.kept_ops)


def test_exported_llama_folds_rms_norms_keeps_rotary_and_names_module_paths() -> None:
    model, _, _ = scaled("llama")
    nodes = list(model.graph_module.graph.nodes)
    norms = [n for n in nodes if n.target is U.rms_norm]
    assert [n.meta["module_path"] for n in norms[:2]] == [
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
    ]
    assert len(norms) == 5 and all(n.args[2] is not None for n in norms)
    reasons = [line.split(": ", 1)[1] for line in model.kept_ops]
    assert reasons.count("rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)") == 12
    assert model.unscaled_ops == []
    linears = [n for n in nodes if n.target is U.linear]
    assert linears[0].meta["module_path"] == "model.layers.0.self_attn.q_proj"
    assert linears[0].meta["module_type"] == "torch.nn.modules.linear.Linear"
    assert linears[0].meta["source"].endswith(".py:" + linears[0].meta["source"].rsplit(":", 1)[1])


def test_every_op_of_a_unit_scaled_graph_carries_a_module_path_on_every_route() -> None:
    for kind, route in [("tinygpt", "auto"), ("tinygpt", "export"), ("tinygpt", "dynamo"), ("gpt2", "auto")]:
        graph = scaled(kind, route)[0].graph_module.graph
        ops = [n for n in graph.nodes if n.op == "call_function"]
        assert ops and all("module_path" in n.meta and "source" in n.meta for n in ops), (kind, route)
        paths = {n.meta["module_path"] for n in ops if n.target is U.linear}
        assert {"blocks.0.attn.qkv", "head"} <= paths if kind == "tinygpt" else "lm_head" in paths


def test_unscaled_ops_name_the_op_node_module_path_and_line() -> None:
    model, _, _ = scaled("bert")
    assert [line.rsplit(":", 1)[0] for line in model.unscaled_ops] == [
        "torch.tanh (node tanh, module pooler.activation) at modeling_bert.py"
    ]
    torch.manual_seed(0)
    tanh_mlp = unit_scale(MLP(8, activation=nn.Tanh()), example_inputs=torch.randn(4, 8))
    assert [line.split(" at ")[0] for line in tanh_mlp.unscaled_ops] == ["torch.tanh (node tanh, module act)"]


def test_the_eager_graph_serves_other_batch_sizes_and_other_shapes_are_captured_lazily() -> None:
    torch.manual_seed(0)
    idx = torch.randint(0, 32, (8, 16))
    model = unit_scale(TinyGPT(vocab_size=32, d_model=32, n_layers=2, n_heads=2, seq_len=16), example_inputs=idx)
    repeated = idx.repeat(3, 1)
    assert model(repeated).shape == (24, 16, 32) and model._captured == {} and model.route == "fx"
    assert model(idx[:, :8]).shape == (8, 8, 32)  # another sequence length: a lazy Dynamo capture
    assert len(model._captured) == 1 and model.route == "dynamo"
    assert torch.equal(model(idx), model(idx)) and len(model._captured) == 1


def test_repr_and_attributes_report_the_route() -> None:
    torch.manual_seed(0)
    scaled_mlp = unit_scale(MLP(4), example_inputs=torch.randn(2, 4), route="export")
    assert scaled_mlp.route == "export" and scaled_mlp.reasons == {}
    assert "route='export', transforms=[unit_scale]" in repr(scaled_mlp)


def test_forcing_a_route_that_cannot_take_the_model_raises_no_route_error_with_its_reason() -> None:
    gpt2, (ids,), _ = _case("gpt2")
    with pytest.raises(NoRouteError, match=r"no route could capture GPT2LMHeadModel \(tried fx\):\n  fx: TraceError"):
        unit_scale(gpt2, example_inputs=ids, route="fx")
    with pytest.raises(NoGraphError, match=r"needs a graph of MLP, but no graph route captured it"):
        unit_scale(MLP(4), example_inputs=torch.randn(2, 4), route="eager")
    with pytest.raises(UnknownRouteError, match=r"capture\(route=...\) got 'onnx'"):
        unit_scale(MLP(4), example_inputs=torch.randn(2, 4), route="onnx")


def test_a_model_no_route_can_capture_lists_each_routes_reason() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(NoRouteError) as info:
        unit_scale(Branchy(), example_inputs=torch.ones(2, 2), route=("fx", "dynamo"))
    assert set(info.value.reasons) == {"fx", "dynamo"}
    assert "test_unit_scale_routes.py" in info.value.reasons["fx"]


def test_route_without_example_inputs_and_inputs_that_do_not_fit_raise_input_error() -> None:
    with pytest.raises(InputError, match=r"route='export' chooses how example inputs are captured"):
        unit_scale(MLP(4), route="export")
    with pytest.raises(InputError, match=r"MLP failed on the example inputs \(\(2, 5\)\)"):
        unit_scale(MLP(4), example_inputs=torch.randn(2, 5))


def test_nested_transforms_reuse_the_example_inputs_and_route() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 64)
    scaled_mlp = unit_scale(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)), example_inputs=x)
    nested = simulate_fp8(scaled_mlp)
    assert nested.route == "fx" and nested.module is scaled_mlp.module
    targets = [n.target for n in nested.graph_module.graph.nodes if n.op == "call_function"]
    assert targets.count(U.linear) == 2 and targets.count(torch.ops.unitscale.quantise_fwd) == 4
    error = (nested(x) - scaled_mlp(x)).abs()
    assert error.max() > 0 and error.mean() < 0.1  # FP8 rounding of unit-scale operands


def test_apply_transform_with_example_inputs_sees_torch_functions_on_an_exported_graph() -> None:
    seen: list[str] = []

    def record(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        seen.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    model = apply_transform(MLP(4), record, example_inputs=torch.randn(2, 4), route="export")
    assert seen == ["linear", "relu", "linear"] and model.route == "export"


def test_track_scales_reads_an_eagerly_captured_module_with_module_paths() -> None:
    model, (idx,), _ = scaled("tinygpt")
    rows = {row.node: row for row in track_scales(model, idx[:2])}
    linear = next(row for name, row in rows.items() if "linear" in name)
    assert linear.module_path.startswith("module.blocks.0")


def test_an_aten_op_without_a_twin_is_listed_by_its_aten_name_and_strict_refuses_it() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model = unit_scale(MLP(8, activation=nn.Softplus()), example_inputs=x, route="export")
    assert [line.split(" at ")[0] for line in model.unscaled_ops] == [
        "torch.ops.aten.softplus.default (node softplus, module act)"
    ]
    with pytest.raises(UnscaledOpsError, match=r"left 1 op\(s\) unscaled: torch.ops.aten.softplus.default"):
        unit_scale(MLP(8, activation=nn.Softplus()), strict=True, example_inputs=x, route="export")


def test_a_same_padded_convolution_is_unit_scaled_alike_on_every_route() -> None:
    """``Conv2d(padding="same")`` (EfficientNet's) exports as ``aten.conv2d.padding``, not ``.default``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding="same"), nn.ReLU(), nn.Conv2d(64, 64, 3, padding="same")).eval()
    x = torch.randn(8, 3, 16, 16)
    outputs = {}
    for route in ("fx", "export", "dynamo"):
        torch.manual_seed(1)  # unit_scale draws new unit-normal weights: the same ones on each route
        scaled_model = unit_scale(model, example_inputs=x, route=route)
        assert scaled_model.route == route and scaled_model.unscaled_ops == [], route
        with torch.no_grad():
            outputs[route] = scaled_model(x)
    assert 0.8 < outputs["fx"].std().item() < 1.2
    torch.testing.assert_close(outputs["export"], outputs["fx"])
    torch.testing.assert_close(outputs["dynamo"], outputs["fx"])


def test_a_transposed_weight_read_as_w_T_is_a_view_not_an_unscaled_op() -> None:
    """Falcon's linear is ``x @ self.weight.T``: fx and Dynamo write ``getattr(weight, 'T')``."""

    class TransposedWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(64, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.T

    x = torch.randn(16, 32)
    for route in ("fx", "dynamo", "export"):
        torch.manual_seed(0)
        scaled_model = unit_scale(TransposedWeight(), example_inputs=x, route=route)
        assert scaled_model.unscaled_ops == [], route
        with torch.no_grad():
            assert 0.8 < scaled_model(x).std().item() < 1.2, route


def test_stacking_rolling_and_flipping_are_scale_neutral_on_the_export_route_as_on_the_others() -> None:
    """GPT-J's rotary embedding stacks; the export route spells these as aten ops."""

    class Rearranging(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.proj(x)
            z = torch.stack([y, y.roll(1, -1)], dim=-1).flatten(-2)
            return z.flip(-1).repeat(1, 2).masked_fill(torch.zeros_like(z.repeat(1, 2), dtype=torch.bool), 0.0)

    x = torch.randn(16, 32)
    for route in ("fx", "export"):
        torch.manual_seed(0)
        scaled_model = unit_scale(Rearranging(), example_inputs=x, route=route)
        assert scaled_model.unscaled_ops == [], route


def test_a_cross_entropy_loss_is_unit_scaled_on_the_export_route_as_on_fx() -> None:
    """A model that returns its loss (``labels=`` in transformers) exports ``aten.cross_entropy_loss``."""

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(16, 32)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(self.head(x), target, reduction="sum", ignore_index=3, label_smoothing=0.1)

    x, target = torch.randn(8, 16), torch.arange(8)
    grads = {}
    for route in ("fx", "export"):
        torch.manual_seed(0)
        scaled_model = unit_scale(WithLoss(), example_inputs=(x, target), route=route)
        assert scaled_model.unscaled_ops == [], route
        loss = scaled_model(x, target)
        loss.backward()
        grads[route] = (loss.detach(), scaled_model.module.head.weight.grad)
    torch.testing.assert_close(grads["export"], grads["fx"])
