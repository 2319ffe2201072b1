"""u-μP's learning-rate factors per parameter role, and the parameter groups that carry them."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, TypeAlias

from torch import Tensor, nn

from unitscale.errors import InputError, NotAModuleError, UntaggedParameterError, UntaggedParameterWarning
from unitscale.scaling.parameter import ParamRole, role_of

__all__ = ["RULES", "Params", "lr_scale", "lr_scales", "param_groups"]

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
        rule: one of :data:`RULES`.

    Raises:
        InputError: ``rule`` is unknown.

    >>> from unitscale.optim import lr_scale
    >>> from unitscale.scaling import ParamRole
    >>> lr_scale(ParamRole("weight", width=1024, depth=4))
    0.015625
    """
    rule = _check_rule("lr_scale", rule)
    # Depth: depth-μP's 1/sqrt(depth) for Adam, adopted by u-μP (§4, Appendix G).
    depth = 1.0 if role.depth is None else role.depth**-0.5
    if rule == "sgd_to_output_scale":
        # Gradients below a readout tied to_output_scale shrink as 1/width (the reference's lr_scale_func_sgd).
        width = {"weight": role.width**0.5, "embedding": role.width**0.5, "readout": 1.0}.get(role.role, role.width)
    elif role.role in ("weight", "embedding"):
        # u-μP §4: hidden weights' Adam lr is 1/sqrt(fan_in) (the parametrization table), an embedding's
        # 1/sqrt(fan_out) ("A new embedding LR rule"); the role's width is that fan.
        width = role.width**-0.5
    else:
        width = 1.0  # u-μP §4, the parametrization table: output weights, biases and gains keep the global lr
    return float(width * depth)


def _check_lr(owner: str, name: str, value: Any) -> None:
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise InputError(
                f"{owner}: {name} is a tensor of shape {tuple(value.shape)} and dtype {value.dtype}; "
                "pass a float or a one-element float tensor"
            )
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{owner}: {name}={value!r:.60} is not a finite number")
    if value <= 0:
        raise InputError(f"{owner}: {name}={value!r} must be > 0")


def _how_to_tag(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{len(names)} parameter(s) have no u-μP role (a plain torch.nn module's parameters have none): "
        f"{shown}. Build the model from unitscale.nn modules, or tag each parameter with "
        "unitscale.scaling.tag(param, role) (roles: weight, bias, norm, readout, embedding), "
        "or pass allow_untagged=True to give them the scale 1 (a bias's rule) with a warning "
        "(a unit_scale(model) tags its parameters when it captures the graph: pass example_inputs, or call it once)"
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
        model: a module whose parameters are tagged (:func:`~unitscale.scaling.tag`).
        rule: one of :data:`RULES`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: ``rule`` is unknown.

    >>> from unitscale.optim import lr_scales
    >>> from unitscale.nn import Embedding
    >>> lr_scales(Embedding(10, 16))
    {'weight': 0.25}
    """
    rule = _check_rule("lr_scales", rule)
    if not isinstance(model, nn.Module):
        raise NotAModuleError(f"lr_scales: model is a {type(model).__name__}; pass a torch.nn.Module")
    named: list[tuple[str, Tensor]] = list(model.named_parameters())
    return dict(zip([n for n, _ in named], _scales(named, rule, allow_untagged, "lr_scales"), strict=True))


def param_groups(
    params: Params,
    lr: float | Tensor,
    weight_decay: float = 0.0,
    independent_weight_decay: bool = True,
    rule: str = "adam",
    allow_untagged: bool = False,
) -> list[dict[str, Any]]:
    """Torch parameter groups carrying u-μP's per-parameter learning rates, for any optimiser.

    Parameters sharing a factor and a source group share a group, whose ``lr`` is the (group's)
    ``lr`` times the factor, ``weight_decay`` is divided by that ``lr`` when
    ``independent_weight_decay``, and ``umup_scale`` is the factor.

    Args:
        lr: the global learning rate: a finite number > 0, or a one-element tensor (each group
            then holds a tensor of its own).
        weight_decay: the decay (>= 0).
        rule: one of :data:`RULES`.
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: ``lr`` or ``weight_decay`` is out of range, ``rule`` is unknown, or ``params`` is not
            parameters, groups or a module.

    >>> import torch
    >>> from unitscale.optim import param_groups
    >>> from unitscale import nn as unn
    >>> model = torch.nn.Sequential(unn.Linear(64, 64), unn.LinearReadout(64, 10))
    >>> opt = torch.optim.RMSprop(param_groups(model, lr=0.1))
    >>> [round(g["lr"], 4) for g in opt.param_groups]
    [0.0125, 0.1]
    """
    rule = _check_rule("param_groups", rule)
    _check_lr("param_groups", "lr", lr)
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not math.isfinite(weight_decay):
        raise InputError(f"param_groups: weight_decay={weight_decay!r:.60} is not a finite number")
    if weight_decay < 0:
        raise InputError(f"param_groups: weight_decay={weight_decay!r} must be >= 0")
    result: list[dict[str, Any]] = []
    for options, named in _named(params):
        scales = _scales(named, rule, allow_untagged, "param_groups")
        base_lr = options.get("lr", lr)
        base_lr = base_lr.detach() if isinstance(base_lr, Tensor) else float(base_lr)
        base_wd = float(options.get("weight_decay", weight_decay))
        by_scale: dict[float, list[Tensor]] = {}
        for (_, p), factor in zip(named, scales, strict=True):
            by_scale.setdefault(factor, []).append(p)
        for factor, members in by_scale.items():
            # A tensor lr gives each group a tensor of its own (a scheduler may change it in place).
            group_lr = base_lr * factor
            decay = base_wd / float(group_lr) if independent_weight_decay and group_lr > 0 else base_wd
            result.append({**options, "params": members, "lr": group_lr, "weight_decay": decay, "umup_scale": factor})
    return result
