"""The unit-scaling pass as a list of named rules: each default rule on a small graph, and a user's rule.

Each rule runs on a :class:`PassState` of a traced function, after the rules it needs, and its
result is held against the function's own numbers (a residual pair's ``2**-0.5``, a dropped
constant's ``1/c``); the registry's errors name what the user passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx, nn

import unitscale.functional as U
from unitscale.errors import NotCallableError, RuleError
from unitscale.transforms import PassState, register_rule, rule_names, unit_scale, unregister_rule
from unitscale.transforms import rules as rules_module


def _state(fn: Callable[..., Any], *example: torch.Tensor, upto: str) -> PassState:
    """A state for ``fn``'s traced graph after the default rules before ``upto``."""
    gm = fx.symbolic_trace(fn)
    _values(gm, example)
    state = PassState(gm, {}, dict(U.torch_map))
    for rule in rules_module.rules():
        if rule.name == upto:
            return state
        rule.fn(state)
    raise AssertionError(upto)


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
        return x + torch.nn.functional.linear(x, w)

    x = torch.randn(16, 8)
    state = _state(f, x, upto="residual_adds")
    rules_module._residuals.residual_adds(state)
    (join,) = [n for n in state.graph.nodes if n.target is U.residual_add]
    assert join.args[2] == 0.5 and join in state.done
    # residual_add(r, s, 0.5) is (r + s) * 2**-0.5 forward: the model's own sum, scaled
    torch.testing.assert_close(_run(state, x), f(x) * 2**-0.5)


def test_swap_ops_unconstrains_a_twin_on_the_trunk() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)

    x = torch.randn(64, 8)
    state = _state(f, x, upto="swap_ops")
    rules_module._op_rules.swap_ops(state)
    (gelu,) = [n for n in state.graph.nodes if n.target is U.gelu]
    assert gelu.kwargs["constraint"] is None
    torch.testing.assert_close(_run(state, x), U.gelu(x, constraint=None))


def test_drop_constant_factors_keeps_the_sign_of_a_factor_a_linear_layer_reads() -> None:
    w = torch.randn(8, 8)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x * -8.0, w)

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
    assert "_double_tanh" in ruled.graph_module.code


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
