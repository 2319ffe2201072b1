"""Torch's optimisers with u-μP's per-role learning rates."""

from __future__ import annotations

from typing import Any

import torch

from unitscale.errors import InputError
from unitscale.optim._rules import Params, param_groups

__all__ = ["SGD", "Adam", "AdamW"]


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
