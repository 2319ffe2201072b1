"""A stage plan on disk, as data: the stage graphs as JSON, their tensors as plain tensors.

Loading never unpickles or runs anything from the file; the format and the allow-list are
described under "Plan files" on the API reference page.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import json
import keyword
import logging
import math
import operator
import os
import pickle
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

import torch
from torch import fx, nn
from torch.utils._pytree import TreeSpec, tree_unflatten, treespec_dumps, treespec_loads

from unitscale.errors import InputError, PlanFileError, PlanSaveError
from unitscale.stages.partitioner.costs import flat_inputs

__all__ = ["SavedPlan", "save_plan", "load_plan", "FORMAT"]

FORMAT = "unitscale.stages.saved/2"
#: the format before plans were data: pickled GraphModules, refused on load
_OLD_FORMAT = "unitscale.stages.saved/1"


class _Plan(Protocol):
    """What :meth:`SavedPlan.from_plan` reads of a :class:`~unitscale.StagePlan` (plan.py imports this module)."""

    output_spec: TreeSpec | None
    model_name: str
    stage_costs: list[float]

    def stage_modules(self) -> list[fx.GraphModule]: ...


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
        return output_from_leaves(out, self.output_spec)

    def __call__(self, *inputs: Any) -> Any:
        """Run the stages one after the other in this process (a reference for the pipeline)."""
        return self.output_from_leaves(run_chained(self.stage_modules, inputs))


def output_from_leaves(out: Any, spec: TreeSpec | None) -> Any:
    """The model's output (structure ``spec``; ``None``: as it is) from what the last stage returns."""
    if spec is None:
        return out
    return tree_unflatten(list(out) if isinstance(out, tuple) and spec.num_leaves != 1 else [out], spec)


def save_plan(plan: _Plan | SavedPlan, path: str | os.PathLike[str]) -> None:
    """Write ``plan``'s stage modules and output structure to ``path`` as data, atomically.

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

    Any failure leaves ``target`` as it was; an error removes the temporary file (a kill leaves it).
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

    ``functions`` are those the plan's graphs may call beyond the allow-list.

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
    missing = [key for key in ("plan", "tensors") if key not in data]
    if missing:
        raise _bad(where, f"the file has no {missing[0]!r} field")
    fields, stages, inputs = decode_plan(where, data["plan"], data["tensors"], allowed)
    spec = _output_spec(where, fields, stages)
    loaded = SavedPlan(stages, spec, *_name_and_costs(where, fields, stages), inputs)
    dry_run(where, loaded)
    return loaded


def dry_run(where: str, plan: SavedPlan) -> None:
    """Run the stages, chained, on fake tensors of the example inputs' shapes: a plan that loads runs.

    An op whose output shape depends on values, or one without a shape rule, ends the check unrefused.
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
            run_chained(plan.stage_modules, args)
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


def run_chained(stages: Sequence[nn.Module], inputs: Sequence[Any]) -> Any:
    """The last stage's output, each stage fed the one before's (unpacked when a tuple)."""
    out: Any = stages[0](*inputs)
    for stage in stages[1:]:
        out = stage(*out) if isinstance(out, tuple) else stage(out)
    return out


def _bad(where: str, what: str) -> PlanFileError:
    return PlanFileError(
        f"StagePlan.load({where!r}): {what}; the file is damaged or was not written by StagePlan.save: "
        "save the plan again with plan.save(path)"
    )


def _name_and_costs(where: str, fields: dict[str, Any], stages: list[fx.GraphModule]) -> tuple[str, list[float]]:
    name, costs = fields.get("model_name"), fields.get("stage_costs")
    if not isinstance(name, str):
        raise _bad(where, f"the field 'model_name' is {name!r:.40}, not a string")
    if (
        not isinstance(costs, list)
        or len(costs) != len(stages)
        or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in costs)
    ):
        raise _bad(where, f"the field 'stage_costs' is {costs!r:.60}, not {len(stages)} finite numbers")
    return name, [float(c) for c in costs]


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
    leaves = stages[-1].graph.output_node().args[0]
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


# the nn.Module bookkeeping (hooks, parameter dicts) a fresh module builds itself
_MODULE_BOOKKEEPING = frozenset(nn.Module().__dict__) - {"training"}
_HOOK_DICTS = tuple(
    name for name in _MODULE_BOOKKEEPING if "hook" in name and isinstance(getattr(nn.Module(), name), dict)
)

# functions a graph may call: the modules tracers and torch.export put in graphs
_FUNCTION_MODULES = frozenset(
    {
        "torch",
        "torch.functional",
        "torch.nn.functional",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._fft",
        "torch._C._special",
        "torch.fft",
        "torch.linalg",
        "torch.special",
        "operator",
        "_operator",
        "math",
    }
)
_FUNCTION_PREFIXES = ("einops.", "unitscale.functional.")
_BUILTINS = frozenset({"getattr", "len", "abs", "min", "max", "int", "float", "bool", "round", "pow", "divmod"})
_OP_NAMESPACES = frozenset({"aten", "prims"})  # torch's own; others must be registered before a load
_REFUSED_FUNCTIONS = frozenset({"from_file"})  # aten/torch functions that read files
_ROOTS: dict[str, Any] = {"torch": torch, "operator": operator, "_operator": operator, "math": math}


def _plain_name(name: Any) -> bool:
    """A public identifier: what a method, attribute or function name in a plan file may be."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def _identifier(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not name.startswith("__")


def _part(name: Any) -> bool:
    """A module, parameter or buffer name (``fc1``, ``0``), never a dunder."""
    return isinstance(name, str) and (name.isidentifier() or name.isdigit()) and not name.startswith("__")


def _importable(module: Any, name: Any) -> Any:
    """The function ``module.name`` of an imported module (not ``__main__``), or ``None``."""
    if not isinstance(module, str) or module == "__main__" or not _identifier(name):
        return None
    return getattr(sys.modules.get(module), name, None)


def function_names(functions: Any, who: str) -> dict[tuple[str, str], Any]:
    """``(module, name) -> function`` for the functions a caller allows a plan to call beyond the allow-list."""
    if callable(functions) or not isinstance(functions, (list, tuple, set, frozenset)):
        raise PlanFileError(f"{who}(functions={functions!r:.60}): pass a list of functions (or [] for none)")
    named = {}
    for fn in functions:
        module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
        if not callable(fn) or not isinstance(module, str) or not isinstance(name, str):
            raise PlanFileError(f"{who}(functions=...) holds {fn!r:.60}, which is not a named function")
        named[(module, name)] = fn
    return named


def _resolve_module(module: str) -> Any:
    """The module object ``module`` (a dotted name on the allow-list), walked from its allowed root."""
    allowed = module in _FUNCTION_MODULES or module.startswith(_FUNCTION_PREFIXES)
    parts = module.split(".")
    if not allowed or not all(_identifier(p) for p in parts):
        raise LookupError(f"module {module!r} is not one a plan's graph may call into")
    if parts[0] in _ROOTS:
        return functools.reduce(getattr, parts[1:], _ROOTS[parts[0]])
    return importlib.import_module(module)  # einops.*, unitscale.functional.*: installed packages only


def _resolve_function(module: str, name: str) -> Any:
    """The function ``module.name``, refused unless the allow-list names it and it says it is that function."""
    if module == "builtins":
        if name not in _BUILTINS:
            raise LookupError(f"builtins.{name} is not one a plan's graph may call")
        return getattr(builtins, name)
    if not _identifier(name) or name in _REFUSED_FUNCTIONS:
        raise LookupError(f"{module}.{name} is not a function a plan's graph may call")
    fn = getattr(_resolve_module(module), name)
    # a name that leads elsewhere (torch.os.system) does not say it is torch's
    if getattr(fn, "__module__", None) != module or getattr(fn, "__name__", None) != name:
        raise LookupError(f"{module}.{name} is not a function of {module}")
    return fn


def _resolve_op(namespace: str, name: str, overload: str | None) -> Any:
    # dunder names are fine here (aten::__and__): only an OpOverloadPacket passes the check below.
    # Another namespace (a library's custom op, transformers::grouped_mm_fallback) resolves only to
    # an op that code already imported in this process registered; nothing is loaded for it.
    if not _identifier(namespace) or not name.isidentifier() or name in _REFUSED_FUNCTIONS:
        raise LookupError(f"torch.ops.{namespace}.{name} is not an op a plan's graph may call")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError) as exc:
        hint = "" if namespace in _OP_NAMESPACES else f": import the library that defines {namespace}:: ops first"
        raise LookupError(f"the op {namespace}::{name} is not registered in this process{hint}") from exc
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise LookupError(f"torch.ops.{namespace}.{name} is not an op")
    if overload is None:
        return packet
    if not overload.isidentifier():
        raise LookupError(f"{overload!r} is not an overload name")
    op = getattr(packet, overload)
    if not isinstance(op, torch._ops.OpOverload):
        raise LookupError(f"torch.ops.{namespace}.{name}.{overload} is not an op overload")
    return op


def _resolve_higher_order(name: str) -> Any:
    if not _identifier(name):
        raise LookupError(f"{name!r} is not a higher-order op name")
    op = getattr(torch.ops.higher_order, name)
    if not isinstance(op, torch._ops.HigherOrderOperator):
        raise LookupError(f"torch.ops.higher_order.{name} is not a higher-order op")
    return op


def _resolve_layer(module: str, name: str) -> type[nn.Module]:
    """A ``torch.nn.modules`` class by its module and name."""
    if not module.startswith("torch.nn.modules.") or not all(_identifier(p) for p in module.split(".")):
        raise LookupError(f"{module}.{name} is not a torch.nn layer")
    obj = functools.reduce(getattr, module.split(".")[1:], torch)
    cls = getattr(obj, name) if _identifier(name) else None
    if not isinstance(cls, type) or not issubclass(cls, nn.Module) or cls.__module__ != module:
        raise LookupError(f"{module}.{name} is not a torch.nn layer")
    return cls


@dataclass
class _Encoder:
    """Stage modules to JSON-able data, their tensors collected once each (shared ones stay shared)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    _keys: dict[int, str] = field(default_factory=dict)

    def tensor(self, t: torch.Tensor) -> str:
        key = self._keys.get(id(t))
        if key is None:
            key = self._keys[id(t)] = f"t{len(self.tensors)}"
            self.tensors[key] = t.detach()
        return key

    def value(self, v: Any, where: str) -> Any:
        """A plain value (a node argument, a layer attribute) as JSON; a :class:`~torch.fx.Node` by name."""
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, fx.Node):
            return {"node": v.name}
        if isinstance(v, torch.Size):
            return {"size": [self.value(x, where) for x in v]}
        if isinstance(v, tuple):
            return {"tuple": [self.value(x, where) for x in v]}
        if isinstance(v, list):
            return [self.value(x, where) for x in v]
        if isinstance(v, dict):
            return {"dict": [[self.value(k, where), self.value(x, where)] for k, x in v.items()]}
        if isinstance(v, slice):
            return {"slice": [self.value(x, where) for x in (v.start, v.stop, v.step)]}
        if v is Ellipsis:
            return {"ellipsis": None}
        for kind in (torch.dtype, torch.layout, torch.memory_format):
            if isinstance(v, kind):
                return {kind.__name__: str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        raise PlanSaveError(
            f"StagePlan.save: {where} holds {type(v).__name__} {v!r:.60}, which a plan file cannot hold "
            "(it holds graphs, torch.nn layers, tensors and plain values: numbers, strings, tuples, dtypes); "
            "remove it from the model, or set it to a plain value, before partitioning"
        )

    def target(self, node: fx.Node, where: str) -> Any:
        target = node.target
        if node.op != "call_function":
            return target
        if isinstance(target, torch._ops.OpOverload):
            namespace, name = target.namespace, target._schema.name.split("::")[-1]
            try:
                found = _resolve_op(namespace, name, target._overloadname)
            except (LookupError, AttributeError, RuntimeError):
                found = None
            if found is not target:
                raise PlanSaveError(
                    f"StagePlan.save: {where}, node {node.name!r} calls the op {target}, which a plan file cannot "
                    "name so that it loads again; write the model with torch's own ops there"
                )
            return {"op": [namespace, name, target._overloadname]}
        if isinstance(target, torch._ops.OpOverloadPacket):
            namespace, name = target._qualified_op_name.split("::")
            return {"op": [namespace, name, None]}
        if isinstance(target, torch._ops.HigherOrderOperator):
            return {"higher_order": target.__name__}
        module, function = getattr(target, "__module__", None), getattr(target, "__name__", None)
        try:
            found = _resolve_function(str(module), str(function))
        except (LookupError, AttributeError, ImportError):
            found = _importable(module, function)  # loads only where the caller names it (functions=)
        if found is not target:
            raise PlanSaveError(
                f"StagePlan.save: {where} calls {module}.{function}, which a plan file cannot name (only a "
                "function a module defines at its top level, such as torch's, can be named and found again); "
                "move it to a module, or write the model with torch functions there"
            )
        return {"function": [module, function]}

    def example(self, x: Any) -> Any:
        """One example input: ``{"tensor": [shape, dtype]}``, or the value itself (``None``)."""
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.dtype):
            return {"tensor": [list(x[0]), self.value(x[1], "an example input")]}
        return self.value(x, "an example input")

    def graph(self, graph: fx.Graph, where: str) -> list[Any]:
        if type(graph._codegen) is not fx.graph.CodeGen:
            raise PlanSaveError(
                f"StagePlan.save: {where}'s graph generates its code with {type(graph._codegen).__name__}, "
                "which a plan file cannot hold; partition a model captured by torch.fx or torch.export"
            )
        nodes = []
        for node in graph.nodes:
            at = f"{where}, node {node.name!r}"
            nodes.append(
                [node.op, node.name, self.target(node, at), self.value(node.args, at), self.value(node.kwargs, at)]
            )
        return nodes

    def module(self, m: nn.Module, stage: str, path: str = "") -> dict[str, Any]:
        where = f"{stage}'s module {path!r}" if path else stage
        hooks = [name for name in _HOOK_DICTS if getattr(m, name, None)]
        if hooks:
            raise PlanSaveError(
                f"StagePlan.save: {where} has hooks ({', '.join(hooks)}), which are code a plan file cannot hold; "
                "remove them before saving"
            )
        desc: dict[str, Any] = {
            "training": bool(m.training),
            "parameters": {
                n: None if p is None else [self.tensor(p), bool(p.requires_grad)] for n, p in m._parameters.items()
            },
            "buffers": {
                n: [None if b is None else self.tensor(b), n not in m._non_persistent_buffers_set]
                for n, b in m._buffers.items()
            },
            "modules": {
                n: self.module(c, stage, f"{path}.{n}" if path else n) for n, c in m._modules.items() if c is not None
            },
            "tensors": {
                n: self.tensor(v) for n, v in vars(m).items() if isinstance(v, torch.Tensor) and not n.startswith("__")
            },
        }
        cls = type(m)
        if isinstance(m, fx.GraphModule):
            desc["kind"], desc["class_name"] = "graph", cls.__name__
            desc["graph"] = self.graph(m.graph, where)
        elif cls is nn.Module:
            desc["kind"] = "module"
        else:
            try:
                known = _resolve_layer(cls.__module__, cls.__name__) is cls
            except (LookupError, AttributeError):
                known = False
            if not known:
                raise PlanSaveError(
                    f"StagePlan.save: {where} is a {cls.__module__}.{cls.__qualname__}, whose code a plan file "
                    "cannot hold (it holds graphs and torch.nn layers); partition with a tracer that traces into it "
                    "(unitscale.partition keeps only torch.nn layers as leaves), or pass a traced GraphModule"
                )
            desc["kind"], desc["class"] = "layer", [cls.__module__, cls.__name__]
            desc["attributes"] = {
                n: self.value(v, f"{where}, attribute {n!r},")
                for n, v in vars(m).items()
                if n not in _MODULE_BOOKKEEPING and not isinstance(v, torch.Tensor)
            }
        return desc


def encode_plan(fields: dict[str, Any], stage_modules: list[fx.GraphModule]) -> tuple[str, dict[str, torch.Tensor]]:
    """``(JSON text, tensors)`` for a plan file: ``fields`` (plain values) and each stage module as data."""
    encoder = _Encoder()
    stages = [encoder.module(m, f"stage {i}") for i, m in enumerate(stage_modules)]
    inputs = fields.get("inputs")
    if inputs is not None:
        try:
            fields = {**fields, "inputs": [encoder.example(x) for x in inputs]}
        except PlanSaveError:
            fields = {**fields, "inputs": None}  # an input no plan file can describe: loads skip the dry run
    return json.dumps({**fields, "stages": stages}, allow_nan=False), encoder.tensors


@dataclass
class _Decoder:
    """The inverse of :class:`_Encoder`, checking every field; a bad one raises :class:`PlanFileError`."""

    path: str
    tensors: dict[str, torch.Tensor]
    functions: dict[tuple[str, str], Any]
    _made: dict[str, torch.Tensor] = field(default_factory=dict)

    def bad(self, where: str, what: str) -> PlanFileError:
        return _bad(self.path, f"{where} {what}")

    def field(self, data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(data, dict) or key not in data:
            raise self.bad(where, f"has no {key!r} field")
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.bad(f"{where} field {key!r}", f"is {type(value).__name__} {value!r:.40}, not {kind}")
        return value

    def tensor(self, key: Any, where: str, requires_grad: bool | None = None) -> torch.Tensor:
        """The tensor ``key`` names; a parameter when ``requires_grad`` is given (one object per key)."""
        parameter = requires_grad is not None
        if not isinstance(key, str) or not isinstance(self.tensors.get(key), torch.Tensor):
            raise self.bad(where, f"names tensor {key!r:.40}, which the file does not hold")
        if key not in self._made:
            t = self.tensors[key]
            if parameter and requires_grad and not (t.is_floating_point() or t.is_complex()):
                raise self.bad(where, f"is a {t.dtype} parameter that requires a gradient")
            self._made[key] = nn.Parameter(t, requires_grad=bool(requires_grad)) if parameter else t
        made = self._made[key]
        if parameter and not isinstance(made, nn.Parameter):
            raise self.bad(where, f"uses tensor {key!r} both as a parameter and as a buffer")
        return made

    def value(self, v: Any, where: str, nodes: dict[str, fx.Node] | None = None) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self.value(x, where, nodes) for x in v]
        if not isinstance(v, dict) or len(v) != 1:
            raise self.bad(where, f"holds {v!r:.60}, which is not a value a plan file writes")
        (kind, body) = next(iter(v.items()))
        decoded: Any = None
        try:
            if kind == "node" and nodes is not None and body in nodes:
                decoded = nodes[body]
            elif kind in ("tuple", "size") and isinstance(body, list):
                items = tuple(self.value(x, where, nodes) for x in body)
                decoded = torch.Size(items) if kind == "size" else items
            elif kind == "dict" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
                decoded = {self.value(k, where, nodes): self.value(x, where, nodes) for k, x in body}
            elif kind == "slice" and isinstance(body, list) and len(body) == 3:
                decoded = slice(*(self.value(x, where, nodes) for x in body))
            elif kind == "ellipsis" and body is None:
                decoded = Ellipsis
            elif kind == "float" and body in ("inf", "-inf", "nan"):
                decoded = float(body)
            elif kind in ("dtype", "layout", "memory_format") and _plain_name(body):
                found = getattr(torch, body, None)
                decoded = found if type(found).__name__ == kind else None
            elif kind == "device" and isinstance(body, str):
                decoded = torch.device(body)
        except (TypeError, RuntimeError) as exc:  # an unhashable dict key, a bad device string
            raise self.bad(where, f"holds {v!r:.60} ({exc})") from exc
        if decoded is None:
            raise self.bad(where, f"holds {v!r:.60}, which is not a value a plan file writes")
        return decoded

    def target(self, op: str, target: Any, where: str) -> Any:
        if op == "call_function":
            try:
                if isinstance(target, dict) and list(target) == ["op"] and isinstance(target["op"], list):
                    namespace, name, overload = target["op"]
                    return _resolve_op(str(namespace), str(name), None if overload is None else str(overload))
                if isinstance(target, dict) and list(target) == ["higher_order"]:
                    return _resolve_higher_order(str(target["higher_order"]))
                if isinstance(target, dict) and list(target) == ["function"] and isinstance(target["function"], list):
                    module, name = target["function"]
                    allowed = self.functions.get((str(module), str(name)))
                    return allowed if allowed is not None else _resolve_function(str(module), str(name))
            except (LookupError, AttributeError, ImportError, ValueError, RuntimeError) as exc:
                if isinstance(target, dict) and list(target) == ["function"]:
                    name = ".".join(map(str, target["function"]))
                    raise PlanFileError(
                        f"StagePlan.load({self.path!r}): {where} calls {name}, which is not on the allow-list of "
                        f"functions a plan may call ({exc}); if you trust the plan and that function, pass it: "
                        f"StagePlan.load(path, functions=[{name}]) (pipeline_stage takes the same functions=)"
                    ) from exc
                raise self.bad(where, f"calls {target!r:.80}, which is refused ({exc})") from exc
            raise self.bad(where, f"has call target {target!r:.60}, which is not one a plan file writes")
        if not isinstance(target, str):
            raise self.bad(where, f"has target {target!r:.60}, not a name")
        if op == "call_method" and not _plain_name(target):
            raise self.bad(where, f"calls method {target!r:.60}; a plan's graph calls only public methods")
        return target

    def inputs(self, data: Any, count: int) -> list[Any] | None:
        """Stage 0's example inputs, ``(shape, dtype)`` or a value each; ``None`` when the file has none."""
        if data is None:
            return None
        if not isinstance(data, list) or len(data) != count:
            raise self.bad("the plan's field 'inputs'", f"is {data!r:.60}, not stage 0's {count} inputs")
        inputs: list[Any] = []
        for i, x in enumerate(data):
            if isinstance(x, dict) and list(x) == ["tensor"]:
                body = x["tensor"]
                if not (
                    isinstance(body, list)
                    and len(body) == 2
                    and isinstance(body[0], list)
                    and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in body[0])
                ):
                    raise self.bad(f"the plan's input {i}", f"is {x!r:.60}, not [shape, dtype]")
                dtype = self.value(body[1], f"the plan's input {i}")
                if not isinstance(dtype, torch.dtype):
                    raise self.bad(f"the plan's input {i}", f"has dtype {body[1]!r:.40}")
                inputs.append((tuple(body[0]), dtype))
            else:
                inputs.append(self.value(x, f"the plan's input {i}"))
        return inputs

    def graph(self, data: Any, owner: nn.Module, where: str) -> fx.Graph:
        if not isinstance(data, list):
            raise self.bad(f"{where}'s graph", "is not a list of nodes")
        graph = fx.Graph()
        nodes: dict[str, fx.Node] = {}
        for i, entry in enumerate(data):
            if not (isinstance(entry, list) and len(entry) == 5 and all(isinstance(x, str) for x in entry[:2])):
                raise self.bad(f"{where}'s node {i}", "is not [op, name, target, args, kwargs]")
            op, name, target, args, kwargs = entry
            at = f"{where}, node {name!r}"
            if op not in ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output"):
                raise self.bad(at, f"has op {op!r:.40}")
            if not name.isidentifier() or name in nodes:
                raise self.bad(at, "has a name that is not a new identifier")
            decoded_args = self.value(args, at, nodes)
            decoded_kwargs = self.value(kwargs, at, nodes)
            if not isinstance(decoded_args, tuple) or not isinstance(decoded_kwargs, dict):
                raise self.bad(at, "has arguments that are not a tuple and a dict")
            if not all(isinstance(k, str) for k in decoded_kwargs):
                raise self.bad(at, "has a keyword argument whose name is not a string")
            fn = self.target(op, target, at)
            if fn is builtins.getattr and not (len(decoded_args) == 2 and _plain_name(decoded_args[1])):
                raise self.bad(at, "reads an attribute that is not public")
            if op in ("get_attr", "call_module"):
                self._check_attribute(owner, fn, op, at)
            node = graph.create_node(op, fn, decoded_args, decoded_kwargs, name=name)
            if node.name != name:
                raise self.bad(at, f"clashes with a name fx reserves (it became {node.name!r})")
            nodes[name] = node
        if not nodes or next(reversed(graph.nodes)).op != "output":
            raise self.bad(f"{where}'s graph", "does not end with an output node")
        try:
            graph.lint()
        except Exception as exc:
            raise self.bad(f"{where}'s graph", f"is not a valid graph ({exc})") from exc
        return graph

    def _check_attribute(self, owner: nn.Module, target: str, op: str, where: str) -> None:
        parts = target.split(".")
        if not all(_part(p) for p in parts):
            raise self.bad(where, f"reads {target!r:.60}, not an attribute path")
        obj: Any = owner
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if not isinstance(obj, nn.Module):
                obj = None
                break
            if part in obj._modules:
                obj = obj._modules[part]
            elif last and op == "get_attr" and (part in obj._parameters or part in obj._buffers):
                obj = obj._parameters.get(part, obj._buffers.get(part))
            elif last and op == "get_attr" and isinstance(vars(obj).get(part), torch.Tensor):
                obj = vars(obj)[part]
            else:
                obj = None
                break
        if obj is None or (op == "call_module" and not isinstance(obj, nn.Module)):
            kind = "a submodule" if op == "call_module" else "a parameter, buffer, tensor or submodule"
            raise self.bad(where, f"reads {target!r}, which is not {kind} the file holds")

    def module(self, data: Any, where: str) -> nn.Module:
        kind = self.field(data, "kind", str, where)
        module: nn.Module
        if kind == "layer":
            names = self.field(data, "class", list, where)
            try:
                cls = _resolve_layer(*(str(n) for n in names))
            except (LookupError, AttributeError, TypeError) as exc:
                raise self.bad(f"{where}'s class", f"{names!r:.80} is refused ({exc})") from exc
            module = cls.__new__(cls)
            nn.Module.__init__(module)
            for name, value in self.field(data, "attributes", dict, where).items():
                if not _identifier(name) or name in _MODULE_BOOKKEEPING:
                    raise self.bad(where, f"sets attribute {name!r:.40}")
                object.__setattr__(module, name, self.value(value, f"{where}'s attribute {name!r}"))
        elif kind in ("graph", "module"):
            module = nn.Module()
        else:
            raise self.bad(where, f"is of kind {kind!r:.40}, not layer, graph or module")
        for name, sub in self.field(data, "modules", dict, where).items():
            if not _part(name):
                raise self.bad(where, f"has a submodule named {name!r:.40}")
            module.add_module(name, self.module(sub, f"{where}.{name}"))
        for name, entry in self.field(data, "parameters", dict, where).items():
            if not _part(name) or not (
                entry is None or (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], bool))
            ):
                raise self.bad(f"{where}'s parameter {name!r:.40}", "is not [tensor, requires_grad]")
            param = None if entry is None else self.tensor(entry[0], f"{where}.{name}", entry[1])
            module.register_parameter(name, param)  # type: ignore[arg-type]
        for name, entry in self.field(data, "buffers", dict, where).items():
            if not (_part(name) and isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], bool)):
                raise self.bad(f"{where}'s buffer {name!r:.40}", "is not [tensor, persistent]")
            buffer = None if entry[0] is None else self.tensor(entry[0], f"{where}.{name}")
            module.register_buffer(name, buffer, persistent=entry[1])
        for name, key in self.field(data, "tensors", dict, where).items():
            if not _part(name) or hasattr(module, name):
                raise self.bad(where, f"sets tensor attribute {name!r:.40}")
            object.__setattr__(module, name, self.tensor(key, f"{where}.{name}"))
        if kind == "graph":
            class_name = self.field(data, "class_name", str, where)
            if not class_name.isidentifier():
                raise self.bad(where, f"has class name {class_name!r:.40}")
            graph = self.graph(self.field(data, "graph", list, where), module, where)
            try:
                module = fx.GraphModule(module, graph, class_name)
            except Exception as exc:
                raise self.bad(where, f"does not make a graph module ({type(exc).__name__}: {exc})") from exc
        module.training = self.field(data, "training", bool, where)  # not .train(): children keep their own
        return module


def decode_plan(
    path: str, text: Any, tensors: Any, functions: dict[tuple[str, str], Any] | None = None
) -> tuple[dict[str, Any], list[fx.GraphModule], list[Any] | None]:
    """The plan's fields, stage modules and stage 0's example inputs, rebuilt from :func:`encode_plan`'s output."""
    decoder = _Decoder(path, tensors if isinstance(tensors, dict) else {}, functions or {})
    if not isinstance(text, str):
        raise decoder.bad("its 'plan' field", f"is {type(text).__name__}, not JSON text")
    if not isinstance(tensors, dict):
        raise decoder.bad("its 'tensors' field", f"is {type(tensors).__name__}, not a dict of tensors")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise decoder.bad("its 'plan' field", f"is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise decoder.bad("its 'plan' field", "is not a JSON object")
    stages_data = decoder.field(data, "stages", list, "the plan")
    if not stages_data:
        raise decoder.bad("the plan", "has no stages")
    stages = []
    for i, entry in enumerate(stages_data):
        stage = decoder.module(entry, f"stage {i}")
        if not isinstance(stage, fx.GraphModule):
            raise decoder.bad(f"stage {i}", "is not a graph")
        stages.append(stage)
    return data, stages, decoder.inputs(data.get("inputs"), sum(n.op == "placeholder" for n in stages[0].graph.nodes))
