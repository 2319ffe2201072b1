"""``dynamo_graph``: the one place a TorchDynamo graph is made, for the ``dynamo`` route and the transforms."""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from unitscale.capture._kv_cache import no_kv_cache, refuse_kv_cache
from unitscale.capture._meta import normalise_graph
from unitscale.errors import CaptureError
from unitscale.fx.global_state import GLOBAL_STATE_LOCK

__all__ = ["DynamoGraph", "dynamo_graph", "no_torch_function_modes", "with_call_signature"]


@dataclass
class DynamoGraph:
    """One captured call: the graph, which call leaves feed it, and how to rebuild the output.

    Attributes:
        graph_module: reads parameters and buffers through ``get_attr`` (names as in the
            module), takes the tensor leaves at ``input_positions`` as placeholders; each
            node carries TorchDynamo's ``example_value`` and the normalised meta.
        input_positions: for each placeholder, its index among the call's pytree leaves.
        output_plan: per output leaf, ``("graph", i)`` (the graph's output ``i``),
            ``("input", i)`` (call leaf ``i`` passed through) or ``("const", value)``.
        output_spec: the output's pytree structure.
    """

    graph_module: fx.GraphModule
    input_positions: list[int]
    output_plan: list[tuple[str, Any]]
    output_spec: pytree.TreeSpec

    def rebuild(self, outs: Any, leaves: list[Any]) -> Any:
        """The model's output, from the graph's outputs ``outs`` and the call's leaves."""
        rebuilt = [outs[v] if kind == "graph" else leaves[v] if kind == "input" else v for kind, v in self.output_plan]
        return pytree.tree_unflatten(rebuilt, self.output_spec)


@contextmanager
def no_torch_function_modes() -> Iterator[None]:
    """Set aside the active ``TorchFunctionMode`` objects (an op recorder, say) while TorchDynamo captures.

    TorchDynamo would trace such a mode's Python instead of the model. They are put back on exit.

    >>> import torch
    >>> from torch.overrides import TorchFunctionMode
    >>> from unitscale.capture.toolkit import no_torch_function_modes
    >>> with TorchFunctionMode():
    ...     with no_torch_function_modes():
    ...         inside = torch._C._len_torch_function_stack()
    ...     after = torch._C._len_torch_function_stack()
    >>> inside, after
    (0, 1)
    """
    modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


def _capture_error(module: nn.Module, exc: Exception) -> CaptureError:
    where = ""
    stack = getattr(exc, "real_stack", None)
    if stack:
        # the user's line, not the torch.nn line it called into
        frame = next((f for f in reversed(stack) if "/torch/" not in f.filename.replace("\\", "/")), stack[-1])
        where = f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    failed = re.search(r"got (\w+)\((['\"])(.*?)\2\)", str(exc), re.S)
    if isinstance(exc, torch._dynamo.exc.TorchRuntimeError) and failed:
        # The op itself failed on the example tensors: the model would fail eagerly too.
        inner = failed.group(3).rstrip(".")
        advice = (
            "update the parameter under torch.no_grad() or outside forward"
            if "in-place operation" in inner
            else "check the input shapes and dtypes and the layers' widths (the model fails the same way eagerly)"
        )
        return CaptureError(f"{type(module).__name__}.forward fails{where}: {failed.group(1)}: {inner}; {advice}")
    return CaptureError(
        f"TorchDynamo could not capture {type(module).__name__}.forward in one graph{where}: {reason}. "
        f"Rewrite that line without data-dependent Python control flow or calls TorchDynamo cannot trace "
        f"(print, .item(), .tolist(), numpy)"
    )


def dynamo_graph(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DynamoGraph:
    """Capture ``module(*args, **kwargs)`` with TorchDynamo in one graph, specialised to these inputs.

    The call runs once. Nothing is cached by TorchDynamo, so capturing again never reaches its
    recompile limit.

    Raises:
        CaptureError: a graph break (naming the user's line), an op that fails on these
            inputs, no tensor op at all, or an output that is not tensors and plain values.
        KVCacheError: a key/value cache in the output even with the configs' caches off
            (:func:`~unitscale.capture.no_kv_cache`, applied here).

    >>> import torch
    >>> from unitscale.capture.toolkit import dynamo_graph
    >>> captured = dynamo_graph(torch.nn.Linear(3, 3), (torch.randn(2, 3),), {})
    >>> [n.op for n in captured.graph_module.graph.nodes]
    ['placeholder', 'get_attr', 'get_attr', 'call_function', 'output']
    """
    leaves = pytree.tree_leaves((args, kwargs))
    record: dict[str, Any] = {}

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        record["gm"], record["inputs"] = gm, list(example_inputs)

        def run(*inputs: Any) -> Any:
            record["outputs"] = gm(*inputs)
            return record["outputs"]

        return run

    def call(*a: Any, **k: Any) -> Any:
        return module(*a, **k)

    # every capture compiles the same code object (call's), reset below: one at a time
    with GLOBAL_STATE_LOCK:
        try:
            # allow_rnn: TorchDynamo refuses nn.LSTM, nn.GRU and nn.RNN by default; with it, each is one
            # torch.lstm / torch.gru / torch.rnn_tanh node, as torch.export captures them.
            with (
                no_torch_function_modes(),
                no_kv_cache(module),
                torch._dynamo.config.patch(allow_rnn=True),
                warnings.catch_warnings(),
            ):
                # TorchDynamo makes an instance of a custom autograd.Function to trace it, and torch warns
                # about its own doing (an error under -W error, which would lose the Function's route)
                warnings.filterwarnings("ignore", ".*should not be instantiated", DeprecationWarning)
                result = torch.compile(call, backend=backend, fullgraph=True, dynamic=False)(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            raise _capture_error(module, exc) from None
        finally:
            torch._dynamo.reset_code(call.__code__)
    if "gm" not in record:
        raise CaptureError(
            f"TorchDynamo found no tensor ops in {type(module).__name__}.forward, so there is no graph to "
            f"transform; apply the transform to a module that computes something"
        )
    _check_outputs(module, result)
    gm = _to_standalone(module, record["gm"], record["inputs"], leaves)
    _root_is_self(gm)
    normalise_graph(gm, module)
    out_leaves, out_spec = pytree.tree_flatten(result)
    graph_outputs = {id(t): i for i, t in enumerate(record.get("outputs", ()))}
    input_ids = {id(leaf): i for i, leaf in enumerate(leaves)}
    plan: list[tuple[str, Any]] = []
    for leaf in out_leaves:
        if id(leaf) in graph_outputs:
            plan.append(("graph", graph_outputs[id(leaf)]))
        elif id(leaf) in input_ids:
            plan.append(("input", input_ids[id(leaf)]))
        elif isinstance(leaf, torch.Tensor):
            raise CaptureError(
                f"{type(module).__name__}.forward returns a tensor that is neither computed by its graph nor an "
                f"input (a parameter or a global?); return a computed tensor instead"
            )
        else:
            plan.append(("const", leaf))
    return DynamoGraph(gm, gm.meta.pop("input_positions"), plan, out_spec)


def with_call_signature(
    found: DynamoGraph, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> fx.GraphModule:
    """``found``'s graph as a module called like ``module``: one placeholder per leaf of ``(args, kwargs)``."""
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    source = found.graph_module
    graph = fx.Graph()
    try:
        names = torch._dynamo.eval_frame.argument_names(inspect.signature(module.forward), args, kwargs)
    except Exception:  # a forward without a signature to read: positional names
        names = [f"arg{i}" for i in range(len(leaves))]
    inputs = [graph.placeholder(re.sub(r"\W", "_", str(name))) for name in names]
    env: dict[fx.Node, fx.Node] = {}
    for placeholder, position in zip(
        [n for n in source.graph.nodes if n.op == "placeholder"], found.input_positions, strict=True
    ):
        env[placeholder] = inputs[position]
        inputs[position].meta = dict(placeholder.meta)
    outs: Any = graph.graph_copy(source.graph, env)
    rebuilt = [outs[v] if kind == "graph" else inputs[v] if kind == "input" else v for kind, v in found.output_plan]
    graph.output(rebuilt)
    graph._codegen = fx.graph._PyTreeCodeGen(fx.graph._PyTreeInfo(list(names), in_spec, found.output_spec))
    gm = fx.GraphModule(source, graph, class_name=source.__class__.__name__)
    gm.recompile()
    return gm


_CLOSURE_ROOT = re.compile(r"^L\[['\"]module['\"]\]")


def _root_is_self(gm: fx.GraphModule) -> None:
    """Spell the root ``L['self']``, as other Dynamo captures do, not ``L['module']`` (the closure's variable)."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                key: (_CLOSURE_ROOT.sub("L['self']", str(path)), kind) for key, (path, kind) in stack.items()
            }


# Output leaves a captured graph may hand back as they were at capture: they hold no tensors.
_PLAIN_OUTPUTS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.Size)


def _check_outputs(module: nn.Module, result: Any) -> None:
    """Refuse an output object the graph cannot recompute (a KV cache, say): it would be the capture's, stale."""
    refuse_kv_cache(module, result)  # a cache the config does not control (use_cache=True passed in)
    for path, leaf in pytree.tree_flatten_with_path(result)[0]:
        if isinstance(leaf, (torch.Tensor, *_PLAIN_OUTPUTS)):
            continue
        where = pytree.keystr(path) or "its output"
        raise CaptureError(
            f"{type(module).__name__}.forward returns a {type(leaf).__name__} at {where}: an object that is "
            f"not a tensor or a plain value, so a transformed graph cannot rebuild it on each call (every call "
            f"would return the one made while capturing); return tensors only"
        )


def _to_standalone(
    module: nn.Module, gm: fx.GraphModule, example_inputs: list[Any], leaves: list[Any]
) -> fx.GraphModule:
    """Turn TorchDynamo's graph (parameters lifted to inputs) into one that reads them as attributes."""
    names: dict[int, str] = {}
    for name, tensor in [*module.named_buffers(), *module.named_parameters()]:
        names.setdefault(id(tensor), name)
    leaf_position = {id(leaf): i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)}
    graph = gm.graph
    graph.owning_module = None  # rebuilt below, on a root that holds the attributes
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    positions: list[int] = []
    attrs: dict[str, torch.Tensor] = {}
    for node, value in zip(placeholders, example_inputs, strict=True):
        if id(value) in leaf_position:
            positions.append(leaf_position[id(value)])
            continue
        # A tensor that is neither an input nor module state (a global) becomes a constant.
        target = names.get(id(value), f"_captured_constant_{len(attrs)}")
        attrs[target] = value
        with graph.inserting_before(first_op):
            attr = graph.get_attr(target)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    for node in graph.nodes:
        node.meta.pop("grapharg", None)
    # The bodies of higher-order ops (cond, while_loop, map) are sub-graphs of TorchDynamo's graph.
    bodies = {
        str(n.target)
        for n in graph.nodes
        if n.op == "get_attr" and isinstance(getattr(gm, str(n.target), None), nn.Module)
    }
    attrs.update({name: getattr(gm, name) for name in bodies if name not in attrs})
    out = fx.GraphModule(attrs, graph, class_name=f"{type(module).__name__}Graph")
    out.meta["input_positions"] = positions
    return out
