"""The unit-scaling pass as a list of named rules: each default rule on a small graph, and a user's rule.

Each rule runs on a :class:`PassState` of a traced function, after the rules it needs, and its
result is held against the function's own numbers (torch's op, a residual pair's ``2**-0.5``, a
dropped constant's ``1/c``, a pooled ReLU's mean) and against the pass run without it; the
registry's errors name what the user passed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import unitscale.functional as U
from unitscale.errors import NotCallableError, RuleError
from unitscale.transforms import PassState, register_rule, rule_names, unit_scale, unregister_rule
from unitscale.transforms import rules as rules_module


def _fresh(fn: Callable[..., Any], example: tuple[torch.Tensor, ...], replace: dict[Any, Any] | None) -> PassState:
    """A state for ``fn``'s graph (traced, unless a graph module already), its nodes holding their values."""
    gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
    _values(gm, example)
    return PassState(gm, dict(replace or {}), dict(U.torch_map))


def _state(
    fn: Callable[..., Any], *example: torch.Tensor, upto: str, replace: dict[Any, Any] | None = None
) -> PassState:
    """A state for ``fn``'s graph after the default rules before ``upto``."""
    state = _fresh(fn, example, replace)
    for rule in rules_module.rules():
        if rule.name == upto:
            return state
        rule.fn(state)
    raise AssertionError(upto)


def _passed(
    fn: Callable[..., Any], *example: torch.Tensor, without: str = "", replace: dict[Any, Any] | None = None
) -> PassState:
    """A state for ``fn``'s graph after every default rule but ``without``: the pass with and without a rule."""
    assert not without or without in rule_names()
    state = _fresh(fn, example, replace)
    for rule in rules_module.rules():
        if rule.name != without:
            rule.fn(state)
    return state


def _targets(state: PassState) -> list[Any]:
    return [n.target for n in state.graph.nodes if n.op == "call_function"]


def _values(gm: fx.GraphModule, example: tuple[torch.Tensor, ...]) -> None:
    """Put each node's value on it as ``example_value``, as the capture layer does."""

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            n.meta["example_value"] = out
            return out

    Recorder(gm).run(*example)


def _run(state: PassState, *args: torch.Tensor) -> torch.Tensor:
    state.graph.lint()
    state.gm.recompile()
    return state.gm(*args)


def test_the_default_rules_run_in_order_each_documented() -> None:
    assert rule_names() == [
        "follow_in_place_changes", "leave_regions_whole", "apply_replacements", "fold_written_out_ops",
        "analyse", "keep_rotary_embeddings", "keep_soft_caps", "residual_adds",
        "unconstrain_folded_on_trunk", "swap_ops", "drop_constant_factors", "constrain_before_batch_norms",
        "rescale_relus_after_residuals", "scale_global_pools", "rescale_max_pools_of_relus",
        "freeze_before_batch_norm_blocks", "freeze_trunk_batch_norms", "balance_gates", "share_loss_scales",
    ]  # fmt: skip
    assert all(rule.fn.__doc__ and rule.fn.__name__ == rule.name for rule in rules_module.rules())


def test_the_api_page_and_the_module_list_the_rules_in_their_order() -> None:
    page = (Path(__file__).parents[2] / "docs" / "api" / "transforms.md").read_text()
    listed = page[page.index("(`rule_names()` lists them):") : page.index("`register_rule(")]
    assert re.findall(r"`(\w+)`", listed) == rule_names()
    numbered = re.findall(r"(\d+)\. ``(\w+)``", rules_module.__doc__ or "")
    assert numbered == [(str(i), name) for i, name in enumerate(rule_names(), 1)]


def test_follow_in_place_changes_makes_a_later_read_see_the_change() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        skip = x * 1.0
        y = skip.add_(1.0)
        return skip * y

    x = torch.randn(4)
    state = _state(f, x, upto="follow_in_place_changes")
    rules_module._residuals.follow_in_place_changes(state)
    (out,) = [n for n in state.graph.nodes if n.op == "call_function" and n.args and n.name.startswith("mul_1")]
    assert all(a.name == "add_" for a in out.args)  # both factors read the changed tensor
    assert torch.equal(_run(state, x), f(x.clone()))


def test_residual_adds_weigh_skip_and_branch_by_tau() -> None:
    w = torch.randn(8, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + F.linear(x, w)

    x = torch.randn(16, 8)
    state = _state(f, x, upto="residual_adds")
    rules_module._residuals.residual_adds(state)
    (join,) = [n for n in state.graph.nodes if n.target is U.residual_add]
    assert join.args[2] == 0.5 and join in state.done
    # residual_add(r, s, 0.5) is (r + s) * 2**-0.5 forward: the model's own sum, scaled
    torch.testing.assert_close(_run(state, x), f(x) * 2**-0.5)


def test_a_residual_chain_is_followed_through_a_cast_of_the_stream() -> None:
    """The running mean's ``k`` counts on through ``.to(float32)``, as an exported Llama casts its stream.

    The oracle is the plain sum ``x + f_1 + f_2``: each branch weighs alike, so the second add's
    tau is ``1 / 3``. Failed before: the cast cut the chain and the second add got 0.5, where the
    same model without the cast got ``1 / 3`` (an exported Llama and its TorchDynamo graph disagreed).
    """
    w1, w2 = torch.randn(8, 8), torch.randn(8, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(F.layer_norm(x, (8,)), w1)
        x = x.to(torch.float32)
        return x + F.linear(F.layer_norm(x, (8,)), w2)

    state = _state(f, torch.randn(16, 8), upto="residual_adds")
    rules_module._residuals.residual_adds(state)
    assert [n.args[2] for n in state.graph.nodes if n.target is U.residual_add] == pytest.approx([1 / 2, 1 / 3])


def test_swap_ops_unconstrains_a_twin_on_the_trunk() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    x = torch.randn(64, 8)
    state = _state(f, x, upto="swap_ops")
    rules_module._op_rules.swap_ops(state)
    (gelu,) = [n for n in state.graph.nodes if n.target is U.gelu]
    assert gelu.kwargs["constraint"] is None
    torch.testing.assert_close(_run(state, x), U.gelu(x, constraint=None))


def test_drop_constant_factors_keeps_the_sign_of_a_factor_a_linear_layer_reads() -> None:
    w = torch.randn(8, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x * -8.0, w)

    x = torch.randn(4, 8)
    state = _state(f, x, upto="drop_constant_factors")
    rules_module._op_rules.drop_constant_factors(state)
    # the twin sets the scale: -8 becomes -1, so the output is the model's divided by 8
    torch.testing.assert_close(_run(state, x), U.linear(x, w, constraint=None) * -1.0)
    assert torch.allclose(_run(state, x) * 8 * 8**0.5, f(x), rtol=1e-4, atol=1e-4)


def test_keep_soft_caps_keeps_cap_times_tanh_of_x_over_cap() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return 30.0 * torch.tanh(x / 30.0)

    x = torch.randn(4, 8)
    state = _state(f, x, upto="keep_soft_caps")
    rules_module._kept.keep_soft_caps(state)
    assert sorted(n.name for n in state.kept) == ["mul", "tanh", "truediv"]
    assert all("soft-capping (30 * tanh(x / 30)" in reason for reason in state.kept.values())


def _vmap_of_gelu() -> fx.GraphModule:
    """The graph TorchDynamo makes of ``torch.vmap(F.gelu)(x)`` for ``x`` of 3 rows, written out."""
    from torch._functorch import predispatch as vmap_calls

    graph = fx.Graph()
    x = graph.placeholder("x")
    level = graph.call_function(vmap_calls._vmap_increment_nesting, (3, "error"))
    batched = graph.call_function(vmap_calls._add_batch_dim, (x, 0, level))
    body = graph.call_function(F.gelu, (batched,))
    out = graph.call_function(vmap_calls._remove_batch_dim, (body, level, 3, 0))
    graph.call_function(vmap_calls._vmap_decrement_nesting, ())
    graph.output(out)
    return fx.GraphModule(nn.Module(), graph)


def test_leave_regions_whole_keeps_an_inlined_vmap_body_as_torch_runs_it() -> None:
    x = torch.randn(3, 4)
    state = _passed(_vmap_of_gelu(), x)
    (region,) = state.regions.values()
    assert {n.name for n in region} >= {"_vmap_increment_nesting", "gelu", "_vmap_decrement_nesting"}
    assert region <= state.frozen <= state.done
    torch.testing.assert_close(_run(state, x), torch.vmap(F.gelu)(x))
    # without the rule the body's gelu becomes its twin, an autograd Function inside vmap
    unfrozen = _passed(_vmap_of_gelu(), x, without="leave_regions_whole")
    assert F.gelu in _targets(state) and U.gelu in _targets(unfrozen)


def test_apply_replacements_calls_the_users_function_and_no_twin() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    def triple_gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return 3.0 * F.gelu(input, approximate=approximate)

    x = torch.randn(16, 8)
    state = _passed(f, x, replace={F.gelu: triple_gelu})
    assert triple_gelu in _targets(state) and U.gelu not in _targets(state)
    torch.testing.assert_close(_run(state, x), 3.0 * F.gelu(x))
    assert U.gelu in _targets(_passed(f, x, without="apply_replacements", replace={F.gelu: triple_gelu}))


def _written_out_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_fold_written_out_ops_makes_a_tanh_gelu_its_twin_before_residuals_are_sought() -> None:
    x = torch.randn(64, 8)
    state = _state(_written_out_gelu, x, upto="fold_written_out_ops")
    rules_module._op_rules.fold_written_out_ops(state)
    (gelu,) = state.folded
    assert gelu.target is U.gelu and gelu.kwargs == {"approximate": "tanh"} and gelu in state.done
    assert _targets(state) == [U.gelu]  # the written-out ops are gone
    # the twin of torch's own tanh GELU: its output over torch's is one scale
    ratio = _run(state, x) / F.gelu(x, approximate="tanh")
    torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0, 0].item()), rtol=1e-4, atol=1e-4)
    # without the fold, x + 0.044715 * x**3 is taken for a residual add
    assert U.residual_add in _targets(_passed(_written_out_gelu, x, without="fold_written_out_ops"))
    assert U.residual_add not in _targets(_passed(_written_out_gelu, x))


class _Block(nn.Module):
    """``h + relu(h) * c``, ``h = linear(x)``: a skip over the ReLU, and a constant off the activation path."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.w)
        return h + torch.relu(h) * torch.ones(8)


def test_analyse_finds_the_activation_path_the_stream_and_the_trunk() -> None:
    state = _state(_Block(), torch.randn(4, 8), upto="analyse")
    rules_module.analyse(state)

    def names(nodes: set[fx.Node]) -> set[str]:
        return {n.name for n in nodes}

    # by hand: the constant reads neither input nor parameter; the parameter is no stream
    assert names(state.live) == {"x", "w", "linear", "relu", "mul", "add", "output"}
    assert names(state.stream) == {"x", "linear", "relu", "mul", "add", "output"}
    # the skip h -> add jumps over relu and mul: only linear and add lie on every path
    assert names(state.trunk) == {"linear", "add", "output"}
    assert names(state.constrained) == {"x", "w", "relu", "mul"}  # an input is on no trunk
    add = next(n for n in state.graph.nodes if n.name == "add")
    assert names(state.ancestors[add]) == {"x", "w", "linear", "relu", "mul", "_tensor_constant0"}


def _rotary(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    theta = pos[:, None].float() * torch.tensor([1.0, 0.5, 0.25, 0.125])
    angles = torch.cat((theta, theta), -1)
    rotated = torch.cat((-x[..., 4:], x[..., :4]), -1)
    return x * angles.cos() + rotated * angles.sin()


def test_keep_rotary_embeddings_keeps_a_rotation_as_torch_computes_it() -> None:
    x, pos = torch.randn(2, 5, 8), torch.arange(5)
    state = _passed(_rotary, x, pos)
    assert sorted(n.name for n in state.kept) == ["add", "mul_1", "mul_2"]  # mul: the angles
    out = _run(state, x, pos)
    torch.testing.assert_close(out, _rotary(x, pos))
    # a rotation of each pair of features keeps each position's norm (the std of x)
    torch.testing.assert_close(out.pow(2).sum(-1), x.pow(2).sum(-1))
    # without the rule the add is scaled by 2**-0.5 as U.add, as the docstring says
    added = _passed(_rotary, x, pos, without="keep_rotary_embeddings")
    assert U.add in _targets(added)
    torch.testing.assert_close(_run(added, x, pos), _rotary(x, pos) * 2**-0.5)


def test_unconstrain_folded_on_trunk_scales_a_folded_twin_each_way_alone() -> None:
    x = torch.randn(256, 8, requires_grad=True)
    grad = torch.randn(256, 8)

    def ratios(state: PassState) -> tuple[float, float]:
        """The pass's output and input gradient over torch's tanh GELU's: the two scales."""
        out = _run(state, x)
        (got,) = torch.autograd.grad(out, x, grad)
        ref = F.gelu(x, approximate="tanh")
        (want,) = torch.autograd.grad(ref, x, grad)
        forward, backward = out / ref, got / want
        torch.testing.assert_close(forward, torch.full_like(forward, forward[0, 0].item()))
        torch.testing.assert_close(backward, torch.full_like(backward, backward[0, 0].item()))
        return forward[0, 0].item(), backward[0, 0].item()

    state = _passed(_written_out_gelu, x.detach())
    (gelu,) = state.folded
    assert gelu.kwargs["constraint"] is None
    forward, backward = ratios(state)
    constrained = _passed(_written_out_gelu, x.detach(), without="unconstrain_folded_on_trunk")
    assert "constraint" not in constrained.folded[0].kwargs
    both = ratios(constrained)
    # the default constraint (gmean) takes the geometric mean of the two scales both ways
    assert forward != pytest.approx(backward, rel=0.01)
    assert both == pytest.approx(((forward * backward) ** 0.5,) * 2, rel=1e-4)


class _LinearBatchNormBlock(nn.Module):
    """``x + linear(bn(linear(x, w1)), w2)``: a first linear layer (8 -> 32) only batch norm reads, off the trunk."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(32, 8)), nn.Parameter(torch.randn(8, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.batch_norm(F.linear(x, self.w1), None, None, training=True)
        return x + F.linear(h, self.w2)


def test_constrain_before_batch_norms_gives_both_ways_the_input_gradient_scale() -> None:
    block, x = _LinearBatchNormBlock(), torch.randn(16, 8)
    state = _state(block, x, upto="constrain_before_batch_norms")
    rules_module._cnn_rules.constrain_before_batch_norms(state)
    first, second = [n for n in state.graph.nodes if n.target is U.linear]
    assert first.kwargs == {"constraint": "to_grad_input_scale"} and second.kwargs == {}
    state.gm.recompile()
    _values(state.gm, (x,))
    # the input-gradient scale of an 8 -> 32 linear layer is 32**-0.5 (gmean would give (8 * 32)**-0.25)
    torch.testing.assert_close(first.meta["example_value"], F.linear(x, block.w1) * 32**-0.5)


class _PostActivationBlock(nn.Module):
    """``relu(h + linear(h))`` with ``h = relu(x)``: a ResNet's post-activation residual block."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x)
        return torch.relu(h + F.linear(h, self.w))


def test_rescale_relus_after_residuals_scales_the_relu_for_the_sum_it_reads() -> None:
    block, x = _PostActivationBlock(), torch.randn(16, 8)
    state = _passed(block, x)
    (scaled,) = [n for n in state.graph.nodes if n.target is U.scale]
    relu, forward, backward = scaled.args
    assert relu.target is F.relu and relu.args[0].target is U.residual_add
    # the docstring's numbers at tau = 0.5: 72% of the sum's inputs are positive, so the
    # backward scale is 0.72**-0.5, not the plain ReLU twin's 2**0.5; on the trunk the two differ
    assert backward == pytest.approx(0.72**-0.5, abs=0.01) and forward != pytest.approx(backward, rel=0.01)
    out = _run(state, x)
    _values(state.gm, (x,))
    torch.testing.assert_close(out, torch.relu(relu.args[0].meta["example_value"]) * forward)
    plain = _passed(block, x, without="rescale_relus_after_residuals")
    assert [n.target for n in plain.graph.nodes if n.target in (U.relu, U.scale)] == [U.relu, U.relu]


def test_scale_global_pools_scales_a_pooled_relu_for_its_mean() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).mean((2, 3))

    x = torch.randn(4, 3, 4, 4)
    k = 16  # each output averages 4 x 4 values
    pdf0 = (2 * math.pi) ** -0.5
    r = pdf0 / (0.5 - pdf0**2) ** 0.5  # a ReLU of N(0, 1): mean over std, by hand
    state, plain = _passed(f, x), _passed(f, x, without="scale_global_pools")
    (scaled,) = [n for n in state.graph.nodes if n.target is U.scale]
    assert scaled.args[0].target is U.mean and scaled.args[2] == 1.0  # on the trunk: forward only
    # the mean pool's k**0.5 becomes (r**2 + 1/k)**-0.5: the rule's factor over the pool's
    torch.testing.assert_close(_run(state, x), _run(plain, x) * (r**2 + 1 / k) ** -0.5 / k**0.5)


def test_rescale_max_pools_of_relus_scales_by_two_to_the_minus_half_both_ways() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x), 2)

    def g(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 2)

    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    grad = torch.randn(2, 3, 2, 2)
    outs, grads = [], []
    for without in ("", "rescale_max_pools_of_relus"):
        out = _run(_passed(f, x.detach(), without=without), x)
        outs.append(out)
        grads.append(torch.autograd.grad(out, x, grad)[0])
    torch.testing.assert_close(outs[0], outs[1] * 2**-0.5)
    torch.testing.assert_close(grads[0], grads[1] * 2**-0.5)
    assert U.scale not in _targets(_passed(g, x.detach()))  # a max pool of anything else keeps its twin's scale


class _BatchNormResidualBlock(nn.Module):
    """``h + bn(linear(h, w2))``, ``h = linear(x, w1)``: a residual block that holds batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.w1)
        return h + F.batch_norm(F.linear(h, self.w2), None, None, training=True)


def _with_grad_at(state: PassState, name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph's output, and node ``name``'s value with its gradient kept."""
    state.graph.lint()
    state.gm.recompile()
    kept: dict[str, torch.Tensor] = {}

    class Keeper(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if n.name == name:
                out.retain_grad()
                kept[name] = out
            return out

    return Keeper(state.gm).run(x), kept[name]


def test_freeze_before_batch_norm_blocks_scales_every_upstream_gradient_by_one_measured_number() -> None:
    block = _BatchNormResidualBlock()
    x, grad = torch.randn(16, 8, requires_grad=True), torch.randn(16, 8)
    state = _passed(block, x.detach())
    (frozen,) = [n for n in state.graph.nodes if n.target is U.frozen_grad_scale]
    assert frozen.args[0].name == "linear" and state.blocks == 1
    out, _ = _with_grad_at(state, "linear", x)
    (got,) = torch.autograd.grad(out, x, grad)
    plain, h = _with_grad_at(_passed(block, x.detach(), without="freeze_before_batch_norm_blocks"), "linear", x)
    plain.backward(grad)
    assert h.grad is not None and x.grad is not None
    factor = state.grad_scales.factor("root_0").item()
    assert factor == pytest.approx(1 / h.grad.pow(2).mean().sqrt().item(), rel=1e-5)  # 1 / RMS, measured
    torch.testing.assert_close(out, plain)  # identity forward
    torch.testing.assert_close(got, x.grad * factor)


def test_freeze_trunk_batch_norms_keeps_torchs_gradient_times_one_frozen_number() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, None, None, training=True)

    x, grad = torch.randn(16, 4, requires_grad=True), torch.randn(16, 4)
    state = _passed(f, x.detach())
    (bn,) = [n for n in state.graph.nodes if n.target is U.batch_norm]
    assert "constraint" not in bn.kwargs and bn.args[0].target is U.frozen_grad_scale
    out = _run(state, x)
    (got,) = torch.autograd.grad(out, x, grad)
    (want,) = torch.autograd.grad(f(x), x, grad)
    torch.testing.assert_close(out, f(x))  # scale 1 forward: torch's batch norm
    torch.testing.assert_close(got, want / want.pow(2).mean().sqrt())  # torch's gradient at unit RMS
    unfrozen = _passed(f, x.detach(), without="freeze_trunk_batch_norms")
    assert U.frozen_grad_scale not in _targets(unfrozen)
    (bn,) = [n for n in unfrozen.graph.nodes if n.target is U.batch_norm]
    assert bn.kwargs["constraint"] is None


def test_balance_gates_scales_a_gate_from_another_input_by_its_copies() -> None:
    def f(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return x * gate

    x, gate = torch.randn(2, 3, 4, 4, requires_grad=True), torch.randn(2, 3, 1, 1, requires_grad=True)
    grad = torch.randn(2, 3, 4, 4)
    state = _passed(f, x.detach(), gate.detach())
    (product,) = [n for n in state.graph.nodes if n.target is U.mul]
    assert product.kwargs == {"constraint": None}
    out = _run(state, x, gate)
    got = torch.autograd.grad(out, (x, gate), grad)
    want = torch.autograd.grad(x * gate, (x, gate), grad)
    torch.testing.assert_close(out, x * gate)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1] * 16**-0.5)  # summed over 16 copies
    kept = _passed(f, x.detach(), gate.detach(), without="balance_gates")
    assert [n.kwargs for n in kept.graph.nodes if n.target is U.mul] == [{"constraint": "to_output_scale"}]


class _SqueezeExcitation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(F.linear(x.mean((2, 3)), self.w))
        return x * gate[:, :, None, None]


def test_balance_gates_undoes_a_squeeze_excitation_gates_scale_at_its_pool() -> None:
    block = _SqueezeExcitation()
    x, grad = torch.randn(2, 3, 4, 4, requires_grad=True), torch.randn(2, 3, 4, 4)
    state = _passed(block, x.detach())
    (pool_scale,) = [n for n in state.graph.nodes if n.name.endswith("gate_balanced")]
    assert pool_scale.args[0].target is U.mean and pool_scale.args[1:] == (1.0, 16**0.5)
    kept = _passed(block, x.detach(), without="balance_gates")
    out, plain = _run(state, x), _run(kept, x)
    torch.testing.assert_close(out, plain)
    # along the gate's branch k**-0.5 at the product and k**0.5 at the pool: the constrained product's gradient
    torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(plain, x, grad)[0])


def test_share_loss_scales_gives_two_losses_the_geometric_mean_of_their_factors() -> None:
    def f(a: torch.Tensor, t: torch.Tensor, b: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.cross_entropy(a, t), F.cross_entropy(b, u)

    a, t = torch.randn(8, 5, requires_grad=True), torch.randint(0, 5, (8,))
    b, u = torch.randn(4, 10, requires_grad=True), torch.randint(0, 10, (4,))
    own = [loss.grad_scale for loss in (U.cross_entropy(a, t), U.cross_entropy(b, u))]  # type: ignore[attr-defined]
    shared = (own[0] * own[1]) ** 0.5
    state = _passed(f, a.detach(), t, b.detach(), u)
    factors = [n.kwargs.get("grad_scale") for n in state.graph.nodes if n.target is U.cross_entropy]
    assert factors == pytest.approx([shared] * 2)
    first, second = _run(state, a, t, b, u)
    torch.testing.assert_close((first, second), f(a, t, b, u))  # the losses' values are torch's
    (first + 2 * second).backward()
    a0, b0 = a.detach().requires_grad_(), b.detach().requires_grad_()
    (f(a0, t, b0, u)[0] + 2 * f(a0, t, b0, u)[1]).backward()
    # the sum's gradient is one number times torch's: the true direction
    torch.testing.assert_close(a.grad, a0.grad * shared)
    torch.testing.assert_close(b.grad, b0.grad * shared)
    lines = state.gm.meta["loss_scales"]
    assert len(lines) == 2 and f"gradient factor {shared:.6g} (its own {own[1]:.6g})" in lines[1]
    plain = _passed(f, a.detach(), t, b.detach(), u, without="share_loss_scales")
    assert not any("grad_scale" in n.kwargs for n in plain.graph.nodes)


# -- a rule of the user's ---------------------------------------------------------------


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Names to unregister after the test, so no rule outlives it."""
    names: list[str] = []
    yield names
    for name in names:
        if name in rule_names():
            unregister_rule(name)


def _double_tanh(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.tanh(x)


def test_a_user_rule_changes_the_graph_by_its_numbers(registered: list[str]) -> None:
    def scale_tanh(state: PassState) -> None:
        for node in state.graph.nodes:
            if node.target is torch.tanh and state.is_open(node):
                state.retarget(node, _double_tanh)

    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    x = torch.randn(32, 16)
    plain = unit_scale(model, check=False)
    register_rule("scale_tanh", scale_tanh, after="swap_ops")
    registered.append("scale_tanh")
    assert rule_names().index("scale_tanh") == rule_names().index("swap_ops") + 1
    ruled = unit_scale(model, check=False)
    torch.manual_seed(0)
    expected = 2.0 * plain(x)  # the pass re-initialises on the first call: seed both alike
    torch.manual_seed(0)
    got = ruled(x)
    torch.testing.assert_close(got, expected)
    assert plain.unscaled_ops and not ruled.unscaled_ops  # done by the user's rule: not reported
    assert ruled.graph_module is not None and "_double_tanh" in ruled.graph_module.code


def test_a_unit_scale_made_before_a_registration_keeps_its_rules(registered: list[str]) -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    before = unit_scale(model, check=False)
    register_rule("boom", lambda state: (_ for _ in ()).throw(AssertionError("ran")), before="analyse")
    registered.append("boom")
    before(torch.randn(2, 4))
    assert rule_names()[rule_names().index("analyse") - 1] == "boom"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: register_rule("swap_ops", print),
            RuleError,
            "register_rule('swap_ops', ...): a rule named 'swap_ops'",
        ),
        (lambda: register_rule("mine", print, after="nope"), RuleError, "after='nope' is no rule; the rules are"),
        (lambda: register_rule("mine", print, before="nope"), RuleError, "before='nope' is no rule"),
        (
            lambda: register_rule("mine", print, before="analyse", after="swap_ops"),
            RuleError,
            "before='analyse' and after='swap_ops' both given",
        ),
        (lambda: register_rule("mine", "print"), NotCallableError, "fn='print' is not callable"),  # type: ignore[arg-type]
        (lambda: register_rule(3, print), RuleError, "register_rule(name=3)"),  # type: ignore[arg-type]
        (lambda: unregister_rule("nope"), RuleError, "unregister_rule('nope'): no rule is named 'nope'"),
    ],
)
def test_a_bad_registration_is_refused_naming_what_was_passed(call: Any, error: type, message: str) -> None:
    names = rule_names()
    with pytest.raises(error, match=re.escape(message)):
        call()
    assert rule_names() == names
