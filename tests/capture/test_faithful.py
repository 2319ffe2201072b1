"""Issue 36, item by item: each tool's graph is the model (forward and backward), or it refuses by name.

Oracles: the model's own forward and ``.backward()`` in the mode of the call.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from tests.capture.test_faithful_zoo import GradTimes100, RoundSTE  # the zoo's Functions, shared
from unitscale import inline, track_scales, unit_scale
from unitscale.capture import capture, clear_capture_cache
from unitscale.errors import NoRouteError, TraceError
from unitscale.transforms import apply_transform


class Quantise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RoundSTE.apply(x)


class Quantised(nn.Module):
    """A linear layer whose output goes through a straight-through estimator in a submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.quant = Quantise()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant(self.lin(x) * 3)


class Amplified(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GradTimes100.apply(self.lin(x))


def _input_grad(model: nn.Module, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    leaf = x.clone().requires_grad_()
    model(leaf).backward(g)
    model.zero_grad(set_to_none=True)
    return leaf.grad


def _input_row(report):  # type: ignore[no-untyped-def]
    (row,) = [r for r in report if r.op == "input"]
    return row


@pytest.mark.parametrize("make", [Quantised, Amplified])
def test_track_scales_auto_keeps_a_custom_functions_backward(make: type[nn.Module]) -> None:
    """Straight-through: fx reported input-gradient std 0 (the model's 1.0x); x100: 1/100 of the true one."""
    torch.manual_seed(0)
    model, x, g = make(), torch.randn(16, 8), torch.randn(16, 8)
    want = _input_grad(model, x, g).std(correction=0).item()
    report = track_scales(model, x.clone().requires_grad_(), g)
    assert report.route == "eager"
    assert _input_row(report).backward == pytest.approx(want, rel=1e-4)
    assert "RoundSTE" in report.trace_failure or "GradTimes100" in report.trace_failure


@pytest.mark.parametrize("route", ["fx", "export"])
def test_forced_route_refuses_a_custom_function_naming_class_module_and_loss(route: str) -> None:
    model = Quantised()
    with pytest.raises(NoRouteError) as caught:
        track_scales(model, torch.randn(4, 8), route=route)
    message = str(caught.value)
    assert "RoundSTE" in message and "module 'quant'" in message and "RoundSTE.backward" in message
    with pytest.raises(NoRouteError, match="RoundSTE"):
        unit_scale(model, example_inputs=torch.randn(4, 8), route=route)


def test_unit_scale_auto_keeps_the_function_by_dynamo() -> None:
    torch.manual_seed(0)
    model, x, g = Quantised(), torch.randn(16, 8), torch.randn(16, 8)
    want = _input_grad(model, x, g)
    same = apply_transform(model, lambda gm: gm, example_inputs=(x,))
    assert same.route == "dynamo" and set(same.reasons) == {"fx", "export", "export-strict"}
    torch.testing.assert_close(_input_grad(same, x, g), want)
    scaled = unit_scale(model, example_inputs=x)
    assert _input_grad(scaled, x, g).std() > 0  # through fx or export: exactly 0


def test_a_capture_under_no_grad_is_not_reused_with_grad() -> None:
    """unit_scale called first under no_grad reused that graph: a straight-through model's x.grad was 0."""
    torch.manual_seed(0)
    model, x, g = Quantised(), torch.randn(16, 8), torch.randn(16, 8)
    want = _input_grad(model, x, g)
    same = apply_transform(model, lambda gm: gm)
    with torch.no_grad():
        same(x)
    torch.testing.assert_close(_input_grad(same, x, g), want)
    scaled = unit_scale(model)
    with torch.no_grad():
        scaled(x)
    assert _input_grad(scaled, x, g).std() > 0


def test_transformer_encoder_in_eval_under_no_grad_then_with_grad() -> None:
    """Its no_grad fast path has no derivative: an untyped RuntimeError from the first call's check."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    torch.manual_seed(0)
    x, g = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    want = _input_grad(model, x, g)
    same = apply_transform(model, lambda gm: gm)
    with torch.no_grad():
        torch.testing.assert_close(same(x), model(x))
    torch.testing.assert_close(_input_grad(same, x, g), want)
    scaled = unit_scale(model)
    with torch.no_grad():
        scaled(x)
    assert torch.isfinite(_input_grad(scaled, x, g)).all()


def test_capture_cache_key_holds_grad_mode_autocast_and_hooks() -> None:
    model, x = nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4)
    clear_capture_cache()
    first = capture(model, x, cache=True)
    assert capture(model, x, cache=True) is first
    with torch.no_grad():
        assert capture(model, x, cache=True) is not first
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert capture(model, x, cache=True) is not first
    handle = model[0].register_forward_hook(lambda m, i, o: o * 2)
    hooked = capture(model, x, cache=True)
    assert hooked is not first
    torch.testing.assert_close(hooked.graph_module(x), model(x))
    handle.remove()
    assert capture(model, x, cache=True) is not hooked


def test_track_scales_under_inference_mode_says_it_has_no_backward() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with torch.inference_mode():
        report = track_scales(model, torch.randn(2, 4))
    assert not report.backward_recorded
    assert all(row.backward is None for row in report)
    assert "no backward pass recorded: called under torch.inference_mode()" in report.table()
    assert "no backward pass" in repr(report)
    assert track_scales(model, torch.randn(2, 4)).backward_recorded


def test_track_scales_keeps_a_hook_on_the_root() -> None:
    """fx traced the root's forward, skipping its pre-hook: std 0.478 reported, 0.926 real."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    model.register_forward_pre_hook(lambda m, inputs: (inputs[0] * 10,))
    x, g = torch.randn(16, 8), torch.randn(16, 8)
    want_out = model(x).std(correction=0).item()
    want = _input_grad(model, x, g).std(correction=0).item()
    report = track_scales(model, x.clone().requires_grad_(), g)
    assert report.route == "eager"
    assert report.rows[-1].forward == pytest.approx(want_out, rel=1e-4)
    assert _input_row(report).backward == pytest.approx(want, rel=1e-4)
    with pytest.raises(NoRouteError, match="forward pre-hook"):
        track_scales(model, x, route="fx")


def test_inline_refuses_a_hook_it_would_drop_and_keeps_it_as_a_call() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    model[0].register_forward_hook(lambda m, i, o: o + 1)
    x = torch.randn(4, 8)
    with pytest.raises(TraceError, match=r"module '0' \(Linear\).*forward hook"):
        inline(model)
    with pytest.raises(TraceError, match="forward hook"):  # it blamed dropout
        inline(model, example_inputs=(x,))
    kept = inline(model, lambda m, name: name != "0", example_inputs=(x,))
    torch.testing.assert_close(kept(x), model(x))


def test_inline_mismatch_blames_dropout_only_when_there_is_dropout() -> None:
    class Noisy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.randn_like(x)

    with pytest.raises(TraceError) as caught:
        inline(nn.Sequential(nn.Linear(4, 4), Noisy()), example_inputs=(torch.randn(2, 4),))
    assert "dropout" not in str(caught.value) and "random ops" in str(caught.value)
    with pytest.raises(TraceError, match=r"dropout in training mode \(1\)"):
        inline(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train(), example_inputs=(torch.randn(2, 4),))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad=True")
def test_eager_route_runs_a_reentrant_checkpoint_backward() -> None:
    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.tanh(checkpoint(self.a, x, use_reentrant=True)))

    torch.manual_seed(0)
    model, x, g = Checkpointed(), torch.randn(4, 8), torch.randn(4, 8)
    want = _input_grad(model, x, g).std(correction=0).item()
    model.a.weight.grad = kept = torch.ones_like(model.a.weight)
    report = track_scales(model, x.clone().requires_grad_(), g, route="eager")
    assert _input_row(report).backward == pytest.approx(want, rel=1e-4)
    assert model.a.weight.grad is kept and torch.equal(kept, torch.ones_like(kept))
    with pytest.raises(NoRouteError, match="use_reentrant=True"):
        track_scales(model, x, route="export")


def test_unit_scale_with_example_inputs_follows_train_on_checkpoint_sequential() -> None:
    """After .train() the call fell to TorchDynamo, which cannot take checkpoint_sequential: CaptureError."""

    class Sequenced(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint_sequential(self.seq, 2, x, use_reentrant=False)

    torch.manual_seed(0)
    model, x, g = Sequenced().eval(), torch.randn(4, 8), torch.randn(4, 8)
    same = apply_transform(model, lambda gm: gm, example_inputs=(x,))
    same.train()
    torch.testing.assert_close(_input_grad(same, x, g), _input_grad(model.train(), x, g))
    assert same.route == "fx"
    scaled = unit_scale(Sequenced().eval(), example_inputs=x)
    scaled.train()
    assert scaled(x).shape == x.shape and scaled.route == "fx"


def test_nested_track_scales_leaves_its_own_ops_out_of_the_outer_report() -> None:
    """The outer (eager) report held the inner tracker's statistics ops: 46 rows where the model has 5."""

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.inner = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.tanh(self.lin(x))
            track_scales(self.inner, y.detach())
            return y

    report = track_scales(Outer(), torch.randn(4, 8), route="eager")
    assert [row.op for row in report] == ["input", "linear", "tanh", "Tensor.detach", "linear"]


def test_reformer_reversible_layers_are_refused_on_export_and_recorded_on_auto() -> None:
    """Reformer's reversible layers are a custom Function: on export every row had no backward std."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "reformer",
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=2,
        attention_head_size=16,
        feed_forward_size=64,
        axial_pos_embds=False,
        attn_layers=["local", "local"],
        local_attn_chunk_length=8,
        max_position_embeddings=64,
        num_hashes=1,
    )
    torch.manual_seed(0)
    model = transformers.ReformerModel(config).train()  # its backward needs training mode
    ids = torch.randint(0, 64, (2, 16))
    with pytest.raises(NoRouteError, match=r"_ReversibleFunction in module 'encoder'"):
        track_scales(model, ids, route="export")
    report = track_scales(model, ids)
    assert report.route == "eager" and report.backward_recorded


def test_a_no_grad_block_in_forward_is_kept_or_refused() -> None:
    """fx records no grad mode: its graph sent gradient through a branch the model computes without it."""

    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                frozen = self.a(x)
            return self.b(torch.tanh(frozen) + x)

    torch.manual_seed(0)
    model, x, g = Frozen(), torch.randn(4, 8), torch.randn(4, 8)
    want = _input_grad(model, x, g).std(correction=0).item()
    report = track_scales(model, x.clone().requires_grad_(), g)
    assert report.route == "eager"
    assert _input_row(report).backward == pytest.approx(want, rel=1e-4)
    with pytest.raises(NoRouteError, match=r"grad mode switched off .* in the root \(Frozen\)"):
        track_scales(model, x, route="fx")
    with pytest.raises(TraceError, match="switches grad mode off"):
        inline(model)


@torch.library.custom_op("unitscale_tests::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_twice.register_autograd(lambda ctx, g: g * 3)  # a backward that is not the forward's derivative


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.unitscale_tests.twice(self.fc(x))


def test_a_custom_ops_registered_backward_is_kept_by_export_not_refused() -> None:
    """torch.library custom ops run through a Function torch generates; export keeps the op whole."""
    torch.manual_seed(0)
    model, x = CustomOp(), torch.randn(3, 4, requires_grad=True)
    model(x).backward(torch.ones(3, 4))
    true = x.grad.std(correction=0).item()
    x.grad = None
    report = track_scales(model, x, torch.ones(3, 4), route="export")
    (row,) = [r for r in report if r.op == "input"]
    assert row.backward == pytest.approx(true, rel=1e-5)
