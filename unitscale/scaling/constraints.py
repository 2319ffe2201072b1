"""Constraints: how a forward and a backward scale are reconciled when they must be equal.

A unit-scaled op wants to multiply its output by one scale (making the output
unit-std) and its input gradients by another (making the gradients unit-std).
Where the gradient must stay a true gradient of the forward function, the two
scales have to be the same number; a *constraint* picks that number. Every
constraint takes the output scale first, then one or more input-gradient scales,
and returns the single scale to use for all of them.

With a constraint, the op's input gradients are the true gradients of the scaled
function it computed. Without one (``constraint=None``) the op is a *cut edge*: each
input gradient is a positive multiple of its true gradient, but a different multiple
from the one the output's consumers see, so the gradient stays a true gradient
upstream only where it does not meet another path's gradient again. That holds where
every path to the loss runs through the op (after the last residual add, unless the
head forks again); it fails inside a residual branch (the branch's gradient meets the
skip's at ``residual_split``), in a squeeze-excitation gate's branch, and between an
op's operands that come from one tensor (q, k and v of attention, both sides of a
``matmul`` of activations), where the meeting gradients mix two scales.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeAlias

from unitscale.errors import ScaleValueError, UnknownConstraintError

__all__ = [
    "gmean",
    "hmean",
    "amean",
    "to_output_scale",
    "to_grad_input_scale",
    "to_left_grad_scale",
    "to_right_grad_scale",
    "Constraint",
    "ConstraintArg",
    "CONSTRAINTS",
    "resolve_constraint",
]

Constraint = Callable[..., float]
"""A function ``(output_scale, *grad_input_scales) -> scale``."""

ConstraintArg: TypeAlias = str | Constraint | None
"""What a ``constraint=`` argument accepts: the name of one of :data:`CONSTRAINTS`, a
:data:`Constraint`, or ``None`` (no constraint: each direction is scaled on its own, which
keeps gradients true only on a cut edge, where they do not meet again upstream; see the
module docstring)."""


def _scales(fn: str, scales: tuple[object, ...]) -> tuple[float, ...]:
    """The scales as floats; each must be a finite number > 0 (a scale of 0 or NaN has no mean)."""
    for i, s in enumerate(scales):
        name = "output_scale" if i == 0 else "grad_input_scale" if i == 1 else f"grad_input_scale #{i}"
        if isinstance(s, bool) or not isinstance(s, (int, float)) and not hasattr(s, "__float__"):
            raise ScaleValueError(f"{fn}: {name}={s!r:.60} is a {type(s).__name__}; pass a finite number > 0")
        try:
            value = float(s)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ScaleValueError(f"{fn}: {name}={s!r:.60} is not a number ({e}); pass a finite number > 0") from None
        if not (0 < value < math.inf):
            raise ScaleValueError(f"{fn}: {name}={value!r} must be a finite number > 0")
    return tuple(float(s) for s in scales)  # type: ignore[arg-type]


def gmean(output_scale: float, *grad_input_scales: float) -> float:
    """Geometric mean of the output scale and the grad-input scales.

    The default constraint: output and gradients miss unit std by the same factor,
    one above and one below 1.

    Args:
        output_scale: the scale that would make the output unit-std.
        *grad_input_scales: the scales that would make each input gradient unit-std
            (none: the mean of one number is itself, as in the reference library).

    Returns:
        ``(output_scale * prod(grad_input_scales)) ** (1 / n)``.

    Raises:
        ScaleValueError: a scale that is not a finite number > 0 (every constraint checks).

    >>> from unitscale.scaling import gmean
    >>> round(gmean(1 / 8, 1 / 2), 4), gmean(3.0)
    (0.25, 3.0)
    """
    scales = _scales("gmean", (output_scale, *grad_input_scales))
    if len(scales) == 1:
        return scales[0]
    return math.exp(sum(math.log(s) for s in scales) / len(scales))


def hmean(output_scale: float, *grad_input_scales: float) -> float:
    """Harmonic mean ``n / sum(1 / s)`` of the output scale and the grad-input scales (leans to the smaller).

    >>> from unitscale.scaling import hmean
    >>> hmean(0.25, 1.0), hmean(2.0)
    (0.4, 2.0)
    """
    scales = _scales("hmean", (output_scale, *grad_input_scales))
    # Relative to the smallest scale, so that neither 1/s nor the sum can overflow.
    least = min(scales)
    return least * (len(scales) / sum(least / s for s in scales))


def amean(output_scale: float, *grad_input_scales: float) -> float:
    """Arithmetic mean ``sum(s) / n`` of the output scale and the grad-input scales (leans to the larger).

    >>> from unitscale.scaling import amean
    >>> amean(0.25, 1.0), amean(2.0)
    (0.625, 2.0)
    """
    scales = _scales("amean", (output_scale, *grad_input_scales))
    return sum(s / len(scales) for s in scales)  # the plain sum overflows near the largest float


def to_output_scale(output_scale: float, grad_input_scale: float, *more_grad_input_scales: float) -> float:
    """Use ``output_scale`` everywhere: outputs are exactly unit-std, gradients are not.

    The grad-input scales are checked, then ignored (accepted so all constraints share a signature).

    >>> from unitscale.scaling import to_output_scale
    >>> to_output_scale(0.25, 1.0)
    0.25
    """
    return _scales("to_output_scale", (output_scale, grad_input_scale, *more_grad_input_scales))[0]


def to_grad_input_scale(output_scale: float, grad_input_scale: float, *more_grad_input_scales: float) -> float:
    """Use the grad-input scale everywhere: gradients are unit-std, outputs are not.

    With several grad-input scales (``matmul`` has two), their geometric mean; ``output_scale``
    is checked, then ignored.

    >>> from unitscale.scaling import to_grad_input_scale
    >>> to_grad_input_scale(0.25, 1.0)
    1.0
    >>> to_grad_input_scale(0.25, 1.0, 0.25)
    0.5
    """
    _scales("to_grad_input_scale", (output_scale, grad_input_scale, *more_grad_input_scales))
    return gmean(grad_input_scale, *more_grad_input_scales)


def to_left_grad_scale(output_scale: float, left_grad_scale: float, *right_grad_scales: float) -> float:
    """Use the first (left) operand's gradient scale everywhere: its gradient is unit-std.

    For ``matmul``'s ``(output, left, right)`` the left operand's; for an op with one
    input, that input's (as :func:`to_grad_input_scale`). The other scales are checked, then ignored.

    >>> from unitscale.scaling.constraints import to_left_grad_scale
    >>> to_left_grad_scale(0.25, 1.0, 0.5)
    1.0
    """
    return _scales("to_left_grad_scale", (output_scale, left_grad_scale, *right_grad_scales))[1]


def to_right_grad_scale(output_scale: float, grad_input_scale: float, *more_grad_input_scales: float) -> float:
    """Use the last (right) operand's gradient scale everywhere: its gradient is unit-std.

    For ``matmul``'s ``(output, left, right)`` the right operand's; for an op with one
    input, that input's. The other scales are checked, then ignored.

    >>> from unitscale.scaling.constraints import to_right_grad_scale
    >>> to_right_grad_scale(0.25, 1.0, 0.5)
    0.5
    """
    return _scales("to_right_grad_scale", (output_scale, grad_input_scale, *more_grad_input_scales))[-1]


CONSTRAINTS: dict[str, Constraint] = {
    "gmean": gmean,
    "hmean": hmean,
    "amean": amean,
    "to_output_scale": to_output_scale,
    "to_grad_input_scale": to_grad_input_scale,
    "to_left_grad_scale": to_left_grad_scale,
    "to_right_grad_scale": to_right_grad_scale,
}
"""Every constraint by name, as accepted by the ``constraint=`` argument of the ops."""


def resolve_constraint(constraint: ConstraintArg) -> Callable[..., float] | None:
    """The constraint function a ``constraint=`` argument (a :data:`ConstraintArg`) names, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` is a string that names no constraint,
            or is neither a string, a callable nor ``None``.

    >>> resolve_constraint("gmean") is gmean
    True
    >>> resolve_constraint(None) is None
    True
    """
    if constraint is None:
        return None
    if isinstance(constraint, str):
        if constraint in CONSTRAINTS:
            return CONSTRAINTS[constraint]
        raise UnknownConstraintError(f"unknown constraint {constraint!r}; use {_valid_choices()}")
    if callable(constraint):
        return constraint
    raise UnknownConstraintError(
        f"constraint must be a name, a callable or None, not {type(constraint).__name__} {constraint!r}; "
        f"use {_valid_choices()}"
    )


def _valid_choices() -> str:
    names = ", ".join(repr(n) for n in CONSTRAINTS)
    return f"one of {names}, a callable (output_scale, *grad_input_scales) -> float, or None"
