"""Every tool on models we did not write: which work, and which refuse and why.

Each model is a ``transformers`` architecture built from a tiny config (random weights, no
download), or one of ours. Each tool runs once on it: ``capture`` (the route taken),
``track_scales``, ``trace_exec_order``, ``partition`` into 2 stages by FLOPs with ``verify``
and ``split_spec``, ``unit_scale`` (output std of the unit-scaled model, ops left unscaled)
and, in full mode, ``run_pipeline`` (2 ranks, 1F1B, gloo), compared with the model. A cell is
``ok`` or what the tool says; a tool that fails with anything but one of our typed errors is
marked ``UNTYPED``. No timing: these models are tiny, and ``bench_analysis.py`` measures what
scale tracking costs on models of a realistic size. Quick mode: two models, no pipelines.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the unitscale beside this file, not an installed one

from unitscale import partition, run_pipeline, track_scales, unit_scale
from unitscale.capture import (
    capture,  # noqa: E402
    trace_exec_order,  # noqa: E402
)
from unitscale.examples.models import TinyGPT, resnet18  # noqa: E402

VOCAB, BATCH, SEQ = 128, 4, 16
#: what the page checks the rows against (``benchmarks/record.py`` records it): no cell of any row
#: is a failure other than one of the library's typed errors
TARGETS = [{"what": "every tool on every model works or fails with a typed error", "never": "UNTYPED"}]
_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
_IDS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}

#: name -> (model type, transformers Auto class name, config, input kind: "ids", "t5" or "pixels")
ZOO: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "gpt2": ("gpt2", "AutoModelForCausalLM", {"n_embd": 64, "n_layer": 2, "n_head": 4, **_IDS}, "ids"),
    "bert": ("bert", "AutoModel", _SMALL, "ids"),
    "llama": ("llama", "AutoModelForCausalLM", {**_SMALL, "num_key_value_heads": 2}, "ids"),
    "mistral": ("mistral", "AutoModelForCausalLM", {**_SMALL, "num_key_value_heads": 2}, "ids"),
    "qwen2": ("qwen2", "AutoModelForCausalLM", {**_SMALL, "num_key_value_heads": 2}, "ids"),
    "gemma": ("gemma", "AutoModelForCausalLM", {**_SMALL, "num_key_value_heads": 2, "head_dim": 16}, "ids"),
    "phi3": ("phi3", "AutoModelForCausalLM", {**_SMALL, "num_key_value_heads": 2, **_IDS}, "ids"),
    "mixtral": (
        "mixtral",
        "AutoModelForCausalLM",
        {**_SMALL, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
        "ids",
    ),
    "gpt_neox": ("gpt_neox", "AutoModelForCausalLM", _SMALL, "ids"),
    "opt": (
        "opt",
        "AutoModelForCausalLM",
        {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
        | {"word_embed_proj_dim": 64},
        "ids",
    ),
    "falcon": (
        "falcon",
        "AutoModelForCausalLM",
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        "ids",
    ),
    "bloom": ("bloom", "AutoModelForCausalLM", {"hidden_size": 64, "n_layer": 2, "n_head": 4}, "ids"),
    "gpt_bigcode": ("gpt_bigcode", "AutoModelForCausalLM", {"n_embd": 64, "n_layer": 2, "n_head": 4, **_IDS}, "ids"),
    "roberta": ("roberta", "AutoModel", _SMALL, "ids"),
    "distilbert": ("distilbert", "AutoModel", {"dim": 64, "hidden_dim": 128, "n_layers": 2, "n_heads": 4}, "ids"),
    "t5": ("t5", "AutoModel", {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_heads": 4}, "t5"),
    "bart": (
        "bart",
        "AutoModel",
        {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4}
        | {"decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128},
        "ids",
    ),
    "vit": (
        "vit",
        "AutoModel",
        {**_SMALL, "image_size": 32, "patch_size": 8},
        "pixels",
    ),
    "swin": (
        "swin",
        "AutoModel",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4},
        "pixels",
    ),
    "convnext": ("convnext", "AutoModel", {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2}, "pixels"),
    "resnet (transformers)": (
        "resnet",
        "AutoModel",
        {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1]},
        "pixels",
    ),
    "mobilenet_v2": ("mobilenet_v2", "AutoModel", {"image_size": 128, "depth_multiplier": 0.25}, "pixels128"),
}
QUICK = ("gpt2", "mobilenet_v2")


def _inputs(kind: str) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    if kind == "pixels":
        return (torch.randn(BATCH, 3, 32, 32, generator=g),)
    if kind == "pixels128":
        return (torch.randn(BATCH, 3, 128, 128, generator=g),)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return (ids, torch.ones_like(ids), ids[:, :8]) if kind == "t5" else (ids,)


def _build(name: str) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    if name == "TinyGPT (ours)":
        return TinyGPT(VOCAB, 64, 2, 4, SEQ).eval(), _inputs("ids")
    if name == "resnet18 (ours)":
        return resnet18(num_classes=10).eval(), _inputs("pixels")
    import transformers

    model_type, auto, config, kind = ZOO[name]
    extra = {"vocab_size": VOCAB, "use_cache": False} if kind in ("ids", "t5") else {}
    cfg = transformers.AutoConfig.for_model(model_type, **extra, **config)
    return getattr(transformers, auto).from_config(cfg).eval(), _inputs(kind)


def _main_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    return out[0]


def _verdict(fn: Callable[[], str]) -> str:
    """What ``fn`` says (``ok ...``), or the error it raised."""
    try:
        said = fn()
    except Exception as exc:  # the point: typed or not, every failure is shown
        typed = type(exc).__module__.startswith("unitscale")
        said = f"{'' if typed else 'UNTYPED '}{type(exc).__name__}: {str(exc).splitlines()[0][:60]}..."
    return said


def _row(name: str, pipelines: bool) -> dict[str, Any]:
    model, inputs = _build(name)
    row: dict[str, Any] = {"model": name}

    row["capture"] = _verdict(lambda: capture(model, inputs).route)
    row["track_scales"] = _verdict(lambda: f"{len(track_scales(model, inputs, abs_max=False).rows)} rows")
    row["exec order"] = _verdict(
        lambda: f"{len(trace_exec_order(model, example_inputs=inputs).module_forward_order)} calls"
    )
    plan: list[Any] = []

    def split() -> str:
        plan.append(partition(model, 2, inputs, cost="flops"))
        return "verified" if plan[0].verify() else "outputs differ"

    row["partition"] = _verdict(split)
    row["split_spec"] = _verdict(lambda: f"{len(plan[0].split_spec())} split point(s)") if plan else "no plan"

    def scaled() -> str:
        unit = unit_scale(model, example_inputs=inputs)
        std = _main_tensor(unit(*inputs)).float().std().item()
        left = len(unit.unscaled_ops)
        return f"std {std:.2g}, {left} op(s) left" if left else f"std {std:.2g}, all scaled"

    row["unit_scale"] = _verdict(scaled)
    if pipelines:

        def piped() -> str:
            out = run_pipeline(plan[0], inputs, num_microbatches=2, schedule="1f1b", timeout=120)
            diff = (_main_tensor(out).float() - _main_tensor(model(*inputs)).float()).abs().max().item()
            return f"max diff {diff:.1g}"

        row["pipeline"] = _verdict(piped if plan else lambda: "no plan")
    return row


def main(quick: bool = False) -> list[dict[str, Any]]:
    """Run every tool on every model of the zoo; print and return one row per model."""
    torch.set_num_threads(1)  # one thread, quick or full: see bench_analysis.py
    warnings.filterwarnings("ignore")  # transformers' notes on tiny configs; failures are shown in the cells
    try:
        import transformers  # noqa: F401

        names = list(QUICK if quick else ZOO)
    except ImportError:
        print("(transformers is not installed: our own models only)")
        names = []
    names += [] if quick else ["TinyGPT (ours)", "resnet18 (ours)"]
    rows = []
    for name in names:
        row = _row(name, pipelines=not quick)
        rows.append(row)
        cells = ", ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in list(row.items())[1:])
        print(f"{name}: {cells}", flush=True)
    failing = [r["model"] for r in rows if any(str(v).startswith("UNTYPED") for v in r.values())]
    print(f"{len(rows)} models; untyped failures: {', '.join(failing) or 'none'}")
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
