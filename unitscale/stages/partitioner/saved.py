"""A stage plan on disk: the stage modules (their graphs and weights) and the model's output structure.

What :meth:`~unitscale.StagePlan.save` writes and :meth:`~unitscale.StagePlan.load` reads: data
only (:mod:`unitscale.stages.partitioner.plan_file`): each stage's graph and layers as JSON, its tensors as
plain tensors, read back with ``torch.load(weights_only=True)``; loading needs neither the model's
class nor the code that traced it, and runs no code from the file. Saves are atomic
(:func:`write_atomically`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import torch
from torch import fx
from torch.utils._pytree import TreeSpec, tree_unflatten, treespec_dumps, treespec_loads

from unitscale.errors import InputError, PlanFileError, PlanSaveError
from unitscale.stages.partitioner.costs import flat_inputs
from unitscale.stages.partitioner.plan_file import FORMAT, decode_plan, encode_plan, function_names


class _Plan(Protocol):
    """What :meth:`SavedPlan.from_plan` reads of a :class:`~unitscale.StagePlan` (no import of plan.py,
    which imports this module for ``StagePlan.save``)."""

    output_spec: TreeSpec | None
    model_name: str
    stage_costs: list[float]

    def stage_modules(self) -> list[fx.GraphModule]: ...


__all__ = ["SavedPlan", "load_plan", "save_plan", "write_atomically"]

#: the format before plans were data: pickled GraphModules, refused on load
_OLD_FORMAT = "unitscale.stages.saved/1"


@dataclass
class SavedPlan:
    """The runnable part of a :class:`~unitscale.StagePlan`: what :func:`~unitscale.stages.pipeline_stage` needs.

    >>> import torch
    >>> from unitscale import partition
    >>> from unitscale.examples import MLP
    >>> from unitscale.stages import SavedPlan
    >>> SavedPlan.from_plan(partition(MLP(4, 8), 2, torch.randn(2, 4))).num_stages
    2

    Attributes:
        stage_modules: one module per stage, chained (see :meth:`~unitscale.StagePlan.stage_modules`).
        output_spec: the model's output structure, or ``None`` for one tensor.
        model_name: the model's class name.
        stage_costs: the plan's cost of each stage.
    """

    stage_modules: list[fx.GraphModule]
    output_spec: TreeSpec | None
    model_name: str
    stage_costs: list[float]
    #: stage 0's example inputs as ``(shape, dtype)`` for a tensor or the value itself (``None``):
    #: what a load checks the stages run on (shapes only, no numbers); ``None`` when unknown
    example_inputs: list[Any] | None = None

    @property
    def num_stages(self) -> int:
        """Number of stages."""
        return len(self.stage_modules)

    @classmethod
    def from_plan(cls, plan: _Plan) -> SavedPlan:
        """The stage modules and output structure of ``plan`` (a :class:`~unitscale.StagePlan`)."""
        if not callable(getattr(plan, "stage_modules", None)) or not hasattr(plan, "output_spec"):
            raise InputError(
                f"expected a StagePlan, a SavedPlan or a path to a saved plan, got {type(plan).__name__} "
                f"{plan!r:.60}; make one with unitscale.partition(model, num_stages, example_inputs)"
            )
        examples = getattr(plan, "_example_inputs", None)
        graph = getattr(plan, "graph", None)
        described = None
        if isinstance(examples, tuple) and isinstance(graph, fx.Graph):
            described = [
                (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in flat_inputs(graph, examples)
            ]
        return cls(plan.stage_modules(), plan.output_spec, plan.model_name, list(plan.stage_costs), described)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this plan to ``path`` as :meth:`~unitscale.StagePlan.save` does (data only, atomically).

        >>> import os, tempfile, torch
        >>> from unitscale import StagePlan, partition
        >>> from unitscale.examples import MLP
        >>> path = os.path.join(tempfile.mkdtemp(), "plan.pt")
        >>> partition(MLP(4, 8), 2, torch.randn(2, 4)).save(path)
        >>> StagePlan.load(path).save(path)  # a loaded plan saves again
        >>> StagePlan.load(path).num_stages
        2
        """
        save_plan(self, path)

    def output_from_leaves(self, out: Any) -> Any:
        """The model's output rebuilt from what the last stage returns."""
        if self.output_spec is None:
            return out
        leaves = list(out) if isinstance(out, tuple) and self.output_spec.num_leaves != 1 else [out]
        return tree_unflatten(leaves, self.output_spec)

    def __call__(self, *inputs: Any) -> Any:
        """Run the stages one after the other in this process (a reference for the pipeline)."""
        out: Any = self.stage_modules[0](*inputs)
        for stage in self.stage_modules[1:]:
            out = stage(*out) if isinstance(out, tuple) else stage(out)
        return self.output_from_leaves(out)


def save_plan(plan: _Plan | SavedPlan, path: str | os.PathLike[str]) -> None:
    """Write ``plan``'s stage modules and output structure to ``path`` as data (see :mod:`.plan_file`).

    The file is written beside ``path`` under a temporary name, flushed to disk and renamed over
    ``path``: a save that fails (or is killed) leaves what was at ``path`` as it was.

    Raises:
        PlanSaveError: ``path``'s directory does not exist, ``path`` is a directory, or a stage holds
            something a plan file cannot (a user's leaf module, a hook, a function on a layer).
    """
    saved = plan if isinstance(plan, SavedPlan) else SavedPlan.from_plan(plan)
    target = _save_target(path)
    try:
        output = None if saved.output_spec is None else treespec_dumps(saved.output_spec)
    except Exception as exc:
        raise PlanSaveError(
            f"StagePlan.save({target!r}): the model's output structure ({saved.output_spec}) cannot be written "
            f"as data ({type(exc).__name__}: {exc}); return a tensor, tuple, list, dict or a transformers ModelOutput"
        ) from exc
    fields = {
        "model_name": saved.model_name,
        "stage_costs": [float(c) for c in saved.stage_costs],
        "output": output,
        "inputs": saved.example_inputs,
    }
    text, tensors = encode_plan(fields, saved.stage_modules)
    write_atomically(target, lambda file: torch.save({"format": FORMAT, "plan": text, "tensors": tensors}, file))


def _save_target(path: Any) -> str:
    """``path`` as a string, refused when it cannot be a plan file's path."""
    if not isinstance(path, (str, os.PathLike)):
        raise PlanSaveError(f"StagePlan.save(path={path!r:.60}): pass a file path (a str or pathlib.Path)")
    target = os.fspath(path)
    if isinstance(target, bytes) or not target:
        raise PlanSaveError(f"StagePlan.save(path={path!r:.60}): pass a file path (a non-empty str or pathlib.Path)")
    if os.path.isdir(target):
        raise PlanSaveError(f"StagePlan.save({target!r}): that path is a directory; pass a file path in it")
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise PlanSaveError(
            f"StagePlan.save({target!r}): the directory {directory!r} does not exist; create it first "
            "(os.makedirs(directory, exist_ok=True))"
        )
    return target


def write_atomically(target: str, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``target``, sync it and rename it over ``target``.

    Any failure (an error in ``write``, a full disk, a kill) leaves ``target`` as it was; an error
    removes the temporary file (a kill leaves it, named ``.NAME.*.tmp``).

    >>> import tempfile
    >>> from pathlib import Path
    >>> from unitscale.stages.partitioner.saved import write_atomically
    >>> path = Path(tempfile.mkdtemp()) / "f.bin"
    >>> write_atomically(str(path), lambda f: f.write(b"new"))
    >>> path.read_bytes()
    b'new'
    """
    directory, name = os.path.split(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        try:  # keep the mode the old file had (mkstemp makes 0600)
            os.chmod(temporary, os.stat(target).st_mode & 0o7777)
        except FileNotFoundError:
            os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself, on disk (not every file system can)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load_plan(path: str | os.PathLike[str], functions: Sequence[Callable[..., Any]] = ()) -> SavedPlan:
    """Read a plan :func:`save_plan` wrote; the file is read as data (no code in it runs), every field checked.

    ``functions`` are those the plan's graphs may call beyond the allow-list (see :mod:`.plan_file`).

    Raises:
        PlanFileError: ``path`` is not a path, there is no file, it is not a plan file, it holds objects
            other than data (an old plan format, a crafted file), or a field fails its check.
    """
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise PlanFileError(
            f"StagePlan.load(path={path!r:.60}): pass the path (a str or pathlib.Path) that plan.save(path) wrote"
        )
    allowed = function_names(functions, "StagePlan.load")
    where = os.fspath(path)
    if os.path.isdir(where):
        raise PlanFileError(f"StagePlan.load({where!r}): that path is a directory; pass the file plan.save(path) wrote")
    try:
        data = torch.load(where, weights_only=True, map_location="cpu")
    except FileNotFoundError as exc:
        raise PlanFileError(f"no saved plan at {where!r}; write one with plan.save(path)") from exc
    except pickle.UnpicklingError as exc:
        if _old_format(where):
            raise PlanFileError(
                f"StagePlan.load({where!r}): this plan was saved by an older unitscale (format "
                f"{_OLD_FORMAT!r}), which pickled the stage modules' code, and loading it would run code "
                "from the file; re-create the plan with partition(...) or plan_pipeline(...) and save it again "
                "with plan.save(path) (to convert a file you trust, see 'Plan files' on the API reference page)"
            ) from None
        raise PlanFileError(
            f"StagePlan.load({where!r}): the file holds objects other than data ({str(exc).splitlines()[0]:.200}), "
            "so it was not written by StagePlan.save and is refused unread; a plan file holds only JSON "
            "and tensors: write it with plan.save(path)"
        ) from None
    except Exception as exc:
        raise PlanFileError(
            f"StagePlan.load({where!r}): the file could not be read as a saved plan ({type(exc).__name__}: {exc}); "
            "write it with plan.save(path)"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PlanFileError(f"{where!r} is not a plan written by StagePlan.save (format {FORMAT!r})")
    for key in ("plan", "tensors"):
        if key not in data:
            raise PlanFileError(
                f"StagePlan.load({where!r}): the file has no {key!r} field; it is damaged or was not "
                "written by StagePlan.save: save the plan again with plan.save(path)"
            )
    fields, stages, inputs = decode_plan(where, data["plan"], data["tensors"], allowed)
    spec = _output_spec(where, fields, stages)
    loaded = SavedPlan(stages, spec, _model_name(where, fields), _costs(where, fields, stages), inputs)
    dry_run(where, loaded)
    return loaded


def dry_run(where: str, plan: SavedPlan) -> None:
    """Run the stages, chained, on fake tensors of the example inputs' shapes: a plan that loads runs.

    Shapes only (``FakeTensorMode``: no numbers are computed, the weights are not copied). An op
    whose output shape depends on values, or one without a shape rule, ends the check unrefused.
    """
    if plan.example_inputs is None:
        return
    from torch._subclasses import fake_tensor as fake  # lazy: only loads need it

    cannot_tell = (
        fake.DataDependentOutputException,
        fake.DynamicOutputShapeException,
        fake.UnsupportedOperatorException,
        fake.UnsupportedFakeTensorException,
        NotImplementedError,
    )
    log = logging.getLogger(fake.__name__)  # it logs each failing op as an error; ours says it once
    disabled, log.disabled = log.disabled, True
    try:
        with fake.FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            args = [torch.empty(x[0], dtype=x[1]) if isinstance(x, tuple) else x for x in plan.example_inputs]
            out: Any = plan.stage_modules[0](*args)
            for stage in plan.stage_modules[1:]:
                out = stage(*out) if isinstance(out, tuple) else stage(out)
    except cannot_tell:
        return
    except Exception as exc:
        raise _bad(
            where,
            "its stages do not run on inputs like those the plan was made with "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
        ) from exc
    finally:
        log.disabled = disabled


def _bad(where: str, what: str) -> PlanFileError:
    return PlanFileError(
        f"StagePlan.load({where!r}): {what}; the file is damaged or was not written by StagePlan.save: "
        "save the plan again with plan.save(path)"
    )


def _model_name(where: str, fields: dict[str, Any]) -> str:
    name = fields.get("model_name")
    if not isinstance(name, str):
        raise _bad(where, f"the field 'model_name' is {name!r:.40}, not a string")
    return name


def _costs(where: str, fields: dict[str, Any], stages: list[fx.GraphModule]) -> list[float]:
    costs = fields.get("stage_costs")
    if (
        not isinstance(costs, list)
        or len(costs) != len(stages)
        or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in costs)
    ):
        raise _bad(where, f"the field 'stage_costs' is {costs!r:.60}, not {len(stages)} finite numbers")
    return [float(c) for c in costs]


def _output_spec(where: str, fields: dict[str, Any], stages: list[fx.GraphModule]) -> TreeSpec | None:
    if "output" not in fields:
        raise _bad(where, "the plan has no 'output' field")
    text = fields["output"]
    if text is None:
        return None
    if not isinstance(text, str):
        raise _bad(where, f"the field 'output' is {text!r:.40}, not a JSON text or null")
    try:
        spec = treespec_loads(text)
    except Exception:
        # a transformers ModelOutput is known to torch's pytree once transformers is imported
        if '"transformers.' not in text:
            raise _bad(where, f"the field 'output' is not an output structure torch knows ({text:.80})") from None
        importlib.import_module("transformers")
        try:
            spec = treespec_loads(text)
        except Exception as exc:
            raise _bad(where, f"the field 'output' is not an output structure torch knows ({exc})") from exc
    output = next(n for n in reversed(stages[-1].graph.nodes) if n.op == "output")
    leaves = output.args[0]
    count = len(leaves) if isinstance(leaves, (tuple, list)) else 1
    if spec.num_leaves != count:
        raise _bad(where, f"the output structure has {spec.num_leaves} leaves, the last stage returns {count}")
    return spec


def _old_format(where: str) -> bool:
    """Whether ``where`` is a ``torch.save`` zip whose pickle names the old plan format (read as bytes, never run)."""
    try:
        with zipfile.ZipFile(where) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
            return any(_OLD_FORMAT.encode() in archive.read(n) for n in pickles)
    except (OSError, zipfile.BadZipFile):
        return False
