"""Typed exceptions for every error a user can cause.

Each subclasses :class:`UnitscaleError` and the builtin that fits (``TypeError``, ``ValueError``,
``RuntimeError``); messages name the offending node, module or argument and say what to do.
"""

from __future__ import annotations

__all__ = [
    "UnitscaleError",
    "NotAModuleError",
    "NotCallableError",
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
    "UnknownScheduleError",
    "UnknownConstraintError",
    "FormatError",
    "ReplaceMapError",
    "CaptureError",
    "NoRouteError",
    "NoGraphError",
    "UnknownRouteError",
    "UnscaledOpsError",
    "ScaleValueError",
    "TransformError",
    "ConfigError",
    "NodeNotFoundError",
    "MemoryLimitError",
    "MonitorSettingError",
    "MonitorStateError",
    "NoRecordsError",
    "UnknownStatError",
    "UnknownRoleError",
    "MultiplierError",
    "UntaggedParameterError",
    "UntaggedParameterWarning",
    "SweepGridError",
    "BlockedCutError",
    "PlanMismatchError",
    "BackwardValueError",
    "KVCacheError",
    "NothingQuantisedWarning",
    "PlanFileError",
    "PlanSaveError",
    "BackwardError",
    "MetaTensorError",
    "OutOfMemoryError",
    "LostBehaviourError",
    "RuleError",
]


class UnitscaleError(Exception):
    """Base class of every error unitscale raises on bad input."""


class NotAModuleError(UnitscaleError, TypeError):
    """An argument that must be a ``torch.nn.Module`` (or, to :func:`~unitscale.invert`, a function) is not one."""


class NotCallableError(UnitscaleError, TypeError):
    """An argument that must be a function (a graph transform, an inverse) is not callable."""


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
    """A graph given to :func:`~unitscale.invert` has an op with no registered inverse, or is not a chain."""


class StageCountError(UnitscaleError, ValueError):
    """``num_stages`` is below 1 or above the number of nodes that can be split."""


class SplitSpecError(UnitscaleError, ValueError):
    """A stage plan's cut does not fall on a module boundary, so no ``split_spec`` can express it."""


class CostError(UnitscaleError, ValueError):
    """A cost model is unknown, or a cost callable returned a negative or NaN value."""


class PipelineError(UnitscaleError, RuntimeError):
    """A pipeline worker failed or timed out."""


class UnknownScheduleError(UnitscaleError, ValueError):
    """A pipeline schedule name that :func:`~unitscale.run_pipeline` does not know."""


class UnknownConstraintError(UnitscaleError, ValueError):
    """A constraint name is not a key of ``unitscale.scaling.constraints.CONSTRAINTS``."""


class FormatError(UnitscaleError, ValueError):
    """A floating-point format with impossible bit counts or rounding mode."""


class ReplaceMapError(UnitscaleError, TypeError):
    """A ``replace`` map holds a key or value that is not callable."""


class CaptureError(UnitscaleError, RuntimeError):
    """A capture route could not capture the model in one graph (graph break, trace failure)."""


class NoRouteError(CaptureError, TraceError):
    """No route :func:`unitscale.capture.capture` was allowed to try captured the model.

    ``reasons`` maps each route tried to why it failed (exception type, message, ``file:line``).
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


class ScaleValueError(UnitscaleError, ValueError):
    """A scale given to a constraint (``gmean``, ``hmean``, ...) is not a finite number > 0."""


class TransformError(UnitscaleError, RuntimeError):
    """A graph transform given to ``apply_transform`` raised or did not return a ``GraphModule``."""


class ConfigError(InputError):
    """A reference model or data source (``TinyGPT``, ``MarkovSource``) was given an impossible setting."""


class NodeNotFoundError(UnitscaleError, KeyError):
    """A report or plan was indexed by a node name it does not hold."""


class MemoryLimitError(UnitscaleError, ValueError):
    """No pipeline plan fits the memory limit; ``needed`` is the least limit (bytes per device) that works."""

    def __init__(self, message: str, needed: float = float("nan")) -> None:
        super().__init__(message)
        self.needed = float(needed)


class MonitorSettingError(InputError):
    """A :class:`~unitscale.tracking.ScaleMonitor` ``every``, format or step is impossible."""


class MonitorStateError(UnitscaleError, RuntimeError):
    """A :class:`~unitscale.tracking.ScaleMonitor` step opened inside another, or after ``close()``."""


class NoRecordsError(MonitorStateError):
    """A heat map or drift table asked of a monitor (or history) that has recorded nothing yet."""


class UnknownStatError(UnitscaleError, ValueError):
    """A statistic name that a monitor's history does not hold (``std``, ``absmax``, ...)."""


class UnknownRoleError(UnitscaleError, ValueError):
    """A u-μP parameter role that is not one of ``unitscale.scaling.ROLES``."""


class MultiplierError(UnitscaleError, ValueError):
    """A u-μP multiplier (``mult``, an α of the paper) or a width/depth that is not a finite number > 0."""


class UntaggedParameterError(UnitscaleError, TypeError):
    """A u-μP optimiser (or ``lr_scales``) was given a parameter that has no u-μP role."""


class UntaggedParameterWarning(UserWarning):
    """A u-μP optimiser fell back to the default learning-rate scale (1) for a parameter without a role."""


class SweepGridError(UnitscaleError, ValueError):
    """A learning-rate sweep or coordinate check was given too few, non-positive or repeated grid points."""


class BlockedCutError(StageCountError):
    """Values that cannot cross a stage boundary (named in ``blockers``) would leave a stage empty."""

    def __init__(self, message: str, blockers: list[str] | None = None) -> None:
        super().__init__(message)
        self.blockers = list(blockers or [])


class PlanMismatchError(InputError):
    """Two stage plans (or a plan and costs) that a call compares are of different models or graphs."""


class BackwardValueError(BackwardShapeError):
    """A gradient given for the backward pass holds no values (a ``meta`` tensor) to backpropagate."""


class KVCacheError(CaptureError):
    """The model returns a key/value cache object (a ``transformers`` ``DynamicCache``), which no graph can return."""


class NothingQuantisedWarning(UserWarning):
    """``simulate_format``/``simulate_fp8`` found no matmul-like op to round: the model runs as it was."""


class PlanFileError(InputError):
    """A file given to :meth:`~unitscale.StagePlan.load` is missing, not a plan file, or fails a check."""


class PlanSaveError(InputError):
    """:meth:`~unitscale.StagePlan.save` cannot write the path, or a stage holds something that is not data."""


class BackwardError(UnitscaleError, RuntimeError):
    """The model's backward pass raised (a hook, an ``autograd.Function``); the original is the ``__cause__``."""


class MetaTensorError(InputError):
    """The model's parameters, buffers or inputs are on the ``meta`` device: materialise them first."""


class OutOfMemoryError(UnitscaleError, MemoryError):
    """Running the model ran out of memory (not a wrong input); the original is the ``__cause__``."""

    @staticmethod
    def caused(e: BaseException) -> bool:
        """Whether ``e`` (or what it was raised from) is running out of memory.

        >>> from unitscale.errors import OutOfMemoryError
        >>> full = RuntimeError("DefaultCPUAllocator: can't allocate memory: ...")
        >>> OutOfMemoryError.caused(full)
        True
        """
        seen: set[int] = set()
        current: BaseException | None = e
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if isinstance(current, MemoryError) or type(current).__name__ == "OutOfMemoryError":
                return True
            text = str(current)
            if "can't allocate memory" in text or "CUDA out of memory" in text or "out of memory" in text[:200]:
                return True
            current = current.__cause__ or current.__context__
        return False


class LostBehaviourError(CaptureError):
    """A forced capture route would drop a custom backward, a root hook or a grad-mode switch."""


class RuleError(UnitscaleError, ValueError):
    """A rule :func:`~unitscale.transforms.register_rule` cannot place (name taken or unknown, bad anchor)."""
