"""Tiny ``transformers`` models built from configs (no network, no weights) for tests.

Each builder returns ``(model, example_inputs)``: the model in eval mode with
``use_cache=False`` (a ``DynamicCache`` output is not a pytree, so export would fail on
it), seeded so two calls give the same weights, and a tuple of positional inputs.
Keyword arguments override the config (``gpt2(n_layer=1)``, ``gpt2(use_cache=True)``), so
the sizes live here and a test states only what it changes. Import from a test (or a
benchmark run from the repository root) as ``from tests.real_models import gpt2``. The module
skips when ``transformers`` is missing.

>>> model, (ids,) = gpt2()
>>> type(model).__name__, tuple(ids.shape)
('GPT2LMHeadModel', (2, 16))
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

__all__ = [
    "BUILDERS",
    "VOCAB",
    "albert",
    "bart",
    "bert",
    "bloom",
    "convnextv2",
    "deberta_v2",
    "fnet",
    "gemma",
    "gpt_neox",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "mobilevit",
    "opt",
    "phi3",
    "qwen2",
    "reformer",
    "t5",
    "token_ids",
    "vit",
]

VOCAB = 128
BATCH, SEQ = 2, 16

Built = tuple[torch.nn.Module, tuple[Any, ...]]


def token_ids(batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> torch.Tensor:
    """Random token ids ``(batch, seq)`` below :data:`VOCAB`, from their own generator (the global RNG is untouched)."""
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _build(model_type: str, auto: Any, **config: Any) -> torch.nn.Module:
    cfg = transformers.AutoConfig.for_model(model_type, **{"vocab_size": VOCAB, "use_cache": False, **config})
    torch.manual_seed(0)
    return auto.from_config(cfg).eval()


def gpt2(**config: Any) -> Built:
    """GPT-2 LM head model: 2 layers, width 64, 4 heads; inputs ``(input_ids,)``."""
    model = _build(
        "gpt2",
        transformers.AutoModelForCausalLM,
        **{
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            # GPT-2's default ids (50256) lie outside the tiny vocabulary; transformers warns about it
            "bos_token_id": 0,
            "eos_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def bert(**config: Any) -> Built:
    """BERT base model: 2 layers, width 64, 4 heads; inputs ``(input_ids,)``."""
    model = _build(
        "bert",
        transformers.AutoModel,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            **config,
        },
    )
    return model, (token_ids(),)


def _llama_like(model_type: str, **config: Any) -> torch.nn.Module:
    return _build(
        model_type,
        transformers.AutoModelForCausalLM,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            **config,
        },
    )


def llama(**config: Any) -> Built:
    """Llama causal LM: 2 layers, width 64, 4 heads, 2 KV heads; inputs ``(input_ids,)``."""
    return _llama_like("llama", **config), (token_ids(),)


def mistral(**config: Any) -> Built:
    """Mistral causal LM, sized as :func:`llama`; inputs ``(input_ids,)``."""
    return _llama_like("mistral", **config), (token_ids(),)


def qwen2(**config: Any) -> Built:
    """Qwen2 causal LM, sized as :func:`llama`; inputs ``(input_ids,)``."""
    return _llama_like("qwen2", **config), (token_ids(),)


def gemma(**config: Any) -> Built:
    """Gemma causal LM, sized as :func:`llama` (head dim 16).

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    return _llama_like("gemma", **{"head_dim": 16, **config}), (token_ids(),)


def mixtral(**config: Any) -> Built:
    """Mixtral (mixture of experts: 4 experts, 2 per token), sized as :func:`llama`; inputs ``(input_ids,)``.

    Its experts run ``torch.ops.transformers.grouped_mm_fallback``, a custom op that
    ``transformers.integrations.moe`` defines on import. Not in :data:`BUILDERS`.
    """
    return _llama_like("mixtral", **{"num_local_experts": 4, "num_experts_per_tok": 2, **config}), (token_ids(),)


def t5(lm_head: bool = False, **config: Any) -> Built:
    """T5 encoder-decoder: 2+2 layers, width 64; inputs ``(input_ids, attention_mask, decoder_input_ids)``.

    T5's ``forward`` takes ``decoder_input_ids`` fourth, after ``attention_mask``, so the
    mask (all ones) is passed positionally. ``lm_head=True`` gives
    ``T5ForConditionalGeneration`` (the tied language-model head) instead of ``T5Model``.
    """
    model = _build(
        "t5",
        transformers.AutoModelForSeq2SeqLM if lm_head else transformers.AutoModel,
        **{"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, **config},
    )
    ids = token_ids()
    return model, (ids, torch.ones_like(ids), token_ids(seed=1)[:, :8])


def bart(**config: Any) -> Built:
    """BART encoder-decoder: 2+2 layers, width 64; inputs ``(input_ids,)`` (decoder ids are derived)."""
    model = _build(
        "bart",
        transformers.AutoModel,
        **{
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "max_position_embeddings": 64,
            **config,
        },
    )
    return model, (token_ids(),)


def albert(**config: Any) -> Built:
    """ALBERT base model: 2 layers that share one layer group (run twice), width 64; inputs ``(input_ids,)``.

    Not in :data:`BUILDERS`: kept for what its weight sharing tests (a module that runs more than once).
    """
    model = _build(
        "albert",
        transformers.AutoModel,
        **{
            "hidden_size": 64,
            "embedding_size": 32,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def opt(**config: Any) -> Built:
    """OPT causal LM: 2 layers, width 64; inputs ``(input_ids,)``. Not in :data:`BUILDERS`.

    Its exported graph reshapes the ids with the example's sequence length (``view(ids, [-1, 16])``).
    """
    model = _build(
        "opt",
        transformers.AutoModelForCausalLM,
        **{
            "hidden_size": 64,
            "ffn_dim": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "word_embed_proj_dim": 64,
            "pad_token_id": 0,
            "bos_token_id": 0,
            "eos_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def vit(**config: Any) -> Built:
    """ViT base model: 2 layers, width 64, 32x32 images in 8x8 patches; inputs ``(pixel_values,)``."""
    cfg = transformers.AutoConfig.for_model(
        "vit",
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
            **config,
        },
    )
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg).eval()
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return model, (pixels,)


def mobilevit(**config: Any) -> Built:
    """MobileViT image classifier: widths 8 to 32, two heads, 64x64 images, 4 classes; inputs ``(pixel_values,)``.

    Convolutions with batch norm and SiLU, then transformer blocks over 2x2 patches, an
    in-place dropout before its head, and (at sizes the patches do not divide, such as
    ``image_size=48``) bilinear interpolation. Not in :data:`BUILDERS`.
    """
    cfg = transformers.MobileViTConfig(
        **{
            "image_size": 64,
            "hidden_sizes": [16, 16, 16],
            "neck_hidden_sizes": [8, 8, 8, 16, 16, 16, 32],
            "num_attention_heads": 2,
            "expand_ratio": 2.0,
            "num_labels": 4,
            **config,
        }
    )
    torch.manual_seed(0)
    model = transformers.MobileViTForImageClassification(cfg).eval()
    size = cfg.image_size
    return model, (torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(0)),)


def reformer(**config: Any) -> Built:
    """Reformer causal LM: 2 local-attention layers, width 32, 2 heads, 16 tokens; inputs ``(input_ids,)``.

    Its layers run inside a custom ``torch.autograd.Function`` (``_ReversibleFunction``,
    which recomputes activations in backward), and its chunked attention loops in Python
    over sizes read from the input. Not in :data:`BUILDERS`.
    """
    model = _build(
        "reformer",
        transformers.AutoModelForCausalLM,
        **{
            "hidden_size": 32,
            "num_attention_heads": 2,
            "attention_head_size": 16,
            "attn_layers": ["local", "local"],
            "axial_pos_shape": [4, 4],  # their product is the sequence length
            "axial_pos_embds_dim": [16, 16],  # their sum is the width
            "feed_forward_size": 64,
            "max_position_embeddings": 16,
            "local_attn_chunk_length": 8,
            "is_decoder": True,
            "pad_token_id": 0,
            "eos_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def deberta_v2(**config: Any) -> Built:
    """DeBERTa-v2 base model: 2 layers, width 64, 4 heads, relative attention.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    model = _build(
        "deberta-v2",
        transformers.AutoModel,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "max_relative_positions": 32,
            "position_buckets": 16,
            "pad_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def phi3(**config: Any) -> Built:
    """Phi-3 causal LM (fused QKV and gate-up projections), sized as :func:`llama`.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    return _llama_like("phi3", **{"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0, **config}), (token_ids(),)


def gpt_neox(**config: Any) -> Built:
    """GPT-NeoX causal LM (parallel attention and MLP, partial rotary): 2 layers, width 64.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    model = _build(
        "gpt_neox",
        transformers.AutoModelForCausalLM,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "bos_token_id": 0,
            "eos_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def bloom(**config: Any) -> Built:
    """BLOOM causal LM (ALiBi positions, tied head): 2 layers, width 64, 4 heads.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    model = _build(
        "bloom",
        transformers.AutoModelForCausalLM,
        **{
            "hidden_size": 64,
            "n_layer": 2,
            "n_head": 4,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(),)


def fnet(**config: Any) -> Built:
    """FNet base model (Fourier token mixing, no attention): 2 layers, width 64.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    model = _build(
        "fnet",
        transformers.AutoModel,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
            "use_tpu_fourier_optimizations": False,
            **config,
        },
    )
    return model, (token_ids(),)


def convnextv2(**config: Any) -> Built:
    """ConvNeXt V2 image classifier: 2 stages (widths 8, 16), 32x32 images, 4 classes.

    Inputs ``(pixel_values,)``. Not in :data:`BUILDERS`.
    """
    cfg = transformers.ConvNextV2Config(
        **{
            "num_channels": 3,
            "num_stages": 2,
            "hidden_sizes": [8, 16],
            "depths": [1, 1],
            "image_size": 32,
            "num_labels": 4,
            **config,
        }
    )
    torch.manual_seed(0)
    model = transformers.ConvNextV2ForImageClassification(cfg).eval()
    return model, (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def swinv2(**config: Any) -> Built:
    """Swin Transformer V2 image classifier: 2 stages (embedding 16, depths 1, 1), window 4, 32x32 images.

    Inputs ``(pixel_values,)``. Not in :data:`BUILDERS`.
    """
    cfg = transformers.Swinv2Config(
        **{
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
            "num_labels": 4,
            **config,
        }
    )
    torch.manual_seed(0)
    model = transformers.Swinv2ForImageClassification(cfg).eval()
    return model, (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def longformer(**config: Any) -> Built:
    """Longformer base model (sliding-window attention, window 6): 2 layers, width 64.

    Inputs ``(input_ids,)``. Not in :data:`BUILDERS`.
    """
    model = _build(
        "longformer",
        transformers.AutoModel,
        **{
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "attention_window": 6,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
            **config,
        },
    )
    return model, (token_ids(seq=12),)


def patchtst(**config: Any) -> Built:
    """PatchTST forecaster: 3 series of 32 steps in patches of 8, width 32, 2 layers, 8 steps ahead.

    Inputs ``(past_values,)``. Not in :data:`BUILDERS`.
    """
    cfg = transformers.PatchTSTConfig(
        **{
            "num_input_channels": 3,
            "context_length": 32,
            "patch_length": 8,
            "patch_stride": 8,
            "d_model": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 64,
            "prediction_length": 8,
            **config,
        }
    )
    torch.manual_seed(0)
    model = transformers.PatchTSTForPrediction(cfg).eval()
    return model, (torch.randn(BATCH, 32, 3, generator=torch.Generator().manual_seed(0)),)


class _FixedNoise(torch.nn.Module):
    """A ViT-MAE model given one fixed ``noise``, so its random masking is the same on every call and sample."""

    def __init__(self, model: torch.nn.Module, noise: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("noise", noise)

    def forward(self, pixel_values: torch.Tensor) -> Any:
        noise = self.noise.to(pixel_values.dtype).expand(pixel_values.shape[0], -1)  # the same patches each sample
        return self.model(pixel_values=pixel_values, noise=noise)


def vit_mae(**config: Any) -> Built:
    """ViT-MAE encoder (masked autoencoder, half the patches kept): 32x32 images in 8x8 patches, width 32.

    Its masking draws noise on each call; the model is wrapped to take one fixed ``noise``
    (a buffer), so every call masks the same patches. Inputs ``(pixel_values,)``. Not in
    :data:`BUILDERS`.
    """
    cfg = transformers.ViTMAEConfig(
        **{
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "mask_ratio": 0.5,
            **config,
        }
    )
    torch.manual_seed(0)
    model = transformers.ViTMAEModel(cfg).eval()
    noise = torch.rand(1, (32 // 8) ** 2, generator=torch.Generator().manual_seed(1))
    return _FixedNoise(model, noise), (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


#: name -> builder, for parametrised tests.
BUILDERS = {
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "t5": t5,
    "bart": bart,
    "vit": vit,
    "mistral": mistral,
    "qwen2": qwen2,
}
