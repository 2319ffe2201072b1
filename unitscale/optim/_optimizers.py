"""Torch's optimisers with u-μP's per-role learning rates."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from unitscale.errors import InputError
from unitscale.optim._rules import Params, param_groups

__all__ = ["SGD", "Adam", "AdamW"]

_ARGS = """\
    Args:
        params: a module, parameters, or parameter groups (tagged: built from :mod:`unitscale.nn`, or
            :func:`~unitscale.scaling.tag`).
        lr: the global learning rate, a float or a one-element tensor (each group gets its own tensor,
            ``lr`` times the group's factor).
        weight_decay: {decay}
        independent_weight_decay: divide each group's decay by its ``lr`` (see :func:`param_groups`).
        allow_untagged: give untagged parameters the factor 1 with a warning instead of raising.
        **kwargs: passed to :class:`torch.optim.{base}`{extra}.

    Raises:
        UntaggedParameterError: a parameter has no role (and ``allow_untagged`` is false).
        InputError: a bad {bad}."""


class _RoleScaled:
    """The constructor every optimiser here shares: torch's, handed u-μP's parameter groups.

    A subclass docstring's line ``{args}`` is filled from :data:`_ARGS` with the class's texts.
    """

    _rule = "adam"
    _decay = ""
    _extra = ""
    _bad = "``lr`` or ``weight_decay``"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__doc__ and "    {args}" in cls.__doc__:
            args = _ARGS.format(decay=cls._decay, base=cls.__name__, extra=cls._extra, bad=cls._bad)
            cls.__doc__ = cls.__doc__.replace("    {args}", args)

    def __init__(
        self,
        params: Params,
        lr: float | Tensor = 1e-3,
        weight_decay: float = 0.0,
        independent_weight_decay: bool = True,
        allow_untagged: bool = False,
        **kwargs: Any,
    ) -> None:
        groups = param_groups(params, lr, weight_decay, independent_weight_decay, self._rule, allow_untagged)
        super().__init__(groups, lr=lr, **kwargs)  # type: ignore[call-arg]


class Adam(_RoleScaled, torch.optim.Adam):
    """:class:`torch.optim.Adam` with u-μP's per-role learning rates (see :mod:`unitscale.optim`).

    {args}

    >>> from unitscale.nn import Linear
    >>> from unitscale.optim import Adam
    >>> opt = Adam(Linear(64, 4).parameters(), lr=0.1)
    >>> round(opt.param_groups[0]["lr"], 4)
    0.0125
    """

    _decay = (
        "L2 decay (through Adam's normaliser, as in torch), divided by each group's ``lr`` when\n"
        "            ``independent_weight_decay``."
    )
    _extra = " (``betas``, ``eps``, ...)"


class AdamW(_RoleScaled, torch.optim.AdamW):
    """:class:`torch.optim.AdamW` with u-μP's per-role learning rates and lr-independent decay.

    {args}

    >>> from unitscale.nn import RMSNorm
    >>> from unitscale.optim import AdamW
    >>> opt = AdamW(RMSNorm(8).parameters(), lr=0.1, weight_decay=0.01)
    >>> round(opt.param_groups[0]["weight_decay"], 4)
    0.1
    """

    _decay = (
        "the decay step per update (``p -= weight_decay * p``) when ``independent_weight_decay``;\n"
        "            torch's ``lr * weight_decay`` otherwise."
    )


class SGD(_RoleScaled, torch.optim.SGD):
    """:class:`torch.optim.SGD` with u-μP's per-role learning rates and independent weight decay.

    ``readout_constraint`` says how the model's readout scales its backward pass:
    ``None`` (unit-scaled gradients: Adam's rules) or ``"to_output_scale"`` (tied to its
    forward, so gradients shrink with width: SGD's own rules, see :mod:`unitscale.optim`).

    {args}

    >>> from unitscale.nn import Linear
    >>> from unitscale.optim import SGD
    >>> opt = SGD(Linear(16, 4).parameters(), lr=1.0, momentum=0.9)
    >>> opt.param_groups[0]["lr"]
    0.25
    """

    _decay = "decay, independent of ``lr`` by default."
    _extra = " (``momentum``, ``nesterov``, ...)"
    _bad = "``lr``, ``weight_decay`` or ``readout_constraint``"

    def __init__(
        self,
        params: Params,
        lr: float | Tensor = 1e-2,
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
        self._rule = "sgd" if readout_constraint is None else "sgd_to_output_scale"
        super().__init__(params, lr, weight_decay, independent_weight_decay, allow_untagged, **kwargs)
