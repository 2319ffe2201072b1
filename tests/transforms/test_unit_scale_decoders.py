"""unit_scale on the decoders users build: ``transformers`` models from a default config (``use_cache=True``).

A default config turns the key/value cache on: the forward returns a ``DynamicCache``,
which no graph can return. Wrapped in a module that returns ``.logits`` or not, captured
lazily or with example inputs, each either runs unit-scaled (the capture layer switches
the cache off while it captures) or raises a ``CaptureError`` whose message says to pass
``use_cache=False``; never an error from inside the captured graph.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import unitscale.functional as U
from tests.real_models import VOCAB, _build, gpt2, llama, mistral, qwen2, token_ids
from unitscale.errors import CaptureError
from unitscale.transforms import unit_scale

transformers = pytest.importorskip("transformers")


def bart_decoder(**config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    """BART's decoder as a causal LM (``BartForCausalLM``), sized as ``real_models.bart``."""
    model = _build(
        "bart",
        transformers.AutoModelForCausalLM,
        **{
            "d_model": 64,
            "decoder_layers": 2,
            "decoder_attention_heads": 4,
            "decoder_ffn_dim": 128,
            "encoder_layers": 2,  # the cache is sized by num_hidden_layers, which BART reads from here
            "max_position_embeddings": 64,
            **config,
        },
    )
    return model, (token_ids(),)


DECODERS = {"gpt2": gpt2, "llama": llama, "mistral": mistral, "qwen2": qwen2, "bart": bart_decoder}


class Logits(nn.Module):
    """What a user writes around a causal LM: return the logits only."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids).logits


def _logits(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


# Every decoder captured lazily, wrapped and not; two captured at once from example inputs (the
# capture layer's routes), which costs a capture per route tried.
CASES = [(kind, wrapped, False) for kind in sorted(DECODERS) for wrapped in (True, False)]
CASES += [(kind, wrapped, True) for kind in ("bart", "gpt2") for wrapped in (True, False)]


@pytest.mark.parametrize(
    ("kind", "wrapped", "eager"),
    CASES,
    ids=[f"{k}-{'logits_wrapper' if w else 'model'}-{'example_inputs' if e else 'lazy'}" for k, w, e in CASES],
)
def test_default_config_decoders_run_unit_scaled_or_say_use_cache_false(kind: str, wrapped: bool, eager: bool) -> None:
    lm, (ids,) = DECODERS[kind](use_cache=True)
    assert lm.config.use_cache
    model = Logits(lm) if wrapped else lm
    try:
        scaled = unit_scale(model, example_inputs=(ids,) if eager else None)
        out = _logits(scaled(ids))
        again = _logits(scaled(token_ids(batch=3, seed=2)))  # another batch size: the graph serves it or captures
    except CaptureError as exc:
        # The short, typed fix; the capture layer may instead switch the cache off and run.
        assert "use_cache=False" in str(exc), str(exc)
        assert "SymInt" not in str(exc)
        return
    assert out.shape == (*ids.shape, VOCAB) and again.shape == (3, ids.shape[1], VOCAB)
    assert torch.isfinite(out).all() and 0.5 < out.std().item() < 2.0, (kind, out.std().item())


@pytest.mark.parametrize(
    ("kind", "config", "factor"),
    [("cohere", {}, 0.0625), ("granite", {"logits_scaling": 8.0}, 0.125)],
)
def test_a_constant_on_the_logits_is_dropped_so_the_output_is_unit_scaled(
    kind: str, config: dict[str, Any], factor: float
) -> None:
    # Cohere multiplies its logits by logit_scale (1/16 by default), Granite divides them by
    # logits_scaling: tuned for the original initialisation, they only move a unit-scaled output.
    lm = _build(
        kind,
        transformers.AutoModelForCausalLM,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **config,
    )
    assert getattr(lm.config, "logit_scale", None) == factor or 1 / lm.config.logits_scaling == factor
    scaled = unit_scale(lm)
    out = scaled(token_ids()).logits
    assert 0.5 < out.std().item() < 2.0
    (result,) = [n for n in scaled.graph_module.graph.nodes if n.op == "output"]
    head = [n for n in scaled.graph_module.graph.nodes if n.target is U.scale and n in result.all_input_nodes]
    assert [n.args[1:] for n in head] == [(1.0, 1.0)]
