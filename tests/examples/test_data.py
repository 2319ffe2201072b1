"""MarkovSource: the entropy rate and loss floor it reports are what its samples show."""

from __future__ import annotations

import math

import pytest
import torch

from unitscale.errors import InputError
from unitscale.examples.data import MarkovSource


def test_entropy_rate_matches_the_empirical_conditional_entropy_of_samples() -> None:
    source = MarkovSource(vocab_size=8, concentration=0.5, seed=1)
    tokens = source.sample(batch=4000, seq_len=12, generator=torch.Generator().manual_seed(0))
    probs = source.probs[tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]]
    assert -probs.log().mean().item() == pytest.approx(source.entropy_rate, rel=0.01)


def test_samples_start_in_the_stationary_pair_distribution() -> None:
    source = MarkovSource(vocab_size=4, concentration=1.0, seed=0)
    tokens = source.sample(batch=40_000, seq_len=4, generator=torch.Generator().manual_seed(0))
    for t in (0, 2):
        pairs = torch.bincount(tokens[:, t] * 4 + tokens[:, t + 1], minlength=16).double() / 40_000
        torch.testing.assert_close(pairs, source.pair_probs.flatten(), atol=0.01, rtol=0)


def test_loss_floor_is_between_the_entropy_rate_and_uniform_and_tends_to_the_rate() -> None:
    source = MarkovSource(vocab_size=16, concentration=0.3, seed=0)
    assert source.entropy_rate < source.loss_floor(8) < math.log(16)
    assert source.loss_floor(10_000) == pytest.approx(source.entropy_rate, rel=1e-3)


def test_same_seed_same_source_and_lower_concentration_lower_entropy() -> None:
    assert torch.equal(MarkovSource(8, 0.5, seed=3).probs, MarkovSource(8, 0.5, seed=3).probs)
    assert MarkovSource(8, 0.1).entropy_rate < MarkovSource(8, 10.0).entropy_rate


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: MarkovSource(vocab_size=1), r"vocab_size=1 must be an int in 2\.\.256"),
        (lambda: MarkovSource(concentration=0.0), r"concentration=0.0 must be a finite number > 0"),
        (lambda: MarkovSource(4).sample(batch=2, seq_len=1), r"seq_len=1 must be an int >= 2"),
        (lambda: MarkovSource(4).loss_floor(1), r"seq_len=1 must be an int >= 2"),
    ],
)
def test_bad_arguments_raise_input_error(call, message) -> None:
    with pytest.raises(InputError, match=message):
        call()
