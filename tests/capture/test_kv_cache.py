"""A default ``transformers`` decoder (``use_cache=True``) is captured as users build it, cache off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.real_models import bart, gpt2, llama, mistral, qwen2
from unitscale.capture import capture, no_kv_cache
from unitscale.capture.toolkit import dynamo_graph
from unitscale.errors import KVCacheError


class Wraps(nn.Module):
    """A model around a decoder that returns only its logits."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(ids).logits


def _logits(out: object) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    return out["logits"] if "logits" in out else out["last_hidden_state"]  # type: ignore[index, operator]


@pytest.mark.parametrize("route", ["export", "dynamo", "eager"])
def test_a_default_gpt2_is_captured_on_every_route_with_its_cache_off(route: str) -> None:
    model, (ids,) = gpt2(use_cache=True)
    with torch.no_grad():
        want = model(ids).logits  # the model as users run it, cache and all
    cap = capture(model, ids, route=route)
    assert cap.kv_cache_disabled == ("",)  # the model and its layers share one config
    assert model.config.use_cache is True  # put back
    if route != "eager":
        with torch.no_grad():
            torch.testing.assert_close(_logits(cap.graph_module(ids)), want)


@pytest.mark.parametrize(
    "build, routes",
    [(llama, ("export", "dynamo")), (mistral, ("export",)), (qwen2, ("export",)), (bart, ("export",))],
    ids=["llama", "mistral", "qwen2", "bart"],
)
def test_default_decoders_export_and_go_through_dynamo(build, routes: tuple[str, ...]) -> None:
    model, (ids,) = build(use_cache=True)
    with torch.no_grad():
        want = _logits(model(ids))
    for route in routes:
        cap = capture(model, ids, route=route)
        assert cap.kv_cache_disabled == ("",) and model.config.use_cache is True
        with torch.no_grad():
            torch.testing.assert_close(_logits(cap.graph_module(ids)), want)


def test_a_model_wrapping_a_default_decoder_is_captured_too() -> None:
    decoder, (ids,) = llama(use_cache=True)
    model = Wraps(decoder)
    with torch.no_grad():
        want = model(ids)
    cap = capture(model, ids, route="export")
    assert cap.kv_cache_disabled == ("decoder",)
    with torch.no_grad():
        torch.testing.assert_close(cap.graph_module(ids), want)
    found = dynamo_graph(model, (ids,), {})
    assert found.graph_module is not None and decoder.config.use_cache is True


def test_a_cache_asked_for_as_an_input_gets_the_one_fix_from_every_route() -> None:
    model, (ids,) = gpt2(use_cache=True)
    fix = r"GPT2LMHeadModel returns a DynamicCache at .*past_key_values.* pass use_cache=False to the model"
    with pytest.raises(KVCacheError, match=fix):
        capture(model, ids, {"use_cache": True})
    with pytest.raises(KVCacheError, match=fix):
        dynamo_graph(model, (ids,), {"use_cache": True})


def test_no_kv_cache_switches_each_config_once_and_puts_it_back_on_failure() -> None:
    model, _ = gpt2(use_cache=True)
    assert model.config is model.transformer.config  # one config, two modules
    with pytest.raises(RuntimeError, match="inside"), no_kv_cache(model) as switched:
        assert switched == ("",) and model.config.use_cache is False
        raise RuntimeError("inside")
    assert model.config.use_cache is True
    off, _ = gpt2()  # built with use_cache=False: nothing to switch
    with no_kv_cache(off) as switched:
        assert switched == () and off.config.use_cache is False


def test_scale_tracking_of_a_default_decoder_is_that_of_the_same_decoder_built_without_a_cache() -> None:
    from unitscale.tracking import track_scales

    cached, (ids,) = gpt2(use_cache=True)
    plain, _ = gpt2()  # the same seeded weights, use_cache=False
    grad = torch.randn(2, 16, 128)
    with_cache, without = track_scales(cached, ids, {"logits": grad}), track_scales(plain, ids, {"logits": grad})
    assert [(r.node, r.module_path) for r in with_cache] == [(r.node, r.module_path) for r in without]
    for a, b in zip(with_cache, without, strict=True):
        assert a.scale == b.scale
    assert cached.config.use_cache is True
