"""u-μP's learning-rate rules per parameter role, and torch optimisers that apply them.

u-μP (Blake et al., arXiv 2407.17465, Section 4) sets each parameter's learning rate
from one global ``lr`` and the parameter's role (:func:`~unitscale.scaling.umup.tag`).
With Adam, whose update has a size set by ``lr`` whatever the gradient's scale:

==============  ===============================  ==========================================
role            Adam ``lr`` ×                    why
==============  ===============================  ==========================================
``weight``      ``fan_in**-0.5``                 μP: a unit-init hidden weight whose multiplier
                                                 is ``fan_in**-0.5`` must move by ``O(1/fan_in)``
``embedding``   ``width**-0.5`` (its fan-out)    u-μP's embedding rule (μP keeps it constant)
``readout``     1                                its ``1/fan_in`` multiplier already shrinks it
``bias``        1                                a vector: nothing sums over the width
``norm``        1                                idem
==============  ===============================  ==========================================

and a parameter in a residual branch of a stack of ``depth`` blocks a further
``depth**-0.5`` (depth-μP for Adam, which u-μP adopts alongside its residual rule,
Appendix G).

**Why SGD's rules are the same here, and when they are not.** SGD's update is ``lr``
times the gradient, so its size follows the gradient's scale. Every gradient of a
unit-scaled model is scaled to unit std, which makes SGD's updates unit-sized like
Adam's, and the Adam rules carry over (the reference library reasons the same way).
They differ only when the readout's backward scale is tied to its forward one
(``readout_constraint="to_output_scale"``): then every gradient below the readout
shrinks like ``1 / width`` and SGD has to grow its rates instead: ``weight`` and
``embedding`` × ``width**0.5``, ``bias`` and ``norm`` × ``width``, ``readout`` × 1
(the reference library's ``lr_scale_func_sgd``).

**Weight decay** is independent of ``lr`` by default: each group's decay is divided by
its own learning rate, so the decay step per update is ``weight_decay · p`` for
:class:`AdamW` and :class:`SGD`, whatever the learning rate (of the peak: a schedule
still scales it). With :class:`Adam` the decay is an L2 term fed through Adam's
normaliser, as in torch.

**Parameters without a role** raise :class:`~unitscale.errors.UntaggedParameterError`
naming them and saying how to tag them; ``allow_untagged=True`` gives them the scale 1
(the rule of a bias) and warns with :class:`~unitscale.errors.UntaggedParameterWarning`.

>>> import torch
>>> from unitscale.optim import lr_scales
>>> from unitscale.scaling import umup
>>> model = torch.nn.Sequential(umup.Linear(256, 64), umup.LinearReadout(64, 10))
>>> lr_scales(model)
{'0.weight': 0.0625, '1.weight': 1.0}
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, TypeAlias

import torch
from torch import Tensor, nn

from unitscale.errors import InputError, UntaggedParameterError, UntaggedParameterWarning
from unitscale.scaling.umup_params import ParamRole, role_of

__all__ = ["RULES", "lr_scale", "lr_scales", "param_groups", "SGD", "Adam", "AdamW"]

RULES = ("adam", "sgd", "sgd_to_output_scale")
"""The rule sets :func:`lr_scale` knows: Adam's (also AdamW's), SGD's with unit-scaled
gradients (equal to Adam's), SGD's with a readout constrained ``to_output_scale``."""

Params: TypeAlias = nn.Module | Iterable[Tensor] | Iterable[dict[str, Any]]
"""What the optimisers take: a module, parameters, or torch-style parameter groups."""


def _check_rule(owner: str, rule: Any) -> str:
    if rule not in RULES:
        raise InputError(f"{owner}: rule={rule!r:.60} is not one of {', '.join(RULES)}")
    return str(rule)


def lr_scale(role: ParamRole, rule: str = "adam") -> float:
    """The factor u-μP multiplies the global learning rate by for a parameter of this role.

    Args:
        role: the parameter's :class:`~unitscale.scaling.umup.ParamRole`.
        rule: one of :data:`RULES`.

    Returns:
        The factor (see the module's table).

    Raises:
        InputError: ``rule`` is unknown.

    >>> from unitscale.optim import lr_scale
    >>> from unitscale.scaling.umup import ParamRole
    >>> lr_scale(ParamRole("weight", width=1024, depth=4))
    0.015625
    >>> lr_scale(ParamRole("weight", width=1024), rule="sgd_to_output_scale")
    32.0
    """
    rule = _check_rule("lr_scale", rule)
    depth = 1.0 if role.depth is None else role.depth**-0.5
    if rule == "sgd_to_output_scale":
        width = {"weight": role.width**0.5, "embedding": role.width**0.5, "readout": 1.0}.get(role.role, role.width)
    else:
        width = role.width**-0.5 if role.role in ("weight", "embedding") else 1.0
    return float(width * depth)


def _how_to_tag(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{len(names)} parameter(s) have no u-μP role: {shown}. Build the model from "
        "unitscale.scaling.umup modules, or tag each parameter with "
        "unitscale.scaling.umup.tag(param, role) (roles: weight, bias, norm, readout, embedding), "
        "or pass allow_untagged=True to give them the scale 1 with a warning"
    )


def _named(params: Params) -> list[tuple[dict[str, Any], list[tuple[str, Tensor]]]]:
    """Each group's options with its (name, parameter) pairs; names are dotted paths or ``params[i]``."""
    if isinstance(params, nn.Module):
        return [({}, list(params.named_parameters()))]
    if isinstance(params, Tensor):
        raise InputError("params is a single tensor; pass an iterable of parameters, parameter groups, or a module")
    groups: list[tuple[dict[str, Any], list[tuple[str, Tensor]]]] = []
    loose: list[tuple[str, Tensor]] = []
    for index, entry in enumerate(params):
        if isinstance(entry, dict):
            options = {k: v for k, v in entry.items() if k != "params"}
            members = entry.get("params", [])
            members = [members] if isinstance(members, Tensor) else list(members)
            groups.append((options, [(f"group {len(groups)} params[{i}]", p) for i, p in enumerate(members)]))
        elif isinstance(entry, Tensor):
            loose.append((f"params[{index}]", entry))
        else:
            raise InputError(
                f"params[{index}] is a {type(entry).__name__}; pass parameters, parameter groups (dicts) or a module"
            )
    return ([({}, loose)] if loose else []) + groups


def _scales(named: list[tuple[str, Tensor]], rule: str, allow_untagged: bool, owner: str) -> list[float]:
    missing = [name for name, p in named if role_of(p) is None]
    if missing and not allow_untagged:
        raise UntaggedParameterError(f"{owner}: {_how_to_tag(missing)}")
    if missing:
        warnings.warn(
            f"{owner}: {len(missing)} parameter(s) without a u-μP role learn at the global lr "
            f"(scale 1): {', '.join(missing[:5])}",
            UntaggedParameterWarning,
            stacklevel=3,
        )
    return [1.0 if (role := role_of(p)) is None else lr_scale(role, rule) for _, p in named]


def lr_scales(model: nn.Module, rule: str = "adam", allow_untagged: bool = False) -> dict[str, float]:
    """Each parameter's learning-rate factor under u-μP's rules, by name.

    Args:
        model: a module whose parameters are tagged (:func:`~unitscale.scaling.umup.tag`).
        rule: one of :data:`RULES`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.

    Returns:
        ``{name: factor}`` in ``named_parameters`` order.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: ``rule`` is unknown.

    >>> import torch
    >>> from unitscale.optim import lr_scales
    >>> from unitscale.scaling import umup
    >>> lr_scales(umup.Embedding(10, 16))
    {'weight': 0.25}
    """
    rule = _check_rule("lr_scales", rule)
    if not isinstance(model, nn.Module):
        from unitscale.errors import NotAModuleError

        raise NotAModuleError(f"lr_scales: model is a {type(model).__name__}; pass a torch.nn.Module")
    named: list[tuple[str, Tensor]] = list(model.named_parameters())
    return dict(zip([n for n, _ in named], _scales(named, rule, allow_untagged, "lr_scales"), strict=True))


def param_groups(
    params: Params,
    lr: float,
    weight_decay: float = 0.0,
    independent_weight_decay: bool = True,
    rule: str = "adam",
    allow_untagged: bool = False,
) -> list[dict[str, Any]]:
    """Torch parameter groups carrying u-μP's per-parameter learning rates, for any optimiser.

    Parameters sharing a factor (and the options of the group they came from) share a
    group. Each group has ``lr`` (``lr`` times the factor, or the group's own ``lr`` times
    it), ``weight_decay`` (divided by that ``lr`` when ``independent_weight_decay``) and
    ``umup_scale`` (the factor, for inspection).

    Args:
        params: a module, parameters, or torch-style parameter groups.
        lr: the global learning rate (a finite number > 0).
        weight_decay: the decay (>= 0).
        independent_weight_decay: make the decay step independent of ``lr`` (see the module doc).
        rule: one of :data:`RULES`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.

    Returns:
        A list to pass to any ``torch.optim`` optimiser.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: ``lr`` or ``weight_decay`` is out of range, ``rule`` is unknown, or ``params`` is not
            parameters, groups or a module.

    >>> import torch
    >>> from unitscale.optim import param_groups
    >>> from unitscale.scaling import umup
    >>> model = torch.nn.Sequential(umup.Linear(64, 64), umup.LinearReadout(64, 10))
    >>> opt = torch.optim.RMSprop(param_groups(model, lr=0.1))
    >>> [round(g["lr"], 4) for g in opt.param_groups]
    [0.0125, 0.1]
    """
    rule = _check_rule("param_groups", rule)
    for name, value, low_ok in (("lr", lr, False), ("weight_decay", weight_decay, True)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"param_groups: {name}={value!r:.60} is not a finite number")
        if value < 0 or (value == 0 and not low_ok):
            raise InputError(f"param_groups: {name}={value!r} must be {'>= 0' if low_ok else '> 0'}")
    result: list[dict[str, Any]] = []
    for options, named in _named(params):
        scales = _scales(named, rule, allow_untagged, "param_groups")
        base_lr = float(options.get("lr", lr))
        base_wd = float(options.get("weight_decay", weight_decay))
        by_scale: dict[float, list[Tensor]] = {}
        for (_, p), factor in zip(named, scales, strict=True):
            by_scale.setdefault(factor, []).append(p)
        for factor, members in by_scale.items():
            group_lr = base_lr * factor
            decay = base_wd / group_lr if independent_weight_decay and group_lr > 0 else base_wd
            result.append({**options, "params": members, "lr": group_lr, "weight_decay": decay, "umup_scale": factor})
    return result


class SGD(torch.optim.SGD):
    """:class:`torch.optim.SGD` with u-μP's per-role learning rates and independent weight decay.

    Args:
        params: a module, parameters, or parameter groups (tagged).
        lr: the global learning rate.
        weight_decay: decay, independent of ``lr`` by default.
        independent_weight_decay: see :func:`param_groups`.
        readout_constraint: ``None`` (the readout's gradient is unit-scaled: Adam's rules) or
            ``"to_output_scale"`` (the readout's backward tied to its forward: SGD's own rules).
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.
        **kwargs: passed to :class:`torch.optim.SGD` (``momentum``, ``nesterov``, ...).

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: a bad ``lr``, ``weight_decay`` or ``readout_constraint``.

    >>> import torch
    >>> from unitscale.optim import SGD
    >>> from unitscale.scaling import umup
    >>> opt = SGD(umup.Linear(16, 4).parameters(), lr=1.0, momentum=0.9)
    >>> opt.param_groups[0]["lr"]
    0.25
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-2,
        weight_decay: float = 0.0,
        independent_weight_decay: bool = True,
        readout_constraint: str | None = None,
        allow_untagged: bool = False,
        **kwargs: Any,
    ) -> None:
        if readout_constraint not in (None, "to_output_scale"):
            raise InputError(
                f"SGD: readout_constraint={readout_constraint!r:.60} must be None or 'to_output_scale' "
                "(the constraint of the model's readout)"
            )
        rule = "sgd" if readout_constraint is None else "sgd_to_output_scale"
        groups = param_groups(params, lr, weight_decay, independent_weight_decay, rule, allow_untagged)
        super().__init__(groups, lr=lr, **kwargs)


class Adam(torch.optim.Adam):
    """:class:`torch.optim.Adam` with u-μP's per-role learning rates (see :mod:`unitscale.optim`).

    Args:
        params: a module, parameters, or parameter groups (tagged).
        lr: the global learning rate (u-μP's default optimum is near 2**-6 to 2**-3 at any width).
        weight_decay: L2 decay (through Adam's normaliser, as in torch), divided by each group's ``lr``
            when ``independent_weight_decay``.
        independent_weight_decay: see :func:`param_groups`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.
        **kwargs: passed to :class:`torch.optim.Adam` (``betas``, ``eps``, ...).

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).

    >>> import torch
    >>> from unitscale.optim import Adam
    >>> from unitscale.scaling import umup
    >>> opt = Adam(umup.Linear(64, 4).parameters(), lr=0.1)
    >>> round(opt.param_groups[0]["lr"], 4)
    0.0125
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        independent_weight_decay: bool = True,
        allow_untagged: bool = False,
        **kwargs: Any,
    ) -> None:
        groups = param_groups(params, lr, weight_decay, independent_weight_decay, "adam", allow_untagged)
        super().__init__(groups, lr=lr, **kwargs)


class AdamW(torch.optim.AdamW):
    """:class:`torch.optim.AdamW` with u-μP's per-role learning rates and lr-independent decay.

    Args:
        params: a module, parameters, or parameter groups (tagged).
        lr: the global learning rate.
        weight_decay: the decay step per update (``p -= weight_decay * p``) when
            ``independent_weight_decay``; torch's ``lr * weight_decay`` otherwise.
        independent_weight_decay: see :func:`param_groups`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.
        **kwargs: passed to :class:`torch.optim.AdamW`.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).

    >>> import torch
    >>> from unitscale.optim import AdamW
    >>> from unitscale.scaling import umup
    >>> opt = AdamW(umup.RMSNorm(8).parameters(), lr=0.1, weight_decay=0.01)
    >>> round(opt.param_groups[0]["weight_decay"], 4)
    0.1
    """

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        independent_weight_decay: bool = True,
        allow_untagged: bool = False,
        **kwargs: Any,
    ) -> None:
        groups = param_groups(params, lr, weight_decay, independent_weight_decay, "adam", allow_untagged)
        super().__init__(groups, lr=lr, **kwargs)
