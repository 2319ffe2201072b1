"""Typed exceptions for every error a user can cause, and the contract they serve.

Each exception subclasses :class:`UnitscaleError` and the builtin that fits
(``TypeError`` for a wrong kind of thing, ``ValueError`` for a bad value,
``RuntimeError`` for a failure while running). Messages name the offending
node, module or argument and say what to do.

The contract every public function and class of unitscale keeps:

1. **Arguments are checked.** A bad argument raises a :class:`UnitscaleError`
   subclass whose message names the argument, what it got and what it accepts,
   before any work starts (no worker process, no trace, no change to anything).
2. **The user's module is left as it was.** No call changes the module, its
   submodules, parameters, buffers (values included), attributes, hooks or its
   ``training`` flag, unless its docs say it does (``unit_scale`` re-initialises the
   weights of the copy it returns, not the original). A ``forward`` that assigns to its
   module while it is traced or run for statistics (``self.steps += 1``,
   ``self.last = y``) is undone, whether the call succeeds or fails.
3. **A numeric result is never silently NaN.** Where a NaN or infinity reaches a
   reported number, the report says so (``ScaleReport.first_nonfinite``, the
   ``finite`` column of its table, ``NON-FINITE`` in ``analyse_module``'s code).
4. **A failure is blamed where it happened.** A pipeline worker that raises, exits,
   is killed or hangs is named first, with its exception type and message, exit code
   or signal, or the line it is stuck at; its traceback follows.
5. **Wrong answers are refused, not returned.** Inputs that a computation would
   handle wrongly (microbatches of unequal size, a target whose batch differs from
   the inputs') raise instead.

>>> from unitscale.errors import NotAModuleError, UnitscaleError
>>> [issubclass(NotAModuleError, base) for base in (TypeError, UnitscaleError)]
[True, True]
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
    """An argument that must be a ``torch.nn.Module`` (or, for :func:`~unitscale.invert`, a
    function or a module) is not one."""


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
    """A graph contains an op with no registered inverse (or is not a chain).

    >>> import torch, unitscale
    >>> unitscale.invert(lambda x: torch.relu(x))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.NotInvertibleError: cannot invert node 'relu' (torch.relu) in ...
    """


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
    """A constraint name is not one of ``unitscale.scaling.constraints``'."""


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
    """A scale given to a constraint (``gmean``, ``hmean``, ...) is not a finite number > 0.

    >>> import unitscale
    >>> unitscale.scaling.gmean(0, 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.ScaleValueError: gmean: output_scale=0.0 must be a finite ...
    """


class TransformError(UnitscaleError, RuntimeError):
    """A graph transform given to ``apply_transform`` raised or did not return a ``GraphModule``."""


class ConfigError(InputError):
    """A reference model or data source was built with an impossible setting (``TinyGPT``, ``MarkovSource``).

    >>> import unitscale
    >>> unitscale.examples.TinyGPT(d_model=10, n_heads=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.ConfigError: TinyGPT: d_model=10 is not divisible by ...
    """


class NodeNotFoundError(UnitscaleError, KeyError):
    """A report or plan was indexed by a node name it does not hold."""


class MemoryLimitError(UnitscaleError, ValueError):
    """No pipeline plan fits the memory limit; ``needed`` is the least limit (bytes per device) that works.

    >>> from unitscale.errors import MemoryLimitError
    >>> MemoryLimitError("too small", needed=2e9).needed
    2000000000.0
    """

    def __init__(self, message: str, needed: float = float("nan")) -> None:
        super().__init__(message)
        self.needed = float(needed)


class MonitorSettingError(InputError):
    """A :class:`~unitscale.tracking.ScaleMonitor` setting is impossible: ``every`` not an int >= 1, a
    format that is not an :class:`~unitscale.formats.FPFormat`, a step that is not an int >= 0.

    >>> import torch, unitscale
    >>> model = torch.nn.Linear(2, 2)
    >>> unitscale.tracking.ScaleMonitor(model, every=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.MonitorSettingError: ScaleMonitor: every=0 must be an int ...
    """


class MonitorStateError(UnitscaleError, RuntimeError):
    """A :class:`~unitscale.tracking.ScaleMonitor` used out of order: a step opened inside another,
    or after ``close()``."""


class NoRecordsError(MonitorStateError):
    """A heat map or drift table asked of a monitor (or history) that has recorded nothing yet."""


class UnknownStatError(UnitscaleError, ValueError):
    """A statistic name that a monitor's history does not hold (``std``, ``absmax``, ...)."""


class UnknownRoleError(UnitscaleError, ValueError):
    """A u-μP parameter role that is not one of ``unitscale.scaling.ROLES``.

    >>> import torch
    >>> from unitscale.scaling import tag
    >>> tag(torch.nn.Parameter(torch.zeros(2)), "gain", width=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.UnknownRoleError: tag: role='gain' is not a u-μP role; ...
    """


class MultiplierError(UnitscaleError, ValueError):
    """A u-μP multiplier (``mult``, an α of the paper) or a width/depth that is not a finite number > 0."""


class UntaggedParameterError(UnitscaleError, TypeError):
    """A u-μP optimiser (or ``lr_scales``) was given a parameter that has no u-μP role."""


class UntaggedParameterWarning(UserWarning):
    """A u-μP optimiser fell back to the default learning-rate scale (1) for a parameter without a role."""


class SweepGridError(UnitscaleError, ValueError):
    """A learning-rate sweep or coordinate check was given too few, non-positive or repeated grid points."""


class BlockedCutError(StageCountError):
    """A partition would leave a stage with nothing to do, because values that cannot cross a stage
    boundary (not tensors) block the cuts; ``blockers`` names those values.

    >>> from unitscale.errors import BlockedCutError
    >>> BlockedCutError("blocked", blockers=["size"]).blockers
    ['size']
    """

    def __init__(self, message: str, blockers: list[str] | None = None) -> None:
        super().__init__(message)
        self.blockers = list(blockers or [])


class PlanMismatchError(InputError):
    """Two stage plans (or a plan and costs) that a call compares are of different models or graphs."""


class BackwardValueError(BackwardShapeError):
    """A gradient given for the backward pass holds no values (a ``meta`` tensor) to backpropagate."""


class KVCacheError(CaptureError):
    """The model returns a key/value cache object (a ``transformers`` ``DynamicCache``), which no graph can return.

    Raised where switching the cache off through the model's config cannot help (a
    ``use_cache=True`` passed in, a cache object passed in); every tool says the same fix.
    """


class NothingQuantisedWarning(UserWarning):
    """``simulate_format``/``simulate_fp8`` found no matmul-like op (linear, matmul, conv, attention) to round.

    The model runs in full precision as it was: a warning, not an error, since the result is
    correct and a model may legitimately have no matmul (a normalisation, an activation);
    the message names the model and the ops the simulation rounds.
    """


class PlanFileError(InputError):
    """A file given to :meth:`~unitscale.StagePlan.load` (or ``pipeline_stage``) is not a plan file it can use:
    missing, not a path, holding objects other than data (an old pickled plan, a crafted file), or with a
    field that fails its check. Nothing in the file runs."""


class PlanSaveError(InputError):
    """:meth:`~unitscale.StagePlan.save` cannot write the plan: the directory is missing, the path is a
    directory, or a stage holds something that is not data (a user's leaf module, a hook, a function)."""


class BackwardError(UnitscaleError, RuntimeError):
    """The model's backward pass raised (a backward hook, a custom ``autograd.Function``'s backward).

    The original exception is the ``__cause__``; the message names the call and the model.
    """


class MetaTensorError(InputError):
    """The model's parameters, buffers or inputs are on the ``meta`` device: they hold no values to run.

    Materialise the model first (``model.to_empty(device="cpu")``, then initialise or load
    its weights) and pass real input tensors.
    """


class OutOfMemoryError(UnitscaleError, MemoryError):
    """Running the model ran out of memory (``torch.OutOfMemoryError``, or an allocator's "can't allocate").

    Not a wrong input: the message says to use smaller inputs, free memory or another device.
    The original error is the ``__cause__``.
    """

    @staticmethod
    def caused(e: BaseException) -> bool:
        """Whether ``e`` (or what it was raised from) is running out of memory.

        >>> from unitscale.errors import OutOfMemoryError
        >>> full = RuntimeError("DefaultCPUAllocator: can't allocate memory: ...")
        >>> OutOfMemoryError.caused(full)
        True
        >>> OutOfMemoryError.caused(ValueError("mat1 and mat2 shapes differ"))
        False
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
    """A capture route would drop something the model does, so its graph would not be the model.

    A custom ``torch.autograd.Function`` whose backward the route replaces by the derivative
    of its forward, a hook on the root module that the route does not run, a module's own
    grad-mode switch. The message names the module, the Function or hook, and what would be
    lost; ``route="auto"`` moves on to a route that keeps it, a forced route refuses.
    """


class RuleError(UnitscaleError, ValueError):
    """A rule :func:`~unitscale.transforms.register_rule` cannot place in the unit-scaling pass.

    A name taken (or, for :func:`~unitscale.transforms.unregister_rule`, unknown), an anchor
    (``before``/``after``) that names no rule, or both anchors at once.
    """
