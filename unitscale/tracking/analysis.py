"""Scale tracking through a model: the std of every tensor in forward and backward.

The model is traced with a :class:`~unitscale.DeepTracer` that also records
module paths, run with every floating-point node output recorded, and backpropagated
once. A cached trace runs as its own compiled code with a recording call after each
node (``unitscale.tracking.compiled``); a ``GraphModule`` passed in, or an exported graph,
is run by a :class:`ScaleTrackingInterpreter`, node by node, with the same records. On an accelerator the stds stay on
the device until one read at the end. When ``torch.fx`` cannot trace the model
(``transformers`` models, data-dependent control flow) the ops are recorded as they run
instead (``unitscale.tracking.eager``), each with its module path: that costs about as
much as the fx route, while a ``torch.export`` capture costs several tracked passes.
``capture="export"`` asks for one anyway (:mod:`unitscale.capture`, cached per module and
input signature): its flat graph is run the same way, each line of the listing naming
its module.
"""

from __future__ import annotations

import functools
import html
import inspect
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from unitscale.errors import CaptureError, InputError, NotAModuleError
from unitscale.fx.module_state import module_state_kept
from unitscale.fx.nodes import MODULE_PATH_KEY, is_view_node, op_name
from unitscale.fx.plain_run import run_plainly
from unitscale.fx.trace_cache import (
    DeepPathTracer,
    Trace,
    _fingerprint,
    _graph_code_and_globals,
    trace_for_scales,
    trace_or_reason,
)
from unitscale.fx.trace_errors import user_frame
from unitscale.fx.tracers import _check_autowrap
from unitscale.tracking.backward import float_outputs, run_backward
from unitscale.tracking.compiled import compiled_tracking
from unitscale.tracking.eager import ScaleRecording, has_trainable_parameters, input_leaf, record_ops
from unitscale.tracking.report import ScaleReport, ScaleRow
from unitscale.tracking.stats import ScalePair, ScaleRecord, read_records, scratch_space

__all__ = [
    "AnnotatedCode",
    "DeepPathTracer",
    "ScaleTrackingInterpreter",
    "analyse_module",
    "record_scales",
    "track_scales",
]


class ScaleTrackingInterpreter(fx.Interpreter):
    """Runs a graph and records the scale of every floating-point node output.

    Overrides :meth:`torch.fx.Interpreter.run_node`: after each node runs, the std (and
    optionally abs-max) of its output is recorded on the device, and a gradient hook
    records the std of its gradient when a backward pass reaches it. Floating-point
    inputs are replaced by detached copies that require grad, so their gradients are
    seen without touching the caller's tensors. Nothing is written to the graph.

    Hook map, as in :class:`torch.fx.Interpreter` (``*`` overridden here). To record
    something else per node, override ``run_node`` and call ``super().run_node(n)``; to
    change what one kind of node does, override its method (``call_function``, ...).

    .. code-block:: text

        run(*inputs)
        +-- run_node(n) *           records the output's scale; a view hands its
            |                       record on to its only user (one record per chain),
            |                       else takes its input's forward numbers
            +-- placeholder()       (floating-point inputs become leaves that require grad)
            +-- get_attr()
            +-- call_function()
            +-- call_method()
            +-- call_module()
            +-- output()

    Args:
        module: the module the graph belongs to (a ``GraphModule``, or the traced module).
        graph: the graph to run (default: ``module.graph``).
        abs_max: also record each tensor's largest magnitude.

    After ``run()``, ``captured`` holds the rows, records, leaves and hooks; call
    ``captured.remove_hooks()`` after the backward pass.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale import ScaleTrackingInterpreter
    >>> from unitscale.examples.models import MLP
    >>> _ = torch.manual_seed(0)
    >>> gm = fx.symbolic_trace(MLP(4))
    >>> interp = ScaleTrackingInterpreter(gm)
    >>> out = interp.run(torch.randn(8, 4))
    >>> [row.node for row, _ in interp.captured.entries]
    ['x', 'fc1', 'act', 'fc2']
    >>> interp.captured.remove_hooks()
    """

    def __init__(self, module: nn.Module, graph: fx.Graph | None = None, abs_max: bool = False) -> None:
        super().__init__(module, graph=graph)
        self.abs_max = abs_max
        self.captured = ScaleRecording(differentiate_inputs=not has_trainable_parameters(module))
        self.current_node: fx.Node | None = None
        self._shared: dict[fx.Node, ScaleRecord] = {}

    def run_node(self, n: fx.Node) -> Any:
        self.current_node = n
        # without fx's per-node context manager: on a small model it costs as much as the tracking itself
        out = run_plainly(self, n)
        load = self.env.__getitem__
        if n.op == "output" or not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        if n.op == "placeholder":
            leaf, out = input_leaf(out, self.captured.differentiate_inputs)
            if leaf is not None:
                self.captured.leaves.append(leaf)
        elif n.op == "get_attr" and out.requires_grad and out.is_leaf:
            self.captured.leaves.append(out)
        # A reshape or transpose holds the same numbers as its input, and when it is the
        # input's only user, so does its gradient: one record serves the whole chain.
        users = list(n.users)
        hand_on = len(users) == 1 and is_view_node(users[0]) and users[0].args[:1] == (n,)
        shared = self._shared.pop(n, None)
        path, op = n.meta.get(MODULE_PATH_KEY, ""), self._op(n, out)
        if shared is None and is_view_node(n) and isinstance(n.args[0], fx.Node):
            # the input has other users too: same forward numbers, its own gradient
            record = self.captured.track_same_values(out, load(n.args[0]), n.name, path, op, self.abs_max, not hand_on)
        else:
            record = self.captured.track(out, n.name, path, op, self.abs_max, record=shared, hook=not hand_on)
        if hand_on:
            self._shared[users[0]] = record
        return out

    def _op(self, n: fx.Node, value: torch.Tensor) -> str:
        if n.op == "placeholder":
            return "input"
        if n.op == "get_attr":
            return "parameter" if isinstance(value, nn.Parameter) else "buffer"
        if n.op == "call_method":
            return f"Tensor.{n.target}"
        if n.op == "call_module":
            return type(self.fetch_attr(str(n.target))).__name__
        if isinstance(n.target, torch._ops.OpOverload):  # an exported graph's aten.linear.default
            return n.target._opname
        return op_name(n.target)


def _check_module(module: Any, fn: str) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"{fn} expects a torch.nn.Module, got {type(module).__name__}; wrap a function in an nn.Module first"
        )
    return module


def _check_inputs(module: nn.Module, inputs: Any) -> tuple[Any, ...]:
    name = type(module).__name__
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, tuple):
        raise InputError(
            f"inputs must be a torch.Tensor or a tuple/list of the positional inputs of {name}, "
            f"got {type(inputs).__name__}; convert arrays with torch.as_tensor"
        )
    for i, value in enumerate(inputs):
        if type(value).__module__ == "numpy":
            raise InputError(f"inputs[{i}] is a numpy {type(value).__name__}; convert it with torch.as_tensor")
    try:
        inspect.signature(module.forward).bind(*inputs)
    except TypeError as e:
        raise InputError(f"{name}.forward cannot take the {len(inputs)} input(s) given: {e}") from None
    except ValueError:
        pass
    return inputs


def _shapes(inputs: tuple[Any, ...]) -> str:
    return ", ".join(str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__ for v in inputs)


def _capture_fx(module: nn.Module, graph: fx.Graph, inputs: tuple[Any, ...], abs_max: bool) -> ScaleRecording:
    interp = ScaleTrackingInterpreter(module, graph=graph, abs_max=abs_max)
    try:
        interp.captured.output = interp.run(*inputs)
    except Exception as e:
        interp.captured.remove_hooks()
        n = interp.current_node
        where = f" at node '{n.name}' ({n.op} {op_name(n.target)})" if n is not None else ""
        reason = str(e).split("\n\nWhile executing")[0].rstrip(".")  # fx appends the node's repr
        raise InputError(
            f"{type(module).__name__} failed{where} on inputs of shape {_shapes(inputs)}: {reason}. {_advice(reason)}"
        ) from e
    seen = {id(leaf) for leaf in interp.captured.leaves}  # parameters the graph read are there already
    interp.captured.leaves.extend(p for p in module.parameters() if p.requires_grad and id(p) not in seen)
    return interp.captured


def _capture_compiled(module: nn.Module, trace: Trace, inputs: tuple[Any, ...], abs_max: bool) -> ScaleRecording:
    """As :func:`_capture_fx`, running the cached trace's compiled code instead of an interpreter."""
    program = compiled_tracking(module, trace)
    if program is None:
        return _capture_fx(module, trace.graph, inputs + trace.extra_inputs, abs_max)
    try:
        captured = program.run(module, inputs + trace.extra_inputs, abs_max)
    except Exception as e:
        n = program.failed_node
        where = f" at node '{n.name}' ({n.op} {op_name(n.target)})" if n is not None else ""
        raise InputError(
            f"{type(module).__name__} failed{where} on inputs of shape {_shapes(inputs)}: {e}. {_advice(str(e))}"
        ) from e
    seen = {id(leaf) for leaf in captured.leaves}  # parameters the graph read are there already
    captured.leaves.extend(p for p in module.parameters() if p.requires_grad and id(p) not in seen)
    return captured


def _capture_eager(module: nn.Module, inputs: tuple[Any, ...], abs_max: bool) -> ScaleRecording:
    try:
        return record_ops(module, inputs, abs_max)
    except Exception as e:
        raise InputError(
            f"{type(module).__name__} failed at {user_frame(e)} on inputs of shape {_shapes(inputs)}: {e}. "
            f"{_advice(str(e))}"
        ) from e


def _advice(reason: str) -> str:
    if "in-place operation" in reason:
        return "The model updates a tensor that requires grad in place: do it under torch.no_grad() or outside forward."
    return "Check that the inputs have the shapes and dtypes the model expects."


def _finish(captured: ScaleRecording, backward: Any, model: str) -> list[ScaleRow]:
    try:
        run_backward(float_outputs(captured.output, model), backward, captured.leaves)
    finally:
        captured.remove_hooks()
    values = read_records([record for _, record in captured.entries])
    entries = zip(captured.entries, values, strict=True)
    return [row._replace(forward=f, backward=b, abs_max=m) for (row, _), (f, b, m) in entries]


_ASSIGN = re.compile(r"^\s*(\w+) = ")
_CLEANUP = re.compile(r";  (?:\w+ = )+None$")


@functools.lru_cache(maxsize=16)
def _code_lines(code: str) -> tuple[tuple[str, str | None], ...]:
    """The code's non-blank lines without fx's ``x = None`` clean-ups, each with the name it assigns."""
    lines = []
    for line in code.strip("\n").splitlines():
        line = _CLEANUP.sub("", line.rstrip())
        if line.strip():
            match = _ASSIGN.match(line)
            lines.append((line, match.group(1) if match else None))
    return tuple(lines)


def _marked(row: ScaleRow) -> str:
    """A row's scales, with a marker when a NaN or infinity reached it."""
    return f"{row.scale} NON-FINITE" if not row.finite else str(row.scale)


def _annotate(trace: Trace, rows: list[ScaleRow]) -> str:
    by_name = {r.node: r for r in rows}
    inputs = [n.name for n in trace.graph.nodes if n.op == "placeholder" and n.name in by_name]
    lines = []
    for line, name in _code_lines(trace.code):
        if line.startswith("def forward") and inputs:
            line += "  # " + ", ".join(f"{x} {_marked(by_name[x])}" for x in inputs)
        elif name in by_name:
            line += f"  # {_marked(by_name[name])}"
        lines.append(line)
    return "\n".join(lines)


def _annotate_capture(trace: Trace, rows: list[ScaleRow], model: str, failure: str) -> str:
    """The exported graph's code, each assignment annotated with its scale and module path."""
    paths = {n.name: n.meta.get(MODULE_PATH_KEY, "") for n in trace.graph.nodes}
    by_name = {r.node: r for r in rows}
    why = f"; torch.fx could not trace it at {failure}" if failure else ""
    lines = [f"# {model}: captured by torch.export{why}"]
    for line, name in _code_lines(trace.code):
        if name in by_name:
            line += f"  # {_marked(by_name[name])}" + (f"  {paths[name]}" if paths.get(name) else "")
        lines.append(line)
    return "\n".join(lines)


# module -> (key, exported graph): an export costs about a second on a small transformer,
# as much as many tracked passes, so a training loop that asks for it pays it once.
_exported: weakref.WeakKeyDictionary[nn.Module, tuple[Any, fx.GraphModule]] = weakref.WeakKeyDictionary()


def _export_key(module: nn.Module, inputs: tuple[Any, ...]) -> Any:
    """What an exported graph depends on: the module's structure, its tensors, the inputs' signature.

    Parameters are compared by identity (the graph holds them; one replaced by a new
    object would be stale), inputs by shape, dtype and device, plain values by value;
    ``None`` (do not cache) when an input is anything else.
    """
    signature: list[tuple[Any, ...]] = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            signature.append((tuple(value.shape), value.dtype, value.device, value.requires_grad))
        elif isinstance(value, (bool, int, float, str, type(None))):
            signature.append((type(value), value))
        else:
            return None
    tensors = tuple(id(t) for t in (*module.parameters(), *module.buffers()))
    return (_fingerprint(module), tensors, tuple(signature))


def _exported_graph(module: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
    """``module``'s graph from :func:`unitscale.capture.capture` (export route), cached per input signature.

    Raises what :func:`unitscale.capture.capture` raises when the export fails
    (:class:`~unitscale.errors.NoRouteError` with the reason).
    """
    import unitscale.capture  # imports the fx layer this package sits beside: imported when first needed

    key = _export_key(module, inputs)
    cached = _exported.get(module)
    if key is not None and cached is not None and cached[0] == key:
        return cached[1]
    gm = unitscale.capture.capture(module, inputs, route="export").graph_module
    if gm is None:  # the export route always gives a graph; a guard for the type checker
        raise CaptureError(f"torch.export gave no graph for {type(module).__name__}")
    if key is not None:
        _exported[module] = (key, gm)
    return gm


# exported graph -> its code: written once per cached export (thousands of aten nodes), not per call
_exported_code: weakref.WeakKeyDictionary[fx.GraphModule, Trace] = weakref.WeakKeyDictionary()


def _exported_trace(gm: fx.GraphModule) -> Trace:
    """The exported graph with its code and the code's globals, made once per exported graph."""
    trace = _exported_code.get(gm)
    if trace is None:
        src, namespace = _graph_code_and_globals(gm.graph)
        trace = _exported_code[gm] = Trace(gm.graph, (), src, namespace)
    return trace


def _listing(rows: list[ScaleRow], model: str, failure: str) -> str:
    width = max([len(r.node) for r in rows] + [4])
    why = f"; torch.fx could not trace it at {failure}" if failure else ""
    lines = [f"# {model}: ops recorded as they ran{why}"]
    for r in rows:
        where = f" in {r.module_path}" if r.module_path else ""
        lines.append(f"{r.node.ljust(width)}  # {_marked(r)}  {r.op}{where}")
    return "\n".join(lines)


def track_scales(
    module: nn.Module,
    inputs: Any,
    backward: Any = None,
    *,
    recurse_modules: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
    capture: str = "auto",
    abs_max: bool = True,
) -> ScaleReport:
    """Run one forward and backward pass and report the scale of every float tensor.

    Args:
        module: the model (a ``GraphModule`` is run as it is, without re-tracing).
        inputs: a tensor, or a tuple/list of the model's positional inputs. As in a
            training step, an input's gradient is computed (and its row gets a backward
            std) only if it requires grad: pass ``x.requires_grad_()`` to see it. A model
            with no trainable parameter has its float inputs differentiated anyway.
        backward: the gradient of the output: a tensor, a tuple/list/dict shaped like
            the output, or ``None`` (1 for a one-element output such as a loss,
            unit-normal noise otherwise).
        recurse_modules: trace into submodules (``False``: one row per top-level call).
        autowrap_modules: modules whose functions stay single nodes (``None``: ``math``, ``einops``,
            ``unitscale.functional`` and those given to
            :func:`~unitscale.fx.register_autowrap_module`).
        autowrap_functions: functions that stay single nodes.
        capture: ``"fx"`` (symbolic trace; fail with :class:`~unitscale.errors.TraceError`
            if it cannot), ``"eager"`` (record ops as they run, each with its module path),
            ``"export"`` (``torch.export`` through :func:`unitscale.capture.capture`: a graph
            of aten ops, cached per module and input signature; the first call costs about
            a second on a small transformer) or ``"auto"`` (fx, else eager: the
            ops and module paths of an export for a fraction of its cost).
        abs_max: also record each tensor's largest magnitude.

    Returns:
        A :class:`ScaleReport`, one row per floating-point tensor in execution order.
        Integer and boolean tensors are skipped; the model's ``.grad`` fields are untouched.

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        InputError: wrong kind, number or shape of inputs, or an unknown ``capture``.
        BackwardShapeError: ``backward`` does not match the output.
        NoFloatOutputError: the model returns no floating-point tensor.
        TraceError: ``capture="fx"`` and torch.fx cannot trace the model.
        NoRouteError: ``capture="export"`` and ``torch.export`` cannot capture the model.

    >>> import torch
    >>> from unitscale import track_scales
    >>> from unitscale.examples.models import MLP
    >>> _ = torch.manual_seed(0)
    >>> report = track_scales(MLP(16), torch.randn(64, 16))
    >>> [(row.node, row.module_path, row.op) for row in report if row.op != "parameter"]
    [('x', '', 'input'), ('linear', 'fc1', 'linear'), ('relu', 'act', 'relu'), ('linear_1', 'fc2', 'linear')]
    >>> report["x"].scale  # the input does not require grad: no gradient is computed for it
    (-> 0.98, <- n/a)
    >>> track_scales(MLP(16), torch.randn(64, 16).requires_grad_())["x"].scale
    (-> 1.01, <- 0.228)
    """
    module = _check_module(module, "track_scales")
    if not isinstance(capture, str) or capture not in _CAPTURES:
        raise InputError(f"capture must be 'auto', 'fx', 'export' or 'eager', got {capture!r}")
    for name, flag in (("recurse_modules", recurse_modules), ("abs_max", abs_max)):
        if not isinstance(flag, bool):
            raise InputError(f"track_scales({name}=...) got {type(flag).__name__} {flag!r:.60}; pass True or False")
    # checked here: a tracer refusing them would otherwise send "auto" to eager capture
    _check_autowrap(autowrap_modules, autowrap_functions)
    inputs = _check_inputs(module, inputs)
    model = type(module).__name__
    failure = ""
    trace = None
    exported: fx.GraphModule | None = None
    if capture == "fx":
        trace = trace_for_scales(module, recurse_modules, autowrap_modules, tuple(autowrap_functions))
    elif capture == "auto":
        # No export here: its first call costs several tracked passes, and the eager record
        # has the same ops and module paths (the benchmarks page measures both).
        result = trace_or_reason(module, recurse_modules, autowrap_modules, tuple(autowrap_functions))
        trace, failure = (result, "") if isinstance(result, Trace) else (None, result)
    elif capture == "export":
        exported = _exported_graph(module, inputs)
    # A caller's no_grad() would leave nothing to backpropagate; a forward that updates its
    # buffers or assigns to its module is undone (the caller's model is only observed).
    with torch.enable_grad(), scratch_space(), module_state_kept(module, values=True):
        if trace is not None and not isinstance(module, fx.GraphModule):
            # a cached trace's graph: compiled once, run as Python code (no interpreter)
            captured = _capture_compiled(module, trace, inputs, abs_max)
        elif trace is not None:
            captured = _capture_fx(module, trace.graph, inputs + trace.extra_inputs, abs_max)
        elif exported is not None:
            captured = _capture_compiled(exported, _exported_trace(exported), inputs, abs_max)
        else:
            captured = _capture_eager(module, inputs, abs_max)
        rows = _finish(captured, backward, model)
    if trace is not None:
        return ScaleReport(rows, model, _annotate(trace, rows), "fx")
    if exported is not None:
        code = _annotate_capture(_exported_trace(exported), rows, model, failure)
        return ScaleReport(rows, model, code, "export", failure)
    return ScaleReport(rows, model, _listing(rows, model, failure), "eager", failure)


_CAPTURES = ("auto", "fx", "export", "eager")


def record_scales(module: nn.Module, inputs: Any, backward: Any = None) -> dict[str, ScalePair]:
    """``node name -> ScalePair`` for one forward and backward pass of ``module``.

    A ``GraphModule`` is run as it is (useful after your own tracing or rewriting);
    any other module is traced as in :func:`track_scales`.

    Args:
        module: the model or a ``GraphModule``.
        inputs: a tensor or a tuple/list of positional inputs.
        backward: the output's gradient (see :func:`track_scales`).

    Returns:
        The scales, in execution order.

    Raises:
        TraceError: torch.fx cannot trace the module (use :func:`track_scales`, which
            falls back to recording ops as they run).
        NotAModuleError, InputError, BackwardShapeError, NoFloatOutputError: as
            :func:`track_scales`.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale import record_scales
    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Identity()))
    >>> record_scales(gm, torch.tensor([1.0, 3.0]), backward=torch.tensor([1.0, -1.0]))
    {'input_1': (-> 1.41, <- 1.41), '_0': (-> 1.41, <- 1.41)}
    """
    return track_scales(module, inputs, backward, capture="fx", abs_max=False).scales


class AnnotatedCode(str):
    """Code annotated with scales: a ``str`` that highlights itself for its reader.

    ``print()`` shows ANSI-highlighted code in a terminal (plain text elsewhere), a
    notebook shows HTML-highlighted code, and ``repr`` (doctests, the REPL) shows the
    plain text. Set ``highlight=False`` for plain text everywhere.

    Args:
        text: the code.
        highlight: highlight with pygments where the reader supports it.

    >>> from unitscale.tracking import AnnotatedCode
    >>> code = AnnotatedCode("y = f(x)  # (-> 1.0, <- 0.5)")
    >>> code
    y = f(x)  # (-> 1.0, <- 0.5)
    >>> "<span" in code._repr_html_()
    True
    """

    highlight: bool

    def __new__(cls, text: str, highlight: bool = True) -> AnnotatedCode:
        obj = super().__new__(cls, text)
        obj.highlight = highlight
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (AnnotatedCode, (str(self.plain), self.highlight))

    @property
    def plain(self) -> str:
        """The text without highlighting."""
        return str.__str__(self)

    def __str__(self) -> str:
        if self.highlight and sys.stdout.isatty():
            from pygments import highlight
            from pygments.formatters import TerminalFormatter
            from pygments.lexers import PythonLexer

            return highlight(self.plain, PythonLexer(), TerminalFormatter()).rstrip("\n")
        return self.plain

    def __repr__(self) -> str:
        return self.plain

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str | None:
        if not self.highlight:
            return f"<pre>{html.escape(self.plain)}</pre>"
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        return highlight(self.plain, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))


def analyse_module(
    module: nn.Module,
    inputs: Any,
    backward: Any = None,
    recurse_modules: bool = True,
    syntax_highlight: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
    *,
    capture: str = "auto",
) -> AnnotatedCode:
    """The module's traced code, each line annotated with ``(-> forward std, <- backward std)``.

    Runs one forward pass (``inputs``) and one backward pass (``backward``, see
    :func:`track_scales`). A model ``torch.fx`` cannot trace gets a listing of its ops
    as they ran instead, each with its module path; ``capture="export"`` gives the
    ``torch.export`` graph's code instead (aten ops, each line with its module path).

    Args:
        module: the model.
        inputs: a tensor or a tuple/list of positional inputs (an input's backward std
            is shown where it requires grad, as in :func:`track_scales`).
        backward: the output's gradient, or ``None``.
        recurse_modules: trace into submodules (``False``: submodules are single lines).
        syntax_highlight: highlight with pygments (terminal and notebook).
        autowrap_modules: modules whose functions stay single nodes (``None``: ``math``, ``einops``,
            ``unitscale.functional`` and those given to
            :func:`~unitscale.fx.register_autowrap_module`).
        autowrap_functions: functions that stay single nodes.
        capture: ``"auto"``, ``"fx"``, ``"export"`` or ``"eager"``, as in :func:`track_scales`.

    Returns:
        The annotated code (:class:`AnnotatedCode`, a ``str``).

    Raises:
        NotAModuleError, InputError, BackwardShapeError, NoFloatOutputError, TraceError,
        NoRouteError: as :func:`track_scales`.

    >>> import torch
    >>> from unitscale import analyse_module
    >>> from unitscale.examples.models import MLP
    >>> _ = torch.manual_seed(0)
    >>> model = MLP(256)
    >>> x = torch.randn(512, 256).requires_grad_()  # to see the input's gradient too
    >>> analyse_module(model, x, torch.randn(512, 256))
    def forward(self, x):  # x (-> 0.999, <- 0.235)
        fc1_weight = self.fc1.weight  # (-> 0.0361, <- 4.61)
        fc1_bias = self.fc1.bias  # (-> 0.0363, <- 4.38)
        linear = torch._C._nn.linear(x, fc1_weight, fc1_bias)  # (-> 0.578, <- 0.204)
        relu = torch.nn.functional.relu(linear, inplace = False)  # (-> 0.337, <- 0.288)
        fc2_weight = self.fc2.weight  # (-> 0.018, <- 9.01)
        fc2_bias = self.fc2.bias  # (-> 0.0183, <- 21.2)
        linear_1 = torch._C._nn.linear(relu, fc2_weight, fc2_bias)  # (-> 0.236, <- 0.998)
        return linear_1
    """
    if not isinstance(syntax_highlight, bool):
        raise InputError(
            f"analyse_module(syntax_highlight=...) got {type(syntax_highlight).__name__} {syntax_highlight!r:.60}; "
            "pass True or False"
        )
    report = track_scales(
        module,
        inputs,
        backward,
        recurse_modules=recurse_modules,
        autowrap_modules=autowrap_modules,
        autowrap_functions=autowrap_functions,
        capture=capture,
        abs_max=False,
    )
    return AnnotatedCode(report.code, highlight=syntax_highlight)
