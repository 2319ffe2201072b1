"""Twins for the ops of CNNs and modern LLMs: addmm, conv2d, silu, relu, relu6, rms_norm, batch_norm, pooling."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.functional.test_functional import SwapToTwins, assert_unit, stds  # one definition of each
from unitscale.errors import UnknownConstraintError
from unitscale.functional import _pooling


def rms(t: torch.Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


# -- addmm (GPT-2's Conv1D) ---------------------------------------------------------------------------


@pytest.mark.parametrize("m,k,n", [(512, 64, 64), (256, 256, 32), (1024, 16, 512)])
def test_addmm_is_unit_scaled_without_constraint(m, k, n):
    out, (grad_bias, grad_x, grad_w) = stds(lambda b, x, w: U.addmm(b, x, w, constraint=None), (n,), (m, k), (k, n))
    assert_unit(out, 2**0.5)  # a unit product plus a unit bias (unit_scale zeroes biases)
    for value in (grad_bias, grad_x, grad_w):
        assert_unit(value)


def test_addmm_computes_torchs_sum_with_the_product_scaled_by_fan_in():
    b, x, w = torch.randn(8), torch.randn(32, 64), torch.randn(64, 8)
    expected = torch.addmm(b, x, w * 64**-0.5, beta=0.5, alpha=3.0)
    assert torch.allclose(U.addmm(b, x, w, beta=0.5, alpha=3.0, constraint=None), expected, atol=1e-5)


def test_addmm_with_gmean_misses_unit_by_the_same_factor_both_ways():
    x = torch.randn(512, 256, requires_grad=True)
    y = U.addmm(torch.zeros(64), x, torch.randn(256, 64))
    y.backward(torch.randn_like(y))
    assert_unit(y.std().item(), (256 / 64) ** 0.25)
    assert_unit(x.grad.std().item(), (64 / 256) ** 0.25)


# -- conv2d ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch,c_in,size,c_out,kernel,stride,padding,groups",
    [
        (8, 16, 32, 32, 3, 1, 1, 1),
        (16, 32, 16, 64, 3, 2, 1, 1),
        (16, 64, 8, 64, 1, 1, 0, 1),
        (8, 32, 16, 32, 3, 1, "same", 4),
        (16, 3, 32, 16, 7, 2, 3, 1),
    ],
)
def test_conv2d_is_unit_scaled_without_constraint(batch, c_in, size, c_out, kernel, stride, padding, groups):
    out, (grad_x, grad_w) = stds(
        U.conv2d,
        (batch, c_in, size, size),
        (c_out, c_in // groups, kernel, kernel),
        stride=stride,
        padding=padding,
        groups=groups,
        constraint=None,
    )
    # Zero padding leaves border outputs with fewer terms: a few percent below 1 for small maps.
    for value in (out, grad_x, grad_w):
        assert_unit(value, tol=0.2)


def test_conv2d_is_torchs_convolution_scaled_by_fan_in_and_its_bias_gradient_is_unit():
    x, w = torch.randn(16, 8, 12, 12), torch.randn(256, 8, 3, 3)
    b = torch.zeros(256, requires_grad=True)
    out = U.conv2d(x, w, b, padding=1, constraint=None)
    # Along each 12-pixel axis, 34 of the 36 (output, tap) pairs read the input, not its padding.
    assert torch.allclose(out, F.conv2d(x, w, padding=1) / (8 * (34 / 12) ** 2) ** 0.5, atol=1e-5)
    out.backward(torch.randn_like(out))
    assert_unit(b.grad.std().item())


def test_conv2d_with_gmean_trades_forward_against_backward():
    # fan-in 64 * 9, fan-out 16 * 9: gmean misses 1 by (64 / 16) ** 0.25 each way, as linear does.
    x = torch.randn(8, 64, 16, 16, requires_grad=True)
    y = U.conv2d(x, torch.randn(16, 64, 3, 3), padding=1)
    y.backward(torch.randn_like(y))
    assert_unit(y.std().item(), 2**0.5)
    assert_unit(x.grad.std().item(), 2**-0.5)


# -- silu, relu ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(100_000,), (256, 512)])
def test_silu_is_unit_scaled_without_constraint(shape):
    out, (grad,) = stds(U.silu, shape, constraint=None)
    assert_unit(out, tol=0.03)
    assert_unit(grad, tol=0.03)


def test_relu_has_unit_rms_both_ways_and_its_true_gradient():
    x = torch.randn(100_000, requires_grad=True)
    g = torch.randn(100_000)
    y = U.relu(x)
    y.backward(g)
    assert_unit(rms(y), tol=0.02)
    assert_unit(rms(x.grad), tol=0.02)
    assert torch.equal(x.grad, g * (x > 0) * 2**0.5)  # the gradient of sqrt(2) * relu, unaltered
    assert_unit(y.std().item(), (1 - 1 / math.pi) ** 0.5, tol=0.02)  # std 0.826: the mean is 0.56


@pytest.mark.parametrize("low,high", [(0.0, 6.0), (-1.0, 1.0), (-3.0, 0.5), (-0.2, 0.2)])
def test_hardtanh_is_torchs_clamp_with_unit_rms_both_ways(low, high):
    x = torch.randn(200_000, requires_grad=True)
    y = U.hardtanh(x, low, high, constraint=None)
    y.backward(torch.randn_like(y))
    reference = F.hardtanh(x.detach(), low, high)
    scale = (y.detach() / reference)[reference.abs() > 1e-3]
    assert torch.allclose(scale, scale[0].expand_as(scale))  # one factor: the clamp itself is torch's
    assert_unit(rms(y), tol=0.02)
    assert_unit(rms(x.grad), tol=0.02)


def test_relu6_takes_relus_scale_and_the_constraint_joins_unequal_scales():
    x = torch.randn(100_000)
    assert torch.allclose(U.relu6(x), 2**0.5 * F.relu6(x), rtol=1e-4)
    # [-1, 1]: output RMS 0.72, derivative RMS 0.83; gmean scales both ways by one number
    x = torch.randn(100_000, requires_grad=True)
    y = U.hardtanh(x)
    g = torch.randn_like(y)
    y.backward(g)
    forward = (y.detach() / F.hardtanh(x.detach()))[x.detach().abs() > 1e-3][0].item()
    backward = (x.grad / g)[x.detach().abs() < 1][0].item()
    assert forward == pytest.approx(backward, rel=1e-5)
    assert forward == pytest.approx((1 / 0.516 * 1 / 0.6827) ** 0.25, rel=0.01)


def test_a_relu6_convnet_is_unit_scaled_with_no_op_left_over():
    from unitscale.transforms import unit_scale

    model = nn.Sequential(nn.Conv2d(8, 32, 1), nn.ReLU6(), nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU6())
    scaled = unit_scale(model)
    y = scaled(torch.randn(16, 8, 16, 16))
    assert scaled.unscaled_ops == []
    assert 0.7 < rms(y) < 1.3  # a plain ReLU6 stack at torch's init has RMS about 0.25


# -- rms_norm, batch_norm --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4096, 32), (64, 16, 64)])
def test_rms_norm_is_torchs_with_unit_output_and_weight_gradient(shape):
    x = 5 * torch.randn(*shape, requires_grad=True)
    w = torch.ones(shape[-1], requires_grad=True)
    y = U.rms_norm(x, (shape[-1],), w, 1e-6)
    assert torch.allclose(y, F.rms_norm(x, [shape[-1]], w, 1e-6))
    y.backward(torch.randn_like(y))
    assert_unit(y.std().item(), tol=0.02)
    assert_unit(w.grad.std().item(), tol=0.3)


def test_batch_norm_in_training_is_unit_scaled_including_affine_gradients():
    x = 3 * torch.randn(32, 128, 8, 8) + 2
    x.requires_grad_()
    w, b = torch.ones(128, requires_grad=True), torch.zeros(128, requires_grad=True)
    y = U.batch_norm(x, torch.zeros(128), torch.ones(128), w, b, training=True)
    y.backward(torch.randn_like(y))
    assert_unit(y.std().item(), tol=0.02)
    assert_unit(w.grad.std().item())
    assert_unit(b.grad.std().item())


def test_batch_norm_in_eval_normalises_by_the_running_statistics_as_torch_does():
    x, mean, var = torch.randn(4, 8, 5, 5), torch.randn(8), torch.rand(8) + 0.5
    assert torch.allclose(U.batch_norm(x, mean, var), F.batch_norm(x, mean, var))


# -- pooling -------------------------------------------------------------------------------------------


def test_the_largest_of_two_unit_normals_has_unit_second_moment():
    # max(a, b)^2 is a^2 or b^2, symmetric: its mean is exactly 1; one value is itself.
    assert _pooling._max_rms(1) == pytest.approx(1.0, abs=1e-6)
    assert _pooling._max_rms(2) == pytest.approx(1.0, abs=1e-6)
    assert _pooling._max_rms(9) == pytest.approx(
        torch.randn(1_000_000, 9).amax(1).pow(2).mean().sqrt().item(), rel=0.01
    )


@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_max_pool2d_has_unit_rms_both_ways(kernel, stride, padding):
    x = torch.randn(8, 16, 32, 32, requires_grad=True)
    y = U.max_pool2d(x, kernel, stride, padding, constraint=None)
    y.backward(torch.randn_like(y))
    assert_unit(rms(y), tol=0.1)
    assert_unit(rms(x.grad), tol=0.1)


def test_max_pool2d_returns_torchs_indices():
    x = torch.randn(2, 3, 8, 8)
    values, indices = U.max_pool2d(x, 2, return_indices=True, constraint=None)
    expected_values, expected_indices = F.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(indices, expected_indices)
    assert torch.allclose(values, expected_values / _pooling._max_rms(4))


@pytest.mark.parametrize("kernel,stride,padding", [(2, None, 0), (3, 1, 1), (4, 2, 1)])
def test_avg_pool2d_is_unit_scaled_without_constraint(kernel, stride, padding):
    out, (grad,) = stds(lambda x: U.avg_pool2d(x, kernel, stride, padding, constraint=None), (8, 16, 32, 32))
    assert_unit(out)
    assert_unit(grad)


@pytest.mark.parametrize("output_size", [1, (2, 2), 4])
def test_adaptive_avg_pool2d_is_unit_scaled_without_constraint(output_size):
    out, (grad,) = stds(lambda x: U.adaptive_avg_pool2d(x, output_size, constraint=None), (64, 32, 8, 8))
    assert_unit(out)
    assert_unit(grad)


# -- the map and torch's calling conventions -------------------------------------------------------------


def test_torch_map_has_the_cnn_and_llm_twins():
    expected = {
        torch.addmm: U.addmm,
        F.conv2d: U.conv2d,
        F.silu: U.silu,
        F.relu: U.relu,
        torch.relu: U.relu,
        F.rms_norm: U.rms_norm,
        F.batch_norm: U.batch_norm,
        F.max_pool2d: U.max_pool2d,
        F.avg_pool2d: U.avg_pool2d,
        F.adaptive_avg_pool2d: U.adaptive_avg_pool2d,
    }
    for fn, twin in expected.items():
        assert U.torch_map[fn] is twin
    assert {"addmm", "conv2d", "silu", "relu", "rms_norm", "batch_norm", "max_pool2d"} <= set(U.__all__)


@pytest.mark.parametrize(
    "module,shape",
    [
        (nn.Conv2d(4, 8, 3, stride=2, padding=1), (2, 4, 8, 8)),
        (nn.Conv2d(4, 8, 3, padding="same", groups=2, dilation=2), (2, 4, 8, 8)),
        (nn.BatchNorm2d(4), (2, 4, 8, 8)),
        (nn.BatchNorm2d(4).eval(), (2, 4, 8, 8)),
        (nn.MaxPool2d(3, 2, 1), (2, 4, 8, 8)),
        (nn.AvgPool2d(2), (2, 4, 8, 8)),
        (nn.AdaptiveAvgPool2d((1, 1)), (2, 4, 8, 8)),
        (nn.SiLU(), (2, 4, 8)),
        (nn.ReLU(inplace=True), (2, 4, 8)),
        (nn.RMSNorm(8, eps=1e-6), (2, 4, 8)),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_twins_accept_the_arguments_torch_modules_pass(module, shape):
    x = torch.randn(*shape)
    with SwapToTwins() as mode:
        out = module(x.clone())
    assert mode.swapped, f"{module} called no function that has a twin"
    assert out.shape == module(x.clone()).shape


@pytest.mark.parametrize(
    "call",
    [
        lambda: U.addmm(torch.zeros(3), torch.randn(2, 4), torch.randn(4, 3), constraint="geo"),
        lambda: U.conv2d(torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3), constraint="geo"),
        lambda: U.silu(torch.randn(2), constraint="geo"),
        lambda: U.max_pool2d(torch.randn(1, 1, 4, 4), 2, constraint="geo"),
        lambda: U.avg_pool2d(torch.randn(1, 1, 4, 4), 2, constraint="geo"),
        lambda: U.adaptive_avg_pool2d(torch.randn(1, 1, 4, 4), 1, constraint="geo"),
    ],
)
def test_unknown_constraint_names_are_rejected_by_the_new_ops(call):
    with pytest.raises(UnknownConstraintError, match="geo"):
        call()
