"""unit_scale on real models: GPT-2, BERT, Llama and T5 from tiny configs, and ResNet-18.

Each model is unit-scaled as it is (no hand-written replacements) and measured on
random inputs: the output std (``.logits`` / ``.last_hidden_state``) and the gradient
std at the input (images) or of the token-embedding table (token models), for an
``N(0, 1)`` output gradient. The band asserted is [0.25, 4]: within a factor of 4 of
unit scale, where FP8 E4M3 (max 448, normal from 2^-6) keeps three significant bits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import unitscale.functional as U
from tests.real_models import BUILDERS, VOCAB, t5
from unitscale.errors import CaptureError
from unitscale.examples import resnet18
from unitscale.transforms import TransformedModule, unit_scale

BAND = (0.25, 4.0)


def tiny(kind: str, **overrides: Any) -> nn.Module:
    """A tiny ``transformers`` model from ``real_models``, its config changed by ``overrides``.

    ``kind``: ``gpt2``, ``llama`` (causal LMs), ``bert``, ``t5`` (base models) or ``t5-lm``
    (T5 with its tied language-model head).
    """
    if kind == "t5-lm":
        return t5(lm_head=True, **overrides)[0]
    return BUILDERS[kind](**overrides)[0]


def _main_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    raise AssertionError(f"no logits or last_hidden_state in {type(out).__name__}")


@dataclass
class Measured:
    plain_out: float
    plain_grad: float
    out: float
    grad: float
    scaled: TransformedModule


def _grad_std(model: nn.Module, inputs: dict[str, torch.Tensor], grad_of: str | None) -> tuple[float, float]:
    torch.manual_seed(1)
    inputs = {k: v.clone().requires_grad_() if v.is_floating_point() else v for k, v in inputs.items()}
    out = _main_output(model(**inputs))
    out.backward(torch.randn_like(out))
    if grad_of is None:
        (x,) = [v for v in inputs.values() if v.is_floating_point()]
        return out.std().item(), x.grad.std().item()
    return out.std().item(), dict(model.named_parameters())[grad_of].grad.std().item()


def _measure(model: nn.Module, inputs: dict[str, torch.Tensor], grad_of: str | None) -> Measured:
    plain_out, plain_grad = _grad_std(model, inputs, grad_of)
    torch.manual_seed(0)
    scaled = unit_scale(model)
    out, grad = _grad_std(scaled, inputs, None if grad_of is None else f"module.{grad_of}")
    return Measured(plain_out, plain_grad, out, grad, scaled)


_TOKEN_MODELS = {
    "gpt2": "transformer.wte.weight",
    "bert": "embeddings.word_embeddings.weight",
    "llama": "model.embed_tokens.weight",
    "t5": "shared.weight",
    "t5-lm": "shared.weight",
}


@functools.cache
def measured(kind: str) -> Measured:
    """``kind`` measured plain and unit-scaled, once per test session."""
    torch.manual_seed(0)
    if kind == "resnet18":
        return _measure(resnet18(num_classes=10).eval(), {"x": torch.randn(8, 3, 32, 32)}, None)
    model = tiny(kind)
    ids = torch.randint(0, VOCAB, (4, 16))
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids} if kind.startswith("t5") else {})}
    return _measure(model, inputs, _TOKEN_MODELS[kind])


@pytest.mark.parametrize("kind", [*sorted(_TOKEN_MODELS), "resnet18"])
def test_unit_scaled_models_have_output_and_grad_std_within_the_band(kind: str) -> None:
    m = measured(kind)
    assert BAND[0] < m.out < BAND[1], (kind, m)
    assert BAND[0] < m.grad < BAND[1], (kind, m)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_unit_scale_brings_small_init_logits_to_unit_scale(kind: str) -> None:
    # GPT-2 and Llama initialise weights N(0, 0.02): their logits start far below 1.
    m = measured(kind)
    assert m.plain_out < 0.25 and 0.8 < m.out < 1.25, (kind, m)


@pytest.mark.parametrize("kind", [*sorted(_TOKEN_MODELS), "resnet18"])
def test_unit_scaled_models_leave_only_named_ops_unscaled(kind: str) -> None:
    # BERT's pooler ends in a tanh (its pooler_output, not the hidden states measured here).
    expected = (
        ["torch.tanh (node pooled_output_1, module pooler.activation) at modeling_bert.py"] if kind == "bert" else []
    )
    assert [line.rsplit(":", 1)[0] for line in measured(kind).scaled.unscaled_ops] == expected


def test_gpt2_conv1d_projections_and_written_out_gelu_become_twins() -> None:
    graph = measured("gpt2").scaled.graph_module.graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert targets.count(U.addmm) == 8
    gelus = [n for n in graph.nodes if n.target is U.gelu]
    assert [n.kwargs.get("approximate") for n in gelus] == ["tanh", "tanh"]
    assert torch.tanh not in targets and torch.addmm not in targets


def test_llama_rms_norms_fold_rotary_and_gates_are_kept_with_reasons() -> None:
    scaled = measured("llama").scaled
    nodes = list(scaled.graph_module.graph.nodes)
    norms = [n for n in nodes if n.target is U.rms_norm]
    assert len(norms) == 5 and all(n.args[2] is not None for n in norms)  # 2 per layer and the final norm
    assert sum(n.target is U.silu for n in nodes) == 2
    reasons = [line.split(": ", 1)[1] for line in scaled.kept_ops]
    # q and k of each layer: two products and their sum; one gate product per MLP.
    assert reasons.count("rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)") == 12
    assert reasons.count("product of two activations (unit std times unit std stays unit std)") == 2
    assert not any(n.target is U.add for n in nodes)  # the rotary sums are not halved as adds
    params = dict(scaled.module.named_parameters())
    assert torch.all(params["model.layers.0.input_layernorm.weight"] == 1)
    assert params["model.layers.0.mlp.gate_proj.weight"].std().item() == pytest.approx(1.0, abs=0.1)


def test_t5_head_rescale_is_dropped_before_the_tied_unit_scaled_head() -> None:
    # T5 multiplies by d_model ** -0.5 before its tied head; the unit-scaled head sets its own scale.
    graph = measured("t5-lm").scaled.graph_module.graph
    (head,) = [n for n in graph.nodes if n.target is U.linear and n.args[1].target == "shared.weight"]
    rescale = head.args[0]
    assert rescale.target is U.scale and rescale.args[1:] == (1.0, 1.0)


def test_t5_rms_norms_fold_and_position_buckets_are_left_alone() -> None:
    scaled = measured("t5").scaled
    nodes = list(scaled.graph_module.graph.nodes)
    assert sum(n.target is U.rms_norm for n in nodes) == 12  # 2 + 3 per layer pair, plus two final norms
    # The relative-position buckets (log, division) read no activation: neither scaled nor listed.
    assert any(n.target is torch.log for n in nodes) and scaled.kept_ops == []


def test_unit_scaled_resnet18_reinitialises_convolutions_and_resets_batch_norms() -> None:
    scaled = measured("resnet18").scaled
    module = scaled.module
    assert module.conv1.weight.std().item() == pytest.approx(1.0, abs=0.1)
    assert torch.all(module.bn1.weight == 1) and torch.all(module.bn1.bias == 0)
    assert torch.all(module.bn1.running_mean == 0) and torch.all(module.bn1.running_var == 1)
    # The stem, before the first residual split, is on the trunk: no constraint needed there.
    stem = [n for n in scaled.graph_module.graph.nodes if n.target in (U.conv2d, U.max_pool2d)][:2]
    assert [n.kwargs.get("constraint", "gmean") for n in stem] == [None, None]


def test_unscaled_ops_keep_their_parameters_only_scaled_ones_are_reinitialised() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.PReLU(), nn.ConvTranspose1d(1, 1, 3))
    scaled = unit_scale(model)
    scaled(torch.randn(8, 1, 16))
    inner = scaled.module
    # PReLU and a transposed convolution have no twin: their parameters are the model's own.
    assert torch.equal(inner[1].weight, model[1].weight) and torch.equal(inner[2].weight, model[2].weight)
    assert inner[0].weight.std().item() == pytest.approx(1.0, abs=0.15) and torch.all(inner[0].bias == 0)
    assert [line.split(" (node")[0] for line in scaled.unscaled_ops] == [
        "torch.prelu",
        "torch.conv_transpose1d",
    ]


def test_mobilenet_v2_relu6_depthwise_convolutions_and_tf_padding_are_all_unit_scaled() -> None:
    # transformers' MobileNetV2: ReLU6 (hardtanh) after every expansion and depthwise
    # convolution, TensorFlow-style explicit padding. Before ReLU6 had a twin, 17 blocks of
    # an unscaled clamp took the output std to 2e-5. At 128 px the last feature maps are
    # 4x4; much smaller images leave a 3x3 depthwise kernel mostly on padding, which no
    # per-op scale can know about.
    transformers = pytest.importorskip("transformers")
    # At depth_multiplier=0.25 its layers are 8 channels wide: the gradient of a random 8x8
    # matrix product strays from unit scale by chance, and 50 of them take it to 0.2.
    cfg = transformers.AutoConfig.for_model("mobilenet_v2", image_size=128, depth_multiplier=1.0)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg).eval()
    pixels = torch.randn(2, 3, 128, 128)
    plain = model(pixels).last_hidden_state.std().item()
    scaled = unit_scale(model)
    x = pixels.clone().requires_grad_()
    out = scaled(x).last_hidden_state
    out.backward(torch.randn_like(out))
    assert scaled.unscaled_ops == []
    assert plain < 1e-6  # N(0, 0.02) convolutions through 52 layers
    assert BAND[0] < out.std().item() < BAND[1] and BAND[0] < x.grad.std().item() < BAND[1]
    kinds = {n.target for n in scaled.graph_module.graph.nodes if n.op == "call_function"}
    assert U.hardtanh in kinds and U.conv2d in kinds


def test_a_default_decoder_is_unit_scaled_with_its_kv_cache_off_and_a_cache_asked_for_is_refused() -> None:
    torch.manual_seed(0)
    model = tiny("gpt2", use_cache=True)  # the config's default: the decoder returns a DynamicCache
    ids = torch.randint(0, VOCAB, (2, 8))
    out = unit_scale(model)(ids)
    assert out.past_key_values is None and out.logits.shape == (2, 8, VOCAB) and model.config.use_cache
    with pytest.raises(
        CaptureError, match=r"GPT2LMHeadModel returns a DynamicCache at \['past_key_values'\].*use_cache=False"
    ):
        unit_scale(model)(ids, use_cache=True)


def test_simulate_fp8_rounds_the_operands_of_unit_scaled_addmm_and_conv2d() -> None:
    from unitscale.transforms import simulate_fp8

    torch.manual_seed(0)
    for model, x, twin in [
        (tiny("gpt2"), torch.randint(0, VOCAB, (2, 8)), U.addmm),
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), torch.randn(2, 3, 8, 8), U.conv2d),
    ]:
        simulated = simulate_fp8(unit_scale(model))
        simulated(x)
        nodes = list(simulated.graph_module.graph.nodes)
        for node in (n for n in nodes if n.target is twin):
            operands = node.args[1:3] if twin is U.addmm else node.args[:2]
            rounded = [a.target == torch.ops.unitscale.quantise_bwd for a in operands]
            assert rounded == [True, True] and all(
                a.args[0].target == torch.ops.unitscale.quantise_fwd for a in operands
            )
