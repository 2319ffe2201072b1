"""Gates and hard activations: each scale is a Gaussian moment, checked against one measured in float64.

The oracle is a million-sample Monte Carlo estimate of the same moment through torch's own
op and autograd (its derivative), independent of the closed forms and the quadrature.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import unitscale.functional as U
from unitscale.functional import _gates, _normal

SAMPLES = 2_000_000


def _measured(fn, moment: str) -> float:  # type: ignore[no-untyped-def]
    x = torch.randn(SAMPLES, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = fn(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    if moment == "value_rms":
        return y.detach().pow(2).mean().sqrt().item()
    if moment == "value_std":
        return y.detach().std().item()
    return grad.pow(2).mean().sqrt().item()


def test_sigmoid_moments_match_monte_carlo() -> None:
    value, grad = _gates._sigmoid_moments()
    assert math.sqrt(value) == pytest.approx(_measured(torch.sigmoid, "value_rms"), rel=2e-3)
    assert math.sqrt(grad) == pytest.approx(_measured(torch.sigmoid, "grad_rms"), rel=2e-3)


def test_hardsigmoid_closed_form_matches_monte_carlo() -> None:
    value, grad = _gates._hardsigmoid_moments()
    assert math.sqrt(value) == pytest.approx(_measured(F.hardsigmoid, "value_rms"), rel=2e-3)
    assert math.sqrt(grad) == pytest.approx(_measured(F.hardsigmoid, "grad_rms"), rel=2e-3)
    # by hand: the derivative is 1/6 on |x| < 3, so its RMS is P(|x| < 3)**0.5 / 6
    assert math.sqrt(grad) == pytest.approx(math.erf(3 / 2**0.5) ** 0.5 / 6, rel=1e-12)


def test_hardswish_closed_form_matches_monte_carlo() -> None:
    mean, square, grad = _gates._hardswish_moments()
    assert math.sqrt(square - mean * mean) == pytest.approx(_measured(F.hardswish, "value_std"), rel=2e-3)
    assert math.sqrt(grad) == pytest.approx(_measured(F.hardswish, "grad_rms"), rel=2e-3)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(0, 5),
    low=st.floats(-4, 4),
    width=st.floats(0.1, 6),
)
def test_partial_moments_match_numerical_integration(k: int, low: float, width: float) -> None:
    high = low + width
    grid = torch.linspace(low, high, 20001, dtype=torch.float64)
    density = torch.exp(-(grid**2) / 2) / math.sqrt(2 * math.pi)
    expected = torch.trapezoid(grid**k * density, grid).item()
    assert _normal.partial_moment(k, low, high) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(
    ("op", "torch_op"), [(U.sigmoid, torch.sigmoid), (U.hardsigmoid, F.hardsigmoid), (U.hardswish, F.hardswish)]
)
def test_gates_are_torchs_op_times_one_positive_number_both_ways(op, torch_op) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    y = op(x)
    plain_y = torch_op(x).detach()
    ratio = (y.detach() / plain_y)[plain_y != 0]  # hardswish is 0 below -3
    assert torch.allclose(ratio, ratio[0].expand_as(ratio)) and ratio[0] > 0
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    (plain,) = torch.autograd.grad(torch_op(x), x, g)
    # the default constraints keep one scale: the gradient is the true one of the scaled op
    assert torch.allclose(got, plain * ratio[0])


def test_a_gate_makes_the_product_with_a_unit_activation_unit_rms() -> None:
    torch.manual_seed(0)
    x, z = torch.randn(64, 32, 16, 16), torch.randn(64, 32, 1, 1)
    for gate in (U.sigmoid, U.hardsigmoid):
        product = x * gate(z)
        assert product.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.05)


def test_hardswish_unconstrained_has_unit_output_and_gradient() -> None:
    torch.manual_seed(0)
    x = torch.randn(1_000_000, requires_grad=True)
    y = U.hardswish(x, constraint=None)
    y.backward(torch.randn_like(y))
    assert y.std().item() == pytest.approx(1.0, abs=0.01)
    assert x.grad.std().item() == pytest.approx(1.0, abs=0.01)


def test_unconstrained_mul_scales_a_broadcast_gates_gradient_by_its_copies() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 8, 12, 12, requires_grad=True)
    gate = torch.randn(16, 8, 1, 1, requires_grad=True)
    y = U.mul(x, gate, constraint=None)
    assert torch.equal(y, x * gate)
    g = torch.randn_like(y)
    y.backward(g)
    # the true gradient of the gate sums over 144 pixels; the twin divides it by 144**0.5
    assert torch.allclose(gate.grad, (g * x).sum((2, 3), keepdim=True) / 12, atol=1e-5)
    assert torch.allclose(x.grad, g * gate)
    assert gate.grad.std().item() == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("constraint", ["to_output_scale", "gmean"])
def test_constrained_mul_is_a_scaled_product_with_torchs_gradient(constraint: str) -> None:
    """A gate computed from the activation it gates meets it at the fork: one scale both ways keeps gradients true."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, 6, requires_grad=True)
    gate = torch.randn(4, 3, 1, 1, requires_grad=True)
    y = U.mul(x, gate, constraint=constraint)
    # the one scale the constraint picks from the forward's 1 and the gate's 36**-0.5 (x's gradient scale is 1)
    factor = 1.0 if constraint == "to_output_scale" else (36**-0.5) ** (1 / 3)
    assert torch.allclose(y, factor * x * gate)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(gate.grad, factor * (g * x).sum((2, 3), keepdim=True))
    assert torch.allclose(x.grad, factor * g * gate)
