"""unit_scale and training mode, higher-order ops, the std check along the graph, and FP8 on no matmul."""

from __future__ import annotations

import logging

import pytest
import torch
from functorch.experimental.control_flow import map as control_flow_map
from torch import nn
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.while_loop import while_loop

import unitscale.functional as U
from unitscale.errors import NothingQuantisedWarning
from unitscale.transforms import OffScale, ScaleCheck, check_scale, simulate_fp8, unit_scale


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)
    )


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "example_inputs"])
def test_a_model_wrapped_in_eval_mode_is_in_eval_mode_and_trains_after_train(eager: bool) -> None:
    x = torch.randn(4, 3, 8, 8)
    scaled = unit_scale(bn_net().eval(), example_inputs=x if eager else None)
    assert scaled.training is False and scaled.module.training is False
    a, b = scaled(x), scaled(x)
    assert torch.equal(a, b)  # eval: no dropout
    bn = scaled.module[1]
    assert bn.num_batches_tracked.item() == 0
    scaled.train()
    a, b = scaled(x), scaled(x)
    assert not torch.equal(a, b)  # dropout runs
    assert bn.num_batches_tracked.item() == 2  # one update per call: the capture left no trace
    # the first training batch replaced the reset statistics: they are the batch's own
    # (the convolution is on the trunk, every input-to-output path crosses it: unconstrained)
    conv_out = U.conv2d(x, scaled.module[0].weight, scaled.module[0].bias, constraint=None)
    assert torch.allclose(bn.running_mean, conv_out.mean((0, 2, 3)), atol=1e-4)
    scaled.eval()
    assert torch.equal(scaled(x), scaled(x)) and bn.num_batches_tracked.item() == 2


def test_a_frozen_batch_norm_inside_a_training_model_gets_a_graph_of_its_own() -> None:
    x = torch.randn(4, 3, 8, 8)
    scaled = unit_scale(bn_net())
    scaled(x)
    scaled.module[1].eval()  # freeze batch norm, keep dropout
    scaled(x)
    bn_nodes = [n for n in scaled.graph_module.graph.nodes if n.target is U.batch_norm]
    assert [n.args[5] for n in bn_nodes] == [False] and scaled.module[1].num_batches_tracked.item() == 1


def test_capturing_in_training_mode_draws_no_random_numbers_of_the_callers() -> None:
    x = torch.randn(4, 3, 8, 8)
    torch.manual_seed(1)
    first = unit_scale(bn_net().train())(x)
    torch.manual_seed(1)
    model = bn_net().train()
    torch.manual_seed(1)
    second = unit_scale(model)(x)
    assert first.shape == second.shape
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    unit_scale(bn_net().train())(x)  # seeds the net with 0 inside: only the graph's run draws
    assert not torch.equal(torch.rand(3), expected)


class Cond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return torch.cond(h.sum() > 0, lambda t: t * 2 + 1, lambda t: t - 1, (h,))


class Scan(Cond):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return associative_scan(lambda a, b: a + b, self.linear(x), dim=0, combine_mode="generic")


class Map(Cond):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return control_flow_map(lambda t: t * t + 1, self.linear(x))


class While(Cond):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, out = while_loop(
            lambda i, t: i < 3, lambda i, t: (i + 1, t + 1.0), (torch.zeros((), dtype=torch.int64), self.linear(x))
        )
        return out


# TorchDynamo reads a non-leaf's .grad while it traces cond and map: torch's warning, not ours.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor")
@pytest.mark.parametrize(
    ("model", "region"),
    [
        (Cond, "torch.ops.higher_order.cond (node cond) at test_unit_scale_modes.py"),
        (Scan, "vmap (node _vmap_increment_nesting) at test_unit_scale_modes.py"),
        (Map, "torch.ops.higher_order.map_impl (node map_impl) at test_unit_scale_modes.py"),
        (While, "torch.ops.higher_order.while_loop (node while_loop) at test_unit_scale_modes.py"),
    ],
)
def test_higher_order_ops_keep_their_bodies_and_are_reported_as_regions(model: type[nn.Module], region: str) -> None:
    torch.manual_seed(0)
    plain = model()
    scaled = unit_scale(plain)
    x = torch.randn(4, 8, requires_grad=True)
    out = scaled(x)
    out.sum().backward()
    assert scaled.unscaled_regions[0].startswith(region)
    # the body computes what it did: the same function of the unit-scaled linear layer's output
    h = U.linear(x, scaled.module.linear.weight, scaled.module.linear.bias, constraint=None)
    assert torch.allclose(out, model.forward(_Fixed(h), x), atol=1e-5)
    assert not any("higher_order" in line or "_vmap" in line for line in scaled.unscaled_ops)


class _Fixed:
    """Stands for ``self`` in a forward whose linear layer returns ``h``."""

    def __init__(self, h: torch.Tensor) -> None:
        self.linear = lambda _: h


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_mamba_and_jamba_run_unit_scaled_with_their_selective_scans_whole() -> None:
    transformers = pytest.importorskip("transformers")
    common = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128, "use_cache": False}
    configs = {
        "mamba": {"state_size": 8, "intermediate_size": 128},
        "jamba": {
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_d_state": 8,
            "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "num_experts": 2,
            "num_experts_per_tok": 1, "mamba_dt_rank": 8,
        },
    }  # fmt: skip
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    for kind, extra in configs.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(kind, **common, **extra)
        )
        scaled = unit_scale(model)
        logits = scaled(ids).logits
        logits.backward(torch.randn_like(logits))
        assert all(line.startswith("vmap (node") for line in scaled.unscaled_regions), kind
        assert len(scaled.unscaled_regions) >= 2 and scaled.scale_check is not None
        assert 0.5 < scaled.scale_check.output_std < 2 and 0.5 < scaled.scale_check.grad_std < 2, (
            kind,
            scaled.scale_check,
        )


def test_scale_check_names_the_op_that_moves_the_scale_and_by_how_much() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(self.linear(x))

    torch.manual_seed(0)
    scaled = unit_scale(Net())
    scaled(torch.randn(512, 64))
    check = scaled.scale_check
    assert isinstance(check, ScaleCheck) and not check.ok
    (first, *_) = check.breaks
    assert isinstance(first, OffScale) and first.direction == "forward" and first.node == "exp"
    # exp of N(0, 1) has std (e**2 - e)**0.5 = 2.16: the report's number is a measurement of it
    assert first.before == pytest.approx(1.0, abs=0.05) and first.after == pytest.approx(2.16, rel=0.1)
    assert "torch.exp (node exp) at test_unit_scale_modes.py" in check.summary()


def test_an_off_scale_model_is_logged_with_its_breaking_op(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="unitscale.transforms.transformed_module"):
        unit_scale(nn.Sequential(nn.Linear(64, 64), nn.Softplus(beta=0.1)))(torch.randn(256, 64))
    (record,) = [r for r in caplog.records if "off unit scale" in r.message]
    assert "torch.nn.functional.softplus" in record.message and "forward std" in record.message


def test_check_scale_measures_a_graph_without_touching_parameter_gradients() -> None:
    linear = nn.Linear(16, 16)
    gm = torch.fx.symbolic_trace(linear)
    check = check_scale(gm, [torch.randn(64, 16)])
    assert linear.weight.grad is None and [row[0] for row in check.stds] == ["input_1", "linear"]


def test_simulate_fp8_on_a_model_without_a_matmul_warns_that_nothing_was_rounded() -> None:
    model = simulate_fp8(nn.Sequential(nn.ReLU(), nn.LayerNorm(4)))
    with pytest.warns(NothingQuantisedWarning, match=r"no matmul-like op .* nothing was rounded"):
        out = model(torch.randn(3, 4))
    assert out.shape == (3, 4)


def test_a_captured_unit_scaled_model_deep_copies_without_warnings_and_computes_the_same():
    """pytest turns warnings into errors: copying the captured graph's pytree specs used to warn (LeafSpec)."""
    import copy

    from unitscale.examples import resnet18
    from unitscale.transforms import unit_scale

    torch.manual_seed(0)
    model = unit_scale(resnet18(num_classes=5, width=4), check=False)
    x = torch.randn(2, 3, 16, 16)
    model(x)
    twin = copy.deepcopy(model)
    assert twin is not model and twin.graph_module is not model.graph_module
    assert torch.equal(twin(x), model(x))
