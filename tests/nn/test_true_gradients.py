"""Issue 26, items 1-4, each against an oracle that shares no code with unitscale.

The true gradient comes from central finite differences in float64 of the loss the
forward computes: every parameter's and input's gradient must be a positive multiple
of it (unit scaling changes scales, never directions).
"""

import math

import pytest
import torch

import unitscale.functional as U
from unitscale import nn as unn
from unitscale.examples.umup_models import UmupGPT


def finite_difference(
    loss, tensor: torch.Tensor, eps: float = 1e-6, limit: int = 400
) -> tuple[torch.Tensor, list[int]]:
    """Central differences of ``loss()`` in up to ``limit`` evenly spread coordinates of ``tensor``."""
    flat = tensor.data.view(-1)
    picked = sorted(set(torch.linspace(0, flat.numel() - 1, min(limit, flat.numel())).round().long().tolist()))
    values = []
    with torch.no_grad():
        for i in picked:
            kept = flat[i].item()
            flat[i] = kept + eps
            up = loss().item()
            flat[i] = kept - eps
            down = loss().item()
            flat[i] = kept
            values.append((up - down) / (2 * eps))
    return torch.tensor(values, dtype=torch.float64), picked


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a @ b) / (a.norm() * b.norm()))


def assert_true_gradients(loss, tensors: dict[str, torch.Tensor], limit: int = 400) -> None:
    for tensor in tensors.values():
        tensor.grad = None
    loss().backward()
    for name, tensor in tensors.items():
        true, picked = finite_difference(loss, tensor, limit=limit)
        if true.norm() < 1e-9:
            continue  # no signal to compare (a parameter the loss does not reach yet)
        got = tensor.grad.reshape(-1)[picked]
        assert cosine(got, true) > 0.9999, f"{name}: cosine {cosine(got, true):.6f} with the true gradient"


def fixed_output_loss(module: torch.nn.Module, x: torch.Tensor):
    target = torch.randn_like(module(x))
    return lambda: (module(x) * target).sum()


# -- item 1: attention's q, k and v share one backward scale -----------------------------------------


@pytest.mark.parametrize("constraint", [None, "gmean", "to_output_scale"])
@pytest.mark.parametrize("mult", [0.5, 1.0, 4.0])
def test_mhsa_gives_true_gradients_for_its_input_and_parameters(constraint, mult):
    torch.manual_seed(0)
    module = unn.MHSA(16, heads=2, is_causal=True, constraint=constraint, mult=mult).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    assert_true_gradients(fixed_output_loss(module, x), {"input": x, **dict(module.named_parameters())})


@pytest.mark.parametrize("constraint", ["gmean", "to_output_scale"])
@pytest.mark.parametrize(("norm", "mlp"), [("layer_norm", "gelu"), ("rms_norm", "swiglu")])
def test_transformer_layer_gives_true_gradients_with_a_constraint(constraint, norm, mlp):
    torch.manual_seed(0)
    layer = unn.TransformerLayer(16, 2, is_causal=True, constraint=constraint, norm=norm, mlp=mlp, attn_mult=2.0)
    layer = layer.double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    assert_true_gradients(fixed_output_loss(layer, x), {"input": x, **dict(layer.named_parameters())}, limit=48)


def test_the_umup_gpt_example_gives_true_gradients_for_every_parameter():
    torch.manual_seed(0)
    model = UmupGPT(11, width=16, depth=2, head_dim=8, max_len=8, attn_mult=2.0, ffn_mult=0.5, loss_mult=3.0).double()
    idx = torch.randint(0, 11, (2, 7))
    assert_true_gradients(lambda: model.loss(idx[:, :-1], idx[:, 1:]), dict(model.named_parameters()), limit=24)


def test_attention_alone_gives_true_gradients_when_q_k_v_are_one_tensor():
    # the functional op, fed three views of one tensor: their gradients meet again there
    torch.manual_seed(0)
    qkv = torch.randn(3, 2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 2, 6, 8, dtype=torch.float64)

    def loss():
        return (U.scaled_dot_product_attention(*qkv.unbind(0), scale=0.1, constraint=None) * target).sum()

    assert_true_gradients(loss, {"qkv": qkv})


# -- item 2: dropout's eval mode and inplace ---------------------------------------------------------


def test_dropout_module_in_eval_mode_matches_the_mean_of_training_mode():
    torch.manual_seed(0)
    layer, x = unn.Dropout(0.3), torch.randn(8)
    mean = torch.stack([layer.train()(x) for _ in range(10_000)]).mean(0)
    assert torch.allclose(layer.eval()(x), mean, atol=0.05)
    assert torch.allclose(layer.eval()(x), math.sqrt(0.7) * x)


def test_inplace_dropout_module_leaves_the_callers_tensor_equal_to_the_result():
    x = torch.randn(100)
    for mode in (True, False):
        layer = unn.Dropout(0.5, inplace=True).train(mode)
        y = layer(x)
        assert y is x


# -- item 4: a one-element summand adds no variance -------------------------------------------------


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("constraint", [None, "gmean", "to_output_scale"])
def test_adding_a_one_element_tensor_is_left_unscaled(shape, constraint):
    torch.manual_seed(0)
    x = torch.randn(4096, requires_grad=True)
    b = torch.full(shape, 0.7, requires_grad=True)
    y = U.add(x, b, constraint=constraint)
    # torch's own add is the oracle for the value: nothing to rescale
    assert torch.allclose(y, torch.add(x, b))
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(x.grad, g)
    # The offset's gradient sums 4096 unit gradients (std 64). Unconstrained, it is scaled to unit std; under a
    # constraint it takes the one scale of the output and x's gradient, 1 here: the true gradient.
    expected = g.sum().item() / 64 if constraint is None else g.sum().item()
    assert b.grad.reshape(()).item() == pytest.approx(expected, rel=1e-5)


def test_transformer_layer_without_a_constraint_is_documented_as_not_giving_true_gradients():
    # Its docstring says so: each branch reaches the residual stream scaled by its own factor.
    torch.manual_seed(0)
    layer = unn.TransformerLayer(16, 2, is_causal=True, constraint=None).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    loss = fixed_output_loss(layer, x)
    loss().backward()
    true, picked = finite_difference(loss, x)
    assert cosine(x.grad.reshape(-1)[picked], true) < 0.999
    assert "not a true gradient" in " ".join(unn.TransformerLayer.__doc__.split())
