"""The pass's scales for convolutional networks, against a simulation of what they assume."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from unitscale.transforms._cnn_rules import _post_residual_relu, _ratio


def test_a_relus_mean_to_std_ratio_is_the_closed_form() -> None:
    # ReLU of N(0, 1): mean pdf(0), mean square 1/2
    pdf0 = 1 / math.sqrt(2 * math.pi)
    assert _ratio(F.relu) == pytest.approx(pdf0 / math.sqrt(0.5 - pdf0**2), rel=1e-6)


@pytest.mark.parametrize("tau", [0.5, 0.2])
def test_post_residual_relu_scales_match_a_simulated_chain_of_blocks(tau: float) -> None:
    # Monte Carlo of the assumption: a chain of relu(sqrt(tau) * N(0, 1) + sqrt(1 - tau) * skip),
    # each output scaled by the forward scale and fed on as the next skip.
    forward, backward = _post_residual_relu(tau)
    generator = torch.Generator().manual_seed(0)
    skip = math.sqrt(2) * torch.relu(torch.randn(2_000_000, dtype=torch.float64, generator=generator))
    for _ in range(30):
        z = tau**0.5 * torch.randn(skip.shape, dtype=torch.float64, generator=generator) + (1 - tau) ** 0.5 * skip
        skip = forward * torch.relu(z)
    # The derivation takes the sum as Gaussian (it is a Gaussian plus a rectified one): a few
    # percent off, against the 20% per block that the plain ReLU twin's scale is off.
    assert skip.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.04)  # unit RMS forward
    # the gradient through it: the derivative's RMS, times the backward scale, is 1
    assert backward * (z > 0).double().mean().sqrt().item() == pytest.approx(1.0, abs=0.04)
    assert math.sqrt(2) * (z > 0).double().mean().sqrt().item() > 1.15  # what the plain twin does
