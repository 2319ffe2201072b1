"""Typed exceptions for every error a user can cause.

Each exception subclasses :class:`UnitscaleError` and the builtin that fits
(``TypeError`` for a wrong kind of thing, ``ValueError`` for a bad value,
``RuntimeError`` for a failure while running). Messages name the offending
node, module or argument and say what to do.

>>> from unitscale.errors import NotAModuleError, UnitscaleError
>>> issubclass(NotAModuleError, TypeError) and issubclass(NotAModuleError, UnitscaleError)
True
"""

from __future__ import annotations

__all__ = [
    "UnitscaleError",
    "NotAModuleError",
    "InputError",
    "BackwardShapeError",
    "NoFloatOutputError",
    "TraceError",
    "PredicateError",
    "NotInvertibleError",
    "StageCountError",
    "SplitSpecError",
    "CostError",
    "PipelineError",
    "UnknownConstraintError",
    "FormatError",
    "ReplaceMapError",
    "CaptureError",
    "NoRouteError",
    "NoGraphError",
    "UnknownRouteError",
    "UnscaledOpsError",
]


class UnitscaleError(Exception):
    """Base class of every error unitscale raises on bad input."""


class NotAModuleError(UnitscaleError, TypeError):
    """An argument that must be a ``torch.nn.Module`` (or callable) is not one."""


class InputError(UnitscaleError, ValueError):
    """Inputs of the wrong type, shape or count for the model."""


class BackwardShapeError(UnitscaleError, ValueError):
    """A gradient given for the backward pass does not match the output's shape."""


class NoFloatOutputError(UnitscaleError, ValueError):
    """The model returned no floating-point tensor to take a backward pass from."""


class TraceError(UnitscaleError, RuntimeError):
    """``torch.fx`` could not trace the model (data-dependent control flow, ...)."""


class PredicateError(UnitscaleError, RuntimeError):
    """A user-supplied predicate or callable raised or returned the wrong type."""


class NotInvertibleError(UnitscaleError, ValueError):
    """A graph contains an op with no registered inverse (or is not a chain).

    >>> import torch, unitscale
    >>> unitscale.invert(lambda x: torch.relu(x))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.NotInvertibleError: cannot invert node 'relu' (torch.relu) in function <lambda>: ...
    """


class StageCountError(UnitscaleError, ValueError):
    """``num_stages`` is below 1 or above the number of nodes that can be split."""


class SplitSpecError(UnitscaleError, ValueError):
    """A stage plan's cut does not fall on a module boundary, so no ``split_spec`` can express it."""


class CostError(UnitscaleError, ValueError):
    """A cost model is unknown, or a cost callable returned a negative or NaN value."""


class PipelineError(UnitscaleError, RuntimeError):
    """A pipeline worker failed or timed out."""


class UnknownConstraintError(UnitscaleError, ValueError):
    """A constraint name is not one of ``unitscale.scaling.constraints``'."""


class FormatError(UnitscaleError, ValueError):
    """A floating-point format with impossible bit counts or rounding mode."""


class ReplaceMapError(UnitscaleError, TypeError):
    """A ``replace`` map holds a key or value that is not callable."""


class CaptureError(UnitscaleError, RuntimeError):
    """A capture route could not capture the model in one graph (graph break, trace failure)."""


class NoRouteError(CaptureError):
    """No route :func:`unitscale.capture.capture` was allowed to try captured the model.

    ``reasons`` maps each route tried to why it failed (exception type, message, file:line).
    """

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reasons = dict(reasons or {})


class NoGraphError(NoRouteError):
    """A tool needs a graph, and the capture is an eager op record (every graph route failed)."""


class UnknownRouteError(UnitscaleError, ValueError):
    """A capture route name that is not one of ``unitscale.capture.ROUTES``."""


class UnscaledOpsError(UnitscaleError, RuntimeError):
    """``unit_scale(..., strict=True)`` found ops it could not unit-scale."""
