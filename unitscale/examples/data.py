"""A synthetic language whose entropy, and so the best loss a model can reach, is known exactly."""

from __future__ import annotations

import math

import torch

from unitscale.errors import ConfigError
from unitscale.examples._checks import check_int, check_positive

__all__ = ["MarkovSource"]


class MarkovSource:
    """A random order-2 Markov source over ``vocab_size`` tokens.

    Each next token's distribution ``probs[a, b]`` depends on the two before it; sequences start
    in the stationary distribution of token pairs.

    Args:
        concentration: the symmetric Dirichlet concentration each row is drawn with: small values
            give peaked, predictable rows (low entropy), large ones near-uniform rows.
        seed: seed of the table (the source is a pure function of its arguments).

    Raises:
        ConfigError: (an :class:`~unitscale.errors.InputError`) for ``vocab_size`` outside
            2..256, a ``concentration`` that is not a finite number > 0, or a negative ``seed``.

    >>> import torch
    >>> from unitscale.examples import MarkovSource
    >>> source = MarkovSource(vocab_size=8, concentration=0.5, seed=0)
    >>> seeded = torch.Generator().manual_seed(0)
    >>> tokens = source.sample(batch=2, seq_len=10, generator=seeded)
    >>> tokens.shape, tokens.dtype
    (torch.Size([2, 10]), torch.int64)
    >>> source.loss_floor(seq_len=10) > source.entropy_rate
    True
    """

    def __init__(self, vocab_size: int = 16, concentration: float = 0.3, seed: int = 0) -> None:
        # vocab_size**3 transition probabilities are held: 256 is 130 MB of float64.
        check_int("MarkovSource", "vocab_size", vocab_size, 2, 256)
        concentration = check_positive("MarkovSource", "concentration", concentration)
        check_int("MarkovSource", "seed", seed, 0)
        self.vocab_size = vocab_size
        gen = torch.Generator().manual_seed(seed)
        gamma = torch._standard_gamma(
            torch.full((vocab_size, vocab_size, vocab_size), float(concentration)).double(), gen
        )
        self.probs = gamma / gamma.sum(-1, keepdim=True)
        # The pair chain (a, b) -> (b, c) has transition probs[a, b, c]; iterate to its fixed point.
        pi = torch.full((vocab_size, vocab_size), 1.0 / vocab_size**2, dtype=torch.float64)
        for _ in range(10_000):
            nxt = torch.einsum("ab,abc->bc", pi, self.probs)
            if torch.allclose(nxt, pi, atol=1e-15, rtol=0):
                break
            pi = nxt
        self.pair_probs = nxt / nxt.sum()

    @property
    def entropy_rate(self) -> float:
        """The entropy per token in nats, ``sum_ab pi(a, b) H(probs[a, b])`` with ``pi`` the stationary pairs."""
        row_entropy = -(self.probs * self.probs.clamp_min(1e-300).log()).sum(-1)
        return float((self.pair_probs * row_entropy).sum())

    def loss_floor(self, seq_len: int) -> float:
        """The least mean next-token cross-entropy (nats) on sequences of ``seq_len`` tokens.

        A model predicts tokens ``1 .. seq_len-1``; token 1 has one token of context
        (conditional entropy ``H(x1 | x0)``), every later one has two (the entropy rate).
        """
        check_int("MarkovSource.loss_floor", "seq_len", seq_len, 2)
        joint = self.pair_probs
        first = joint.sum(1)
        h_pair = -(joint * joint.clamp_min(1e-300).log()).sum()
        h_first = -(first * first.clamp_min(1e-300).log()).sum()
        h_second_given_first = float(h_pair - h_first)
        return (h_second_given_first + (seq_len - 2) * self.entropy_rate) / (seq_len - 1)

    def sample(self, batch: int, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``batch`` sequences of ``seq_len`` tokens (int64, shape ``(batch, seq_len)``)."""
        check_int("MarkovSource.sample", "batch", batch, 1)
        check_int("MarkovSource.sample", "seq_len", seq_len, 2)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ConfigError(
                f"MarkovSource.sample: generator={generator!r:.60} is a {type(generator).__name__}; "
                "pass a torch.Generator or None"
            )
        v = self.vocab_size
        pair = torch.multinomial(self.pair_probs.flatten(), batch, replacement=True, generator=generator)
        out = torch.empty(batch, seq_len, dtype=torch.int64)
        out[:, 0], out[:, 1] = pair // v, pair % v
        for t in range(2, seq_len):
            rows = self.probs[out[:, t - 2], out[:, t - 1]]
            out[:, t] = torch.multinomial(rows, 1, generator=generator).squeeze(1)
        return out

    def __repr__(self) -> str:
        rate, most = self.entropy_rate, math.log(self.vocab_size)
        return f"MarkovSource(vocab_size={self.vocab_size}, entropy_rate={rate:.4f} nats of at most {most:.4f})"
