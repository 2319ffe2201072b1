"""Scale tracking after the capture: one pass recorded by the capture's route, a graph run as compiled Python.

Compiled code skips :class:`torch.fx.Interpreter`'s per-node dispatch (several percent of a small
model's pass) and gives :class:`ScaleTrackingInterpreter`'s rows.
"""

from __future__ import annotations

import operator
import re
import threading
from collections.abc import Collection, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from unitscale.capture import Capture
from unitscale.errors import BackwardError, InputError, NotAModuleError, OutOfMemoryError, UnitscaleError
from unitscale.fx.nodes import MODULE_PATH_KEY, changes_in_place, first_argument_alias, is_view_node, op_name
from unitscale.fx.plain_run import run_plainly
from unitscale.fx.trace_errors import user_frame
from unitscale.tracking.backward import float_outputs, run_backward
from unitscale.tracking.eager import _ITSELF_METHODS, _SAME_VALUE_METHODS, record_ops
from unitscale.tracking.recording import ScaleRecording, Step
from unitscale.tracking.report import _CLEANUP, ScaleReport, annotated_code, read_rows

__all__ = [
    "CompiledTracking",
    "ScaleTrackingInterpreter",
    "changed_in_place",
    "compiled_tracking",
    "graph_steps",
    "holds_its_input_values",
    "track_pass",
    "view_taking_over",
]


class _Run(threading.local):
    """The tracking run in progress on this thread (the compiled code's recording call reads it)."""

    program: CompiledTracking | None = None
    captured: ScaleRecording
    last: int = -1


_run = _Run()


def _track(value: Any, i: int, *source: Any) -> Any:
    """Record node ``i``'s output (``source``: the value a view was taken of); return what the code goes on with."""
    run = _run
    run.last = i
    return run.captured.record(value, run.program.steps[i], *source)  # type: ignore[union-attr]


class CompiledTracking:
    """A captured graph compiled into a function that records what :class:`ScaleTrackingInterpreter` records.

    Made by :func:`compiled_tracking` (cached per graph).

    Args:
        module: the module the graph was traced from (the code's ``self``).
        code, namespace: the graph's code as fx writes it and the globals it runs in.

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.examples import MLP
    >>> from unitscale.tracking.compiled import CompiledTracking
    >>> from unitscale.tracking.recording import ScaleRecording
    >>> model = MLP(4)
    >>> cap = capture(model, torch.randn(2, 4), deep=DeepTracing(), check=False)
    >>> program = CompiledTracking(model, cap.graph_module.graph, *cap.python_code())
    >>> captured = ScaleRecording()
    >>> _ = program.run(model, (torch.randn(8, 4),), captured)
    >>> print(*(row.node for row, _ in captured.entries))
    x fc1_weight fc1_bias linear relu fc2_weight fc2_bias linear_1
    >>> captured.cleanup.close()
    """

    def __init__(self, module: nn.Module, graph: fx.Graph, code: str, namespace: dict[str, Any]) -> None:
        nodes = [n for n in graph.nodes if n.op != "output"]
        steps = graph_steps(module, nodes)
        src = _instrumented(code, nodes, steps)
        if src is None:
            raise _NotCompiled(f"the code of {type(module).__name__}'s graph has a line this rewrite does not know")
        scope = dict(namespace, _unitscale_track=_track)
        exec(compile(src, f"<unitscale tracking of {type(module).__name__}>", "exec"), scope)
        self.steps, self.nodes, self.code = steps, nodes, code
        self._failed = threading.local()
        self._forward = scope["forward"]

    def run(self, module: nn.Module, inputs: tuple[Any, ...], captured: ScaleRecording) -> Any:
        """Run ``module`` on ``inputs`` (the graph's placeholders), recording each node's output in ``captured``.

        The caller closes ``captured.cleanup`` after the backward pass, or on an error, when
        :attr:`failed_node` names the node.
        """
        saved = (_run.program, getattr(_run, "captured", None), _run.last)
        _run.program, _run.captured, _run.last = self, captured, -1
        try:
            return self._forward(module, *inputs)
        except BaseException:
            self._failed.index = _run.last + 1  # per thread: a cached program is shared
            raise
        finally:
            _run.program, _run.captured, _run.last = saved  # type: ignore[assignment]

    @property
    def failed_node(self) -> fx.Node | None:
        """The node this thread's last failed :meth:`run` stopped at (``None`` at the output or before any failed)."""
        failed = getattr(self._failed, "index", -1)
        return self.nodes[failed] if 0 <= failed < len(self.nodes) else None


def _static_op(module: nn.Module, n: fx.Node) -> str:
    if n.op == "placeholder":
        return "input"
    if n.op == "get_attr":
        return ""
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    if n.op == "call_module":
        return type(module.get_submodule(str(n.target))).__name__
    if isinstance(n.target, torch._ops.OpOverload):  # an exported graph's aten.linear.default
        return n.target._opname
    return op_name(n.target)


def graph_steps(module: nn.Module, nodes: list[fx.Node]) -> list[Step]:
    """The :class:`~unitscale.tracking.recording.Step` of each node (the graph's nodes but its output, in order).

    >>> import torch
    >>> from torch import fx, nn
    >>> from unitscale.tracking.compiled import graph_steps
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> nodes = list(gm.graph.nodes)[:-1]  # all but the output
    >>> [(s.name, s.op, s.hand_on) for s in graph_steps(gm, nodes)]
    [('input_1', 'input', ''), ('_0', 'Linear', ''), ('_1', 'ReLU', '')]
    """
    changed = changed_in_place(nodes)
    steps = []
    for n in nodes:
        taker = view_taking_over(n)
        path, hand_on = n.meta.get(MODULE_PATH_KEY, ""), "" if taker is None else taker.name
        op, source = _static_op(module, n), holds_its_input_values(n)
        steps.append(Step(n.name, n.op, path, op, hand_on, source, taker in changed, changes_in_place(n)))
    return steps


def view_taking_over(n: fx.Node) -> fx.Node | None:
    """``n``'s only user where it is a view of ``n`` (a reshape, a transpose), else ``None``.

    It holds ``n``'s numbers, and its gradient ``n``'s: one record, one hook on the view, serves both.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.tracking.compiled import view_taking_over
    >>> graph = fx.symbolic_trace(lambda x: torch.relu(x).t() + x.t()).graph
    >>> relu = next(n for n in graph.nodes if n.name == "relu")
    >>> view_taking_over(relu).name, view_taking_over(relu.args[0])  # x has two users
    ('t', None)
    """
    users = list(n.users)
    if len(users) != 1 or not is_view_node(users[0]) or users[0].args[:1] != (n,):
        return None
    # n's tensor may be its input itself (x.float()), whose gradient comes from its other readers too
    return None if _in(n, _ITSELF_METHODS, _ITSELF_FUNCTIONS) or changes_in_place(n) else users[0]


def holds_its_input_values(n: fx.Node) -> bool:
    """Whether ``n``'s tensor holds its first argument's values: a view, a copy, or a cast that casts nothing.

    In an exported graph, ATen's forms count too (``aten.to.dtype`` to the dtype a tensor has).

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.tracking.compiled import holds_its_input_values
    >>> graph = fx.symbolic_trace(lambda x: torch.tanh(x.float().t()).clone()).graph
    >>> nodes = [n for n in graph.nodes if n.op.startswith("call_")]
    >>> [(n.name, holds_its_input_values(n)) for n in nodes]
    [('float_1', True), ('t', True), ('tanh', False), ('clone', True)]
    """
    same = is_view_node(n) or _in(n, _SAME_VALUE_METHODS, _SAME_VALUE_FUNCTIONS)
    return same and bool(n.args) and isinstance(n.args[0], fx.Node)


def changed_in_place(nodes: Iterable[fx.Node]) -> set[fx.Node]:
    """The nodes whose tensor a later node changes in place, directly or through views of it.

    A hook on a view changed in place never fires (torch takes the gradient through its base),
    so the node a view takes over from keeps its own hook.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.tracking.compiled import changed_in_place
    >>> graph = fx.symbolic_trace(lambda x: torch.tanh(x).view(-1).add_(1) * 2).graph
    >>> sorted(n.name for n in changed_in_place(graph.nodes))
    ['tanh', 'view']
    """
    changed: set[fx.Node] = set()
    for n in nodes:
        if changes_in_place(n) or (n.target is operator.setitem and n.args):
            target = n.args[0]
            while isinstance(target, fx.Node) and target not in changed:
                changed.add(target)
                target = target.args[0] if _may_alias_its_input(target) and target.args else None
    return changed


# Functions that return their first argument itself when there is nothing to do (dropout in eval
# mode), as eager's _ITSELF_METHODS do.
_aten = torch.ops.aten
_DROPOUTS = frozenset(
    {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, _aten.dropout.default}
)
_ITSELF_FUNCTIONS = _DROPOUTS | {  # and ATen's forms, the targets of an exported graph's nodes
    _aten.to.dtype, _aten.to.dtype_layout, _aten.to.device, _aten.to.other, _aten.type_as.default,
    _aten.contiguous.default,
}  # fmt: skip
# Ops whose tensor holds their first argument's values where they cast or move nothing: not
# dropout, which in training zeroes some. (Views hold them too: unitscale.fx.nodes.is_view_node.)
_SAME_VALUE_FUNCTIONS = (_ITSELF_FUNCTIONS - _DROPOUTS) | {
    torch.clone,
    torch.detach,
    _aten._to_copy.default,
    _aten.detach.default,
}
# Ops whose result may share its first argument's memory: those, views and slices.
_ALIASING_METHODS = _ITSELF_METHODS | {
    "expand", "expand_as", "narrow", "select", "split", "chunk", "unbind", "diagonal", "unfold", "as_strided", "detach"
}  # fmt: skip
_ALIASING_FUNCTIONS = _ITSELF_FUNCTIONS | {
    operator.getitem, torch.narrow, torch.select, torch.split, torch.chunk, torch.unbind, torch.diagonal,
    torch.detach, torch.as_strided,
}  # fmt: skip


def _in(n: fx.Node, methods: frozenset[str], functions: frozenset[Any]) -> bool:
    if n.op == "call_method":
        return n.target in methods
    try:
        return n.op == "call_function" and n.target in functions
    except TypeError:  # an unhashable target
        return False


def _may_alias_its_input(n: fx.Node) -> bool:
    # an op in place returns the tensor it changed; an ATen op's schema says it (Tensor(a) self)
    if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
        return first_argument_alias(n.target) is not None
    return is_view_node(n) or changes_in_place(n) or _in(n, _ALIASING_METHODS, _ALIASING_FUNCTIONS)


class _NotCompiled(Exception):
    """The graph's code is not in the form :func:`_instrumented` rewrites: run it with the interpreter."""


_FLATTEN = re.compile(r"^    [\w, ]+ = fx_pytree\.tree_flatten_spec\(")


def _instrumented(code: str, nodes: list[fx.Node], steps: list[Step]) -> str | None:
    """``code`` with each node's value passed through the recording call; ``None``: a line not as fx writes it."""
    lines = code.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("def forward(self")), None)
    if at is None:
        return None
    signature = lines[at]
    i = at + 1
    if i < len(lines) and _FLATTEN.match(lines[i]):
        i += 1  # an exported graph's inputs, unpacked from the call's arguments before any node
    out = lines[:i]
    for k, (n, step) in enumerate(zip(nodes, steps, strict=True)):
        if n.op == "placeholder" and re.search(rf"[(, ]{re.escape(n.name)}\b", signature):
            out.append(f"    {n.name} = _unitscale_track({n.name}, {k})")
            continue
        # a node's line; or a placeholder's that fx renamed off a builtin (input_1 = input: nn.Sequential's)
        prefix = f"    {n.name} = "
        while i < len(lines) and not lines[i].startswith(prefix):
            if lines[i].startswith("    ") and " = " in lines[i].split("(")[0]:
                return None  # another node's assignment first: not the order expected
            out.append(lines[i])
            i += 1
        if i == len(lines):
            return None
        line = lines[i]
        cleanup = _CLEANUP.search(line)
        expr = line[len(prefix) : cleanup.start() if cleanup else len(line)]
        source = f", {n.args[0].name}" if step.from_source else ""  # type: ignore[union-attr]
        out.append(f"{prefix}_unitscale_track({expr}, {k}{source}){cleanup.group(0) if cleanup else ''}")
        i += 1
    out.extend(lines[i:])
    return "\n".join(out)


# Kept on the graph: a dict keyed weakly by graph would keep every graph alive (it refers to its nodes).
_COMPILED = "_unitscale_compiled_tracking"


def compiled_tracking(module: nn.Module, cap: Capture) -> CompiledTracking | None:
    """The :class:`CompiledTracking` of ``cap``'s graph, run with ``module`` as ``self``; made once per graph.

    ``None`` where the code is not in the form fx writes: run the graph with the interpreter
    then. Only for graphs nobody edits after the first call (an edited one keeps its old code).

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.examples import MLP
    >>> from unitscale.tracking.compiled import compiled_tracking
    >>> model, x = MLP(4), torch.randn(2, 4)
    >>> cap = capture(model, x, deep=DeepTracing(), check=False, cache=True)
    >>> program = compiled_tracking(model, cap)
    >>> program is not None and compiled_tracking(model, cap) is program
    True
    """
    graph = cap.graph_module.graph  # type: ignore[union-attr]
    program: Any = vars(graph).get(_COMPILED, False)
    if program is False:
        code, namespace = cap.python_code()
        try:
            program = CompiledTracking(module, graph, code, namespace)
        except _NotCompiled:
            program = None
        setattr(graph, _COMPILED, program)
    return program


class ScaleTrackingInterpreter(fx.Interpreter):
    """Runs a graph and records the scale of every floating-point node output.

    Overrides :meth:`torch.fx.Interpreter.run_node`: each output's std (and optionally
    abs-max) is recorded, and a gradient hook records its gradient's; floating-point inputs
    become leaves that require grad. The caller's tensors and the graph are left untouched.
    To record something else per node, override ``run_node`` and call ``super().run_node(n)``.

    Args:
        module: the module the graph belongs to (a ``GraphModule``, or the traced module).
        graph: the graph to run (default: ``module.graph``).
        abs_max: also record each tensor's largest magnitude.
        only: the nodes to record (``None``: every node); the others just run.

    After ``run()`` and the backward pass, close ``captured.cleanup`` (it removes the hooks)
    and read the rows with :func:`~unitscale.tracking.read_rows`.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.tracking import ScaleTrackingInterpreter, read_rows
    >>> from unitscale.examples import MLP
    >>> _ = torch.manual_seed(0)
    >>> gm = fx.symbolic_trace(MLP(4))
    >>> interp = ScaleTrackingInterpreter(gm)
    >>> interp.run(torch.randn(8, 4)).sum().backward()
    >>> interp.captured.cleanup.close()
    >>> rows = read_rows(interp.captured.entries)
    >>> [(row.node, row.backward is not None) for row in rows]
    [('x', False), ('fc1', True), ('act', True), ('fc2', True)]
    """

    def __init__(
        self,
        module: nn.Module,
        graph: fx.Graph | None = None,
        abs_max: bool = False,
        only: Collection[fx.Node] | None = None,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise NotAModuleError(
                f"ScaleTrackingInterpreter() got {type(module).__name__} {module!r:.60}; pass the GraphModule "
                "to run, or the module a graph was traced from with graph=..."
            )
        if graph is None and not isinstance(module, fx.GraphModule):
            raise NotAModuleError(
                f"ScaleTrackingInterpreter() got a {type(module).__name__}, which has no graph; pass a GraphModule "
                "(torch.fx.symbolic_trace(module)) or graph=..."
            )
        if graph is not None and not isinstance(graph, fx.Graph):
            raise InputError(
                f"ScaleTrackingInterpreter(graph=...) got {type(graph).__name__} {graph!r:.60}; pass a torch.fx.Graph"
            )
        super().__init__(module, graph=graph)
        self.abs_max = abs_max
        self.captured = ScaleRecording(
            differentiate_inputs=not any(p.requires_grad for p in module.parameters()), abs_max=abs_max
        )
        self.current_node: fx.Node | None = None
        nodes = [n for n in self.graph.nodes if n.op != "output"]
        steps = dict(zip(nodes, graph_steps(self.module, nodes), strict=True))
        if only is not None:  # a record handed on to a node left out would never get its gradient
            names = {n.name for n in only}
            keep = [(n, s) for n, s in steps.items() if n in only]
            steps = {n: s if s.hand_on in names else s._replace(hand_on="", keep_hook=False) for n, s in keep}
        self._steps = steps

    def run_node(self, n: fx.Node) -> Any:
        self.current_node = n
        # without fx's per-node context manager: on a small model it costs as much as the tracking itself
        out = run_plainly(self, n)
        step = self._steps.get(n)
        if step is None:  # the output
            return out
        return self.captured.record(out, step, self.env[n.args[0]] if step.from_source else None)  # type: ignore[index]


def _shapes(inputs: tuple[Any, ...]) -> str:
    return ", ".join(str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__ for v in inputs)


def _out_of_memory(who: str, e: BaseException, on: str = "") -> None:
    """Raise :class:`OutOfMemoryError` if ``e`` is running out of memory: not an input of the wrong shape."""
    if OutOfMemoryError.caused(e):
        raise OutOfMemoryError(
            f"{who} ran out of memory{on} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); use "
            "smaller inputs (a smaller batch), free memory, or run on a device with more"
        ) from e


def _advice(reason: str) -> str:
    if "in-place operation" in reason:
        return "The model updates a tensor that requires grad in place: do it under torch.no_grad() or outside forward."
    return "Check that the inputs have the shapes and dtypes the model expects."


def track_pass(cap: Capture, module: nn.Module, inputs: tuple[Any, ...], backward: Any, abs_max: bool) -> ScaleReport:
    """One forward pass of ``module`` recorded on ``cap``, one backward pass, and their report.

    Every parameter of ``module`` is a leaf of the backward pass; the gradient hooks are
    removed before it returns, on failure too. The caller keeps the model's state and turns
    gradients on (:func:`~unitscale.tracking.track_scales`).

    >>> import torch
    >>> from unitscale.capture import capture
    >>> from unitscale.examples import MLP
    >>> from unitscale.tracking.compiled import track_pass
    >>> model, x = MLP(4), torch.randn(8, 4)
    >>> cap = capture(model, x, check=False)
    >>> report = track_pass(cap, model, (x,), None, abs_max=False)
    >>> [row.node for row in report][:3], report.route
    (['x', 'fc1', 'act'], 'fx')
    """
    model = type(module).__name__
    # an fx trace's code reads the module itself (its current parameters); an exported graph holds its own
    root = module if cap.graph_module in (None, module) or cap.route == "fx" else cap.graph_module
    program = None if cap.graph_module in (None, module) else compiled_tracking(root, cap)
    interp = None
    captured = ScaleRecording(differentiate_inputs=not any(p.requires_grad for p in root.parameters()), abs_max=abs_max)
    with captured.cleanup:  # the gradient hooks, some on the caller's parameters, go however the pass ends
        try:
            if cap.graph_module is None:
                record_ops(module, inputs, captured)
            elif program is not None:
                captured.output = program.run(root, inputs + cap.extra_inputs, captured)
            else:
                interp = ScaleTrackingInterpreter(root, graph=cap.graph_module.graph, abs_max=abs_max)
                interp.captured = captured
                captured.output = interp.run(*inputs, *cap.extra_inputs)
        except Exception as e:
            _out_of_memory(type(root).__name__, e, f" on inputs of shape {_shapes(inputs)}")
            n = interp.current_node if interp is not None else program.failed_node if program is not None else None
            where = f" at node '{n.name}' ({n.op} {op_name(n.target)})" if n is not None else ""
            where = f" at {user_frame(e)}" if cap.graph_module is None else where
            reason = str(e).split("\n\nWhile executing")[0].rstrip(".")  # fx appends the node's repr
            raise InputError(
                f"{type(root).__name__} failed{where} on inputs of shape {_shapes(inputs)}: {reason}. {_advice(reason)}"
            ) from e
        try:
            outputs = float_outputs(captured.output, model)
            # the parameters the graph read are leaves already; the others too, once each
            leaves = list(dict.fromkeys([*captured.leaves, *module.parameters()]))
            no_backward = run_backward(outputs, backward, leaves)
        except UnitscaleError:  # a gradient of the wrong shape: already says what to pass
            raise
        except Exception as e:  # a backward hook, a custom Function's backward: as forward failures are
            _out_of_memory(f"the backward pass of {model}", e)
            raise BackwardError(
                f"the backward pass of {model} failed at {user_frame(e)}: {type(e).__name__}: {e} (raised by a "
                "backward hook or an autograd Function's backward of the model); fix that code, or remove the hook "
                "while tracking"
            ) from e
    rows = read_rows(captured.entries)
    code = annotated_code(cap, rows, model, program.code if program is not None else None)
    failure = cap.reasons.get("fx", "").removeprefix("TraceError: ") if cap.route == "eager" else ""
    return ScaleReport(rows, model, code, cap.route, failure, no_backward)
