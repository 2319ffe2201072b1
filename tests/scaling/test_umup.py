"""u-μP parameter roles, ops with multipliers, modules and the depth rule."""

import copy
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import unitscale.functional as U
from unitscale import nn as unn
from unitscale import scaling as umup
from unitscale.errors import InputError, MultiplierError, UnknownRoleError, UntaggedParameterError
from unitscale.examples.umup_models import SPGPT, UmupGPT


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_tag_reads_the_width_from_the_shape_by_role_and_keeps_the_parameter():
    w = torch.nn.Parameter(torch.randn(64, 8, 3, 3))
    assert umup.tag(w, "weight") is w and umup.role_of(w) == umup.ParamRole("weight", 72, None)
    emb = umup.tag(torch.nn.Parameter(torch.randn(100, 32)), "embedding", depth=None)
    assert umup.role_of(emb).width == 32
    assert umup.role_of(umup.tag(torch.nn.Parameter(torch.ones(5)), "norm")).width == 5
    assert umup.role_of(umup.tag(torch.nn.Parameter(torch.ones(5, 3)), "output", width=7, depth=2)) == umup.ParamRole(
        "readout", 7, 2
    )


def test_roles_survive_deepcopy_and_torch_save_of_the_module():
    layer = umup.set_depth(unn.Linear(16, 8, bias=True), 3)
    copied = copy.deepcopy(layer)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for module in (copied, loaded):
        assert umup.role_of(module.weight) == umup.ParamRole("weight", 16, 3)
        assert umup.role_of(module.bias) == umup.ParamRole("bias", 8, 3)
    assert copied.weight is not layer.weight and torch.equal(copied.weight, layer.weight)


@pytest.mark.parametrize("role", ["gain", "Weight", "", None, 3])
def test_unknown_roles_are_refused_naming_the_known_ones(role):
    with pytest.raises(UnknownRoleError, match=r"is not a u-μP role; pass one of weight, bias, norm, readout"):
        umup.tag(torch.nn.Parameter(torch.zeros(2)), role)


def test_tag_refuses_plain_tensors_and_bad_sizes():
    with pytest.raises(UntaggedParameterError, match="pass a torch.nn.Parameter"):
        umup.tag(torch.zeros(2), "bias")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(MultiplierError, match="must be an int >= 1"):
            umup.tag(torch.nn.Parameter(torch.zeros(2)), "bias", depth=bad)
        with pytest.raises(MultiplierError, match="must be an int >= 1"):
            umup.tag(torch.nn.Parameter(torch.zeros(2)), "bias", width=bad)


@pytest.mark.parametrize("mult", [0, -1.0, math.inf, math.nan, "2", True])
@pytest.mark.parametrize(
    "build",
    [
        lambda m: unn.LinearReadout(8, 4, mult=m),
        lambda m: unn.SwiGLU(8, mult=m),
        lambda m: unn.MHSA(8, heads=2, mult=m),
        lambda m: umup.residual_taus(2, residual_mult=m),
        lambda m: UmupGPT(8, width=16, loss_mult=m),
        lambda m: U.silu_glu(torch.ones(2), torch.ones(2), mult=m),
        lambda m: U.cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), mult=m),
    ],
)
def test_multipliers_that_are_not_finite_and_positive_are_refused(build, mult):
    with pytest.raises(MultiplierError, match=r"must be a finite number > 0 \(an α of u-μP"):
        build(mult)


def test_residual_taus_follow_appendix_g_and_match_the_reference_ratio_form():
    taus = umup.residual_taus(3)
    # Reference form: t_i = 1 / sqrt(L/2 + i) with L = 6 branches, and tau = t² / (1 + t²).
    expected = [(1 / (3 + i)) / (1 + 1 / (3 + i)) for i in range(6)]
    assert taus == pytest.approx(expected)
    # With every α = 1 the embedding, all attention and all MLP branches carry a third each.
    weights, skip = [], 1.0
    for tau in reversed(taus):
        weights.append(skip * tau)
        skip *= 1 - tau
    attn, mlp = sum(weights[1::2]), sum(weights[0::2])
    assert (skip, attn, mlp) == pytest.approx((1 / 3, 1 / 3, 1 / 3))


@settings(max_examples=25, deadline=None)
@given(
    blocks=st.integers(1, 12),
    res=st.floats(0.1, 10),
    ratio=st.floats(0.1, 10),
)
def test_residual_taus_give_attention_and_mlp_the_requested_shares(blocks, res, ratio):
    taus = umup.residual_taus(blocks, residual_mult=res, attn_ratio=ratio)
    weights, skip = [], 1.0
    for tau in reversed(taus):
        weights.append(skip * tau)
        skip *= 1 - tau
    attn, mlp = sum(weights[1::2]), sum(weights[0::2])
    assert all(0 < t < 1 for t in taus)
    assert attn / mlp == pytest.approx(ratio**2, rel=1e-6)
    assert (attn + mlp) / 2 / skip == pytest.approx(res**2, rel=1e-6)


def test_residual_taus_refuse_a_depth_below_one():
    with pytest.raises(MultiplierError, match="blocks=0 must be an int >= 1"):
        umup.residual_taus(0)


@pytest.mark.parametrize("mult", [0.5, 1.0, 2.0, 8.0])
def test_silu_glu_is_unit_scaled_with_true_gradients_at_any_mult(mult):
    x, g = (torch.randn(200_000, requires_grad=True) for _ in range(2))
    y = U.silu_glu(x, g, mult=mult)
    assert y.std().item() == pytest.approx(1.0, abs=0.03)
    # One factor in both passes: the gradient is the true gradient of the scaled function.
    factor = (y / (x * g * torch.sigmoid(mult * g))).detach()
    assert torch.allclose(factor, factor[0].expand_as(factor), rtol=1e-4)
    y.backward(torch.randn_like(y))
    assert x.grad.std().item() == pytest.approx(1.0, abs=0.05)


def test_readout_scales_by_mult_over_fan_in_forward_and_fan_out_backward():
    readout = unn.LinearReadout(256, 32, mult=4.0)
    x = torch.randn(2048, 256, requires_grad=True)
    y = readout(x)
    assert torch.allclose(y, 4.0 / 256 * x @ readout.weight.T, atol=1e-5)
    y.backward(torch.randn_like(y))
    assert x.grad.std().item() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("head_dim", [8, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_umup_attention_scores_are_near_unit_std_for_every_head_width(head_dim, causal):
    q, k, v = torch.randn(3, 8, 4, 64, head_dim).unbind(0)
    out = U.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / head_dim, constraint=None)
    assert out.std().item() == pytest.approx(1.0, abs=0.1)


def test_cross_entropy_value_is_torchs_on_mult_times_the_logits():
    logits, target = torch.randn(4, 6, 10), torch.randint(0, 10, (4, 6))
    expected = torch.nn.functional.cross_entropy(2.0 * logits.reshape(-1, 10), target.reshape(-1))
    loss = U.cross_entropy(logits.reshape(-1, 10), target.reshape(-1), mult=2.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_modules_tag_every_parameter_with_its_role():
    model = UmupGPT(16, width=32, depth=3)
    roles = {name: umup.role_of(p) for name, p in model.named_parameters()}
    assert all(role is not None for role in roles.values())
    assert roles["tokens.weight"] == umup.ParamRole("embedding", 32, None)
    assert roles["readout.weight"] == umup.ParamRole("readout", 32, None)
    assert roles["norm.weight"] == umup.ParamRole("norm", 32, None)
    assert roles["blocks.2.mlp.down.weight"] == umup.ParamRole("weight", 128, 3)
    assert roles["blocks.0.attn_norm.weight"] == umup.ParamRole("norm", 32, 3)
    assert [b.attn_tau for b in model.blocks] == pytest.approx(umup.residual_taus(3)[0::2])


def test_conv2d_and_rms_norm_are_unit_scaled_and_tagged():
    conv = unn.Conv2d(16, 32, 3, padding=1, constraint="to_output_scale")
    assert umup.role_of(conv.weight) == umup.ParamRole("weight", 144, None)
    assert conv(torch.randn(4, 16, 8, 8)).std().item() == pytest.approx(1.0, abs=0.1)
    assert unn.RMSNorm(16)(3 * torch.randn(64, 16)).std().item() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("width", [32, 128])
def test_umup_gpt_starts_unit_scaled_and_at_the_uniform_loss(width):
    model = UmupGPT(16, width=width, depth=2, head_dim=16)
    idx = torch.randint(0, 16, (8, 17))
    hidden = {}
    model.norm.register_forward_hook(lambda m, a, out: hidden.setdefault("in", a[0]))
    loss = model.loss(idx[:, :-1], idx[:, 1:])
    assert hidden["in"].std().item() == pytest.approx(1.0, abs=0.2)
    # μP's readout multiplier makes the logits start small: the loss starts near log(vocab).
    assert loss.item() == pytest.approx(math.log(16), abs=0.05)


def test_model_family_refuses_a_width_not_divisible_by_the_head_width():
    for family in (UmupGPT, SPGPT):
        with pytest.raises(InputError, match="width=20 is not divisible by head_dim=16"):
            family(16, width=20)
