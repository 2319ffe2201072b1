"""Tools on captured graphs: execution order against hooks, inline on flat graphs, scale listings."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.real_models import gpt2, llama, reformer
from unitscale.capture import capture, capture_exec_order, trace_exec_order
from unitscale.errors import TraceError
from unitscale.examples.models import MLP
from unitscale.fx import inline
from unitscale.tracking.analysis import analyse_module, track_scales


def _hook_order(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[str]:
    """Modules that own parameters, in the order forward pre-hooks see them."""
    seen: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: seen.append(name))
        for name, m in model.named_modules()
        if any(True for _ in m.parameters(recurse=False))
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("route", ["export", "eager"])
def test_exec_order_from_a_capture_agrees_with_forward_pre_hooks(
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]], route: str
) -> None:
    model, inputs = build()
    expected = _hook_order(model, inputs)
    order = capture_exec_order(capture(model, inputs, route=route))
    owners = set(expected)
    assert [name for name in order.module_names() if name in owners] == expected
    assert order.root is model and order.module_forward_order[0] is model
    # Every parameter is used, each once in the first-use order, and the first is the embedding's.
    assert len(order.param_forward_order) == len({id(p) for p in model.parameters()})
    assert order.param_forward_order[0] is model.get_input_embeddings().weight


def test_trace_exec_order_falls_back_to_the_capture_when_fx_fails() -> None:
    model, inputs = llama()
    with pytest.raises(TraceError, match=r"(?s)could not trace LlamaForCausalLM.*Or pass example_inputs=\.\.\."):
        trace_exec_order(model)
    order = trace_exec_order(model, example_inputs=inputs)
    assert order.module_names()[:3] == ["", "model", "model.embed_tokens"]
    assert order.param_names()[:2] == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]


def _modules_that_ran(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[str]:
    """Every module whose forward ran, in the order forward pre-hooks first see them."""
    seen: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: None if name in seen else seen.append(name))
        for name, m in model.named_modules()
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


class _Recomputed(torch.autograd.Function):
    """Runs ``block`` without keeping its activations and runs it again in backward, as reversible layers do."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, block: nn.Module) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.block = block
        with torch.no_grad():
            return block(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            ctx.block(x).backward(grad)
        return x.grad, None


class RecomputedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = float(x.shape[-1]) ** -0.5  # a Python number from a size: torch.fx cannot trace it
        return self.out(_Recomputed.apply(self.inp(x) * scale, self.block))


@pytest.mark.parametrize(
    "build", [lambda: (RecomputedBlock(), (torch.randn(3, 4),)), reformer], ids=["hand", "reformer"]
)
def test_trace_exec_order_lists_the_modules_run_inside_a_custom_autograd_function(
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]],
) -> None:
    # torch.export puts a Function's ops under the module that applied it: Reformer's order listed
    # 10 modules of the 41 that ran (those in its reversible layers missing, their parameters listed).
    model, inputs = build()
    order = trace_exec_order(model, example_inputs=inputs)
    assert order.module_names() == _modules_that_ran(model, inputs)
    out = model.train()(*inputs)  # Reformer's backward runs only in training mode
    (out if isinstance(out, torch.Tensor) else out.logits).sum().backward()
    used = {name for name, p in model.named_parameters() if p.grad is not None}  # Reformer's lm_head.bias is not
    assert len(used) > 4 and set(order.param_names()) == used


def test_trace_exec_order_on_fx_traceable_models_is_unchanged() -> None:
    model = MLP(4)
    assert trace_exec_order(model, example_inputs=torch.randn(2, 4)).module_names() == ["", "fc1", "act", "fc2"]
    with pytest.raises(TraceError):

        class Branchy(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x if x.sum() > 0 else -x

        trace_exec_order(Branchy())


def test_inline_returns_an_exported_graph_as_it_is() -> None:
    model, inputs = llama()
    gm = capture(model, inputs, route="export").graph_module
    assert gm is not None
    code = gm.code
    flat = inline(gm, example_inputs=inputs)
    assert flat is gm and flat.code == code
    assert torch.equal(flat(*inputs).logits, gm(*inputs).logits)


def test_analyse_module_on_llama_lists_the_exported_graph_with_module_paths() -> None:
    torch.manual_seed(0)
    model, inputs = llama()
    report = track_scales(model, inputs, route="export")
    assert report.route == "export"
    q = [row for row in report if row.module_path == "model.layers.0.self_attn.q_proj" and row.op == "linear"]
    assert len(q) == 1 and q[0].shape == (2, 16, 64)
    assert q[0].forward is not None and q[0].backward is not None and 0 < q[0].forward < 10
    code = analyse_module(model, inputs, syntax_highlight=False, route="export")
    assert code.startswith("# LlamaForCausalLM: captured by torch.export\n")
    line = re.search(r"^ +linear = torch\.ops\.aten\.linear\.default\(.*$", code, re.M)
    assert line is not None
    assert re.search(r"  # \(-> [\d.e-]+, <- [\d.e-]+\)  model\.layers\.0\.self_attn\.q_proj$", line.group(0))
    assert len(re.findall(r"  model\.layers\.0\.", code)) > 20


def test_auto_capture_records_llama_eagerly_with_the_exports_scales_and_module_paths() -> None:
    model, inputs = llama()
    torch.manual_seed(0)
    eager = track_scales(model, inputs)
    torch.manual_seed(0)
    exported = track_scales(model, inputs, route="export")
    assert eager.route == "eager" and "co_varnames" in eager.trace_failure
    q = [row for row in eager if row.module_path == "model.layers.0.self_attn.q_proj" and row.op == "linear"]
    (q_exported,) = [r for r in exported if r.module_path == "model.layers.0.self_attn.q_proj" and r.op == "linear"]
    assert len(q) == 1 and q[0].shape == q_exported.shape == (2, 16, 64)
    assert q[0].scale.forward == pytest.approx(q_exported.scale.forward, rel=1e-4)
    assert q[0].scale.backward == pytest.approx(q_exported.scale.backward, rel=1e-4)
    # every module the export names, the eager record names too
    assert {r.module_path for r in exported} - {r.module_path for r in eager} <= {""}
    code = analyse_module(model, inputs, syntax_highlight=False)
    header = []
    for text in code.splitlines():
        if not text.startswith("# "):
            break
        header.append(text[2:])
    assert " ".join(header).startswith(
        "LlamaForCausalLM: ops recorded as they ran; torch.fx could not trace LlamaForCausalLM at "
    )
    assert max(len(text) for text in code.splitlines()[: len(header)]) <= 88  # the reason wraps
    scale = r"# \(-> [\d.e-]+, <- [\d.e-]+\)"
    line = re.search(rf"^linear\S* +{scale}  linear in model\.layers\.0\.self_attn\.q_proj$", code, re.M)
    assert line is not None
    assert len(re.findall(r" in model\.layers\.0\.", code)) > 20


def test_track_scales_exports_a_model_once_per_input_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = torch.export.export

    def counting(module: nn.Module, args: tuple[torch.Tensor, ...], *a: object, **k: object) -> object:
        calls.append(tuple(args[0].shape))
        return real(module, args, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.export, "export", counting)
    model, (ids,) = llama()
    torch.manual_seed(0)
    first = track_scales(model, (ids,), route="export")
    torch.manual_seed(0)
    second = track_scales(model, (ids,), route="export")
    assert calls == [(2, 16)] and first.route == second.route == "export"
    assert [r.scale for r in first] == [r.scale for r in second]
    track_scales(model, (ids[:, :8],), route="export")
    assert calls == [(2, 16), (2, 8)]
    track_scales(model, (ids,))  # auto: recorded eagerly, no export
    assert calls == [(2, 16), (2, 8)]


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(self.fc(x)))


@pytest.mark.parametrize("route", ["fx", "export", "export-strict", "dynamo", "eager"])
def test_every_route_gives_the_same_exec_order_with_a_module_called_twice(route: str) -> None:
    model = _Twice()
    cap = capture(model, torch.randn(2, 4), route=route)
    order = capture_exec_order(cap)
    assert order.module_names() == ["", "fc", "fc", "out"]
    assert order.param_names() == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert [u.module for u in order.module_to_param_usage_infos[model]][:1] == [model.fc]
