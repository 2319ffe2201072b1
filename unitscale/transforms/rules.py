"""The unit-scaling pass as an ordered list of named rules, and how a user adds one.

:func:`~unitscale.transforms.unit_scale` runs each rule ``rule(state) -> None`` of this list, in
order, over one :class:`PassState` (the graph module and what the rules before found):

1. ``follow_in_place_changes``: a read after ``x += 1`` reads the changed tensor;
2. ``leave_regions_whole``: higher-order ops and inlined ``vmap`` bodies are left whole;
3. ``apply_replacements``: ``unit_scale(replace=...)`` first;
4. ``fold_written_out_ops``: a hand-written RMS norm or tanh GELU becomes its twin;
5. ``analyse``: the graph's ancestors, activation path, stream and trunk;
6. ``keep_rotary_embeddings`` and 7. ``keep_soft_caps``: ops that keep unit scale as a whole;
8. ``residual_adds``: a residual add becomes a ``residual_split`` / ``residual_add`` pair;
9. ``unconstrain_folded_on_trunk``: a folded twin on the trunk scales each direction alone;
10. ``swap_ops``: adds, products, pools, layer scales, then :data:`~unitscale.functional.torch_map`;
11. ``drop_constant_factors``: ``x * c`` where the op after it sets the scale;
12. ``constrain_before_batch_norms``, 13. ``rescale_relus_after_residuals``,
    14. ``scale_global_pools`` and 15. ``rescale_max_pools_of_relus``: the scales of
    convolutional networks' inputs (batch norm, ReLUs after residuals, global and max pools);
16. ``freeze_before_batch_norm_blocks`` and 17. ``freeze_trunk_batch_norms``: gradient
    factors measured once and frozen;
18. ``balance_gates``: squeeze-excitation gates;
19. ``share_loss_scales``: one gradient factor for a graph's losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from unitscale.errors import NotCallableError, RuleError
from unitscale.transforms import _cnn_rules, _frozen, _kept, _losses, _op_rules, _residuals
from unitscale.transforms._graph import _activation_path, _ancestors, _stream, _trunk
from unitscale.transforms.pass_state import PassState

__all__ = ["Rule", "register_rule", "rule_names", "unregister_rule"]


def analyse(state: PassState) -> None:
    """Fill in ``ancestors``, ``live``, ``stream`` and ``trunk`` for the graph as it is now."""
    state.ancestors = _ancestors(state.graph)
    state.live = _activation_path(state.gm)
    state.trunk = _trunk(state.graph, state.live)
    state.stream = _stream(state.graph, state.live)


class Rule(NamedTuple):
    """One named rule of the unit-scaling pass: ``fn(state)`` rewrites ``state.gm``'s graph."""

    name: str
    fn: Callable[[PassState], None]


_RULES: list[Rule] = [
    Rule(fn.__name__, fn)
    for fn in (
        _residuals.follow_in_place_changes,
        _kept.leave_regions_whole,
        _op_rules.apply_replacements,
        _op_rules.fold_written_out_ops,
        analyse,
        _kept.keep_rotary_embeddings,
        _kept.keep_soft_caps,
        _residuals.residual_adds,
        _op_rules.unconstrain_folded_on_trunk,
        _op_rules.swap_ops,
        _op_rules.drop_constant_factors,
        _cnn_rules.constrain_before_batch_norms,
        _cnn_rules.rescale_relus_after_residuals,
        _cnn_rules.scale_global_pools,
        _cnn_rules.rescale_max_pools_of_relus,
        _frozen.freeze_before_batch_norm_blocks,
        _frozen.freeze_trunk_batch_norms,
        _cnn_rules.balance_gates,
        _losses.share_loss_scales,
    )
]


def rule_names() -> list[str]:
    """The names of the unit-scaling pass's rules, in the order they run.

    >>> from unitscale.transforms import rule_names
    >>> rule_names()[:3]
    ['follow_in_place_changes', 'leave_regions_whole', 'apply_replacements']
    """
    return [rule.name for rule in _RULES]


def rules() -> tuple[Rule, ...]:
    """The rules as they are now: a ``unit_scale`` keeps the list it was made with."""
    return tuple(_RULES)


def register_rule(
    name: str, fn: Callable[[PassState], None], *, before: str | None = None, after: str | None = None
) -> None:
    """Add a rule of your own to the unit-scaling pass, before or after a named rule (else last).

    ``fn(state)`` changes ``state.gm.graph`` in place; a node it rewrites or adds belongs in
    ``state.done`` (:meth:`PassState.retarget` puts it there), else later rules rewrite it and
    the pass reports it unscaled. A :func:`~unitscale.transforms.unit_scale` made before keeps its list.

    Args:
        before: run just before this rule (give one of ``before`` and ``after``, or neither).
        after: run just after this rule.

    Raises:
        NotCallableError: ``fn`` is not callable.
        RuleError: ``name`` is taken or not a string, ``before``/``after`` names no rule, or both
            are given.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.transforms import register_rule, unit_scale, unregister_rule
    >>> def keep_tanh(state):  # tanh of a unit-scaled input keeps its std below 1
    ...     for node in state.graph.nodes:
    ...         if node.target is torch.tanh:
    ...             state.kept[node] = "tanh stays below 1"
    >>> register_rule("keep_tanh", keep_tanh, after="swap_ops")
    >>> model = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    >>> unregister_rule("keep_tanh")
    >>> _ = model(torch.randn(4, 8))
    >>> model.unscaled_ops, model.kept_ops[0].split(": ")[1]
    ([], 'tanh stays below 1')
    """
    call = f"register_rule({name!r}, ...)"
    if not isinstance(name, str) or not name:
        raise RuleError(f"register_rule(name={name!r}): a rule's name is a non-empty string")
    if not callable(fn):
        raise NotCallableError(f"{call}: fn={fn!r:.60} is not callable; pass a function of the PassState")
    if name in rule_names():
        raise RuleError(f"{call}: a rule named {name!r} exists already; pick another name or unregister_rule it")
    if before is not None and after is not None:
        raise RuleError(f"{call}: before={before!r} and after={after!r} both given; give one of them")
    anchor = before if before is not None else after
    if anchor is None:
        _RULES.append(Rule(name, fn))
        return
    if anchor not in rule_names():
        where = "before" if before is not None else "after"
        raise RuleError(f"{call}: {where}={anchor!r} is no rule; the rules are {', '.join(rule_names())}")
    at = rule_names().index(anchor) + (0 if before is not None else 1)
    _RULES.insert(at, Rule(name, fn))


def unregister_rule(name: str) -> None:
    """Take a rule out of the unit-scaling pass (for one :func:`register_rule` added).

    Raises:
        RuleError: no rule is named ``name``.

    >>> from unitscale.transforms import register_rule, rule_names, unregister_rule
    >>> register_rule("nothing", lambda state: None)
    >>> unregister_rule("nothing")
    >>> "nothing" in rule_names()
    False
    """
    if name not in rule_names():
        known = ", ".join(rule_names())
        raise RuleError(f"unregister_rule({name!r}): no rule is named {name!r}; the rules are {known}")
    del _RULES[rule_names().index(name)]
