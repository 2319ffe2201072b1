"""Scale tracking as compiled Python: the traced graph's code with a recording call after each node.

:class:`~unitscale.tracking.analysis.ScaleTrackingInterpreter` dispatches every node
through :class:`torch.fx.Interpreter` (argument mapping, an environment dict, the node's
users and kind looked up on every call): on a small model that costs several percent of a
forward and backward pass. Here the graph is rewritten once per cached capture into code that
runs each op directly and hands its output to one recording call, whose per-node facts
(name, module path, op, which view shares whose record) were worked out when the code was
made. The code takes the traced module itself as ``self``, so it reads the module's current
parameters and submodules, as the interpreter does. The rows and numbers are the
interpreter's.
"""

from __future__ import annotations

import operator
import re
import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from unitscale.capture import Capture
from unitscale.fx.nodes import MODULE_PATH_KEY, changes_in_place, first_argument_alias, is_view_node, op_name
from unitscale.tracking.recording import ScaleRecording, Step

__all__ = [
    "CompiledTracking",
    "changed_in_place",
    "compiled_tracking",
    "graph_steps",
    "holds_its_input_values",
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
    """A captured graph compiled into a function that records every floating-point node output.

    Made by :func:`compiled_tracking` (cached per graph). :meth:`run` records what
    :class:`~unitscale.tracking.analysis.ScaleTrackingInterpreter` records, with the same
    rows, records, leaves and hooks, and gives back the model's output.

    Args:
        module: the module the graph was traced from (the code's ``self``).
        graph: the traced graph (left unchanged).
        code: the graph's code as fx writes it (``graph.python_code(root_module="self").src``).
        namespace: the globals that code runs in.

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.examples import MLP
    >>> from unitscale.tracking.compiled import CompiledTracking
    >>> model = MLP(4)
    >>> cap = capture(model, torch.randn(2, 4), deep=DeepTracing(), check=False)
    >>> program = CompiledTracking(model, cap.graph_module.graph, *cap.python_code())
    >>> captured = program.run(model, (torch.randn(8, 4),), abs_max=False)
    >>> print(*(row.node for row, _ in captured.entries))
    x fc1_weight fc1_bias linear relu fc2_weight fc2_bias linear_1
    >>> captured.remove_hooks()
    """

    def __init__(self, module: nn.Module, graph: fx.Graph, code: str, namespace: dict[str, Any]) -> None:
        nodes = [n for n in graph.nodes if n.op != "output"]
        steps = graph_steps(module, nodes)
        src = _instrumented(code, nodes, steps)
        if src is None:
            raise _NotCompiled(f"the code of {type(module).__name__}'s graph has a line this rewrite does not know")
        scope = dict(namespace, _unitscale_track=_track)
        exec(compile(src, f"<unitscale tracking of {type(module).__name__}>", "exec"), scope)
        self.steps = steps
        self.nodes = nodes
        self._failed = threading.local()
        self._forward = scope["forward"]

    def run(self, module: nn.Module, inputs: tuple[Any, ...], abs_max: bool) -> ScaleRecording:
        """Run ``module`` on ``inputs`` (the graph's placeholders, in order), recording each node's output.

        Gradient hooks stay in place for the backward pass (``captured.remove_hooks()``
        after it); on an error they are removed and :attr:`failed_node` names the node.
        """
        captured = ScaleRecording(
            differentiate_inputs=not any(p.requires_grad for p in module.parameters()), abs_max=abs_max
        )
        saved = (_run.program, getattr(_run, "captured", None), _run.last)
        _run.program, _run.captured, _run.last = self, captured, -1
        try:
            captured.output = self._forward(module, *inputs)
        except BaseException:
            captured.remove_hooks()
            self._failed.index = _run.last + 1  # per thread: a cached program is shared
            raise
        finally:
            _run.program, _run.captured, _run.last = saved  # type: ignore[assignment]
        return captured

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
    >>> from torch import fx
    >>> from unitscale.tracking.compiled import graph_steps
    >>> from torch import nn
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> nodes = list(gm.graph.nodes)[:-1]  # all but the output
    >>> [(s.name, s.op, s.hand_on) for s in graph_steps(gm, nodes)]
    [('input_1', 'input', ''), ('_0', 'Linear', ''), ('_1', 'ReLU', '')]
    """
    changed = changed_in_place(nodes)
    steps = []
    for n in nodes:
        taker = view_taking_over(n)
        path, op = n.meta.get(MODULE_PATH_KEY, ""), _static_op(module, n)
        hand_on = "" if taker is None else taker.name
        source = holds_its_input_values(n)
        steps.append(Step(n.name, n.op, path, op, hand_on, source, taker in changed, changes_in_place(n)))
    return steps


def view_taking_over(n: fx.Node) -> fx.Node | None:
    """``n``'s only user where it is a view of ``n`` (a reshape, a transpose), else ``None``.

    The view holds the same numbers as ``n``, and so does its gradient: one record serves
    both rows, filled by one gradient hook on the view (unless :func:`changed_in_place`).

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

    Its forward numbers are then its input's (taken from the input's record where its
    dtype, size and values are unchanged: :meth:`ScaleRecording.track_same_values`). In an
    exported graph these are ATen ops: ``aten.to.dtype`` to the dtype a tensor already has
    returns the tensor itself, as ``x.float()`` does.

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

    A gradient hook on a view that is then changed in place never fires (torch takes the
    gradient through the view's base instead), so the node a view takes over from keeps
    its own hook, which fills the shared record.

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


# Ops that return their first argument itself when there is nothing to do (x.float() of a
# float32 x, dropout in eval mode): their node's tensor may be its input's, read by others too.
_ITSELF_METHODS = frozenset(
    {"contiguous", "to", "float", "double", "half", "bfloat16", "type", "type_as", "cpu", "cuda"}
)
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
_SAME_VALUE_METHODS = _ITSELF_METHODS | {"clone", "detach"}
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


_CLEANUP = re.compile(r";  (?:\w+ = )+None$")
_FLATTEN = re.compile(r"^    [\w, ]+ = fx_pytree\.tree_flatten_spec\(")


def _instrumented(code: str, nodes: list[fx.Node], steps: list[Step]) -> str | None:
    """``code`` (fx's, one line per node) with each node's value passed through the recording call.

    ``None`` where a node's line is not found as fx writes it (``name = expression``,
    maybe followed by ``;  a = b = None``): the caller falls back to the interpreter.
    """
    lines = code.split("\n")
    try:
        at = next(i for i, line in enumerate(lines) if line.startswith("def forward(self"))
    except StopIteration:
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


# A graph's compiled tracking is kept on the graph (it refers to the graph's nodes, so a
# dict keyed weakly by graph would keep every graph, and its model, alive): it lives as long
# as the graph of the cached capture does.
_COMPILED = "_unitscale_compiled_tracking"


def compiled_tracking(module: nn.Module, cap: Capture) -> CompiledTracking | None:
    """The :class:`CompiledTracking` of ``cap``'s graph, run with ``module`` as ``self``; made once per graph.

    Compiling costs about what the interpreter loses over one pass (Python's ``compile``
    of the code), so the first call costs about the same and every later one less.
    ``None`` where the code is not in the form fx writes: run the graph with the
    interpreter then.

    Only for graphs nobody edits after the first call (those of cached captures): an
    edited graph would keep its old code.

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.examples import MLP
    >>> from unitscale.tracking.compiled import compiled_tracking
    >>> model = MLP(4)
    >>> x = torch.randn(2, 4)
    >>> cap = capture(model, x, deep=DeepTracing(), check=False, cache=True)
    >>> program = compiled_tracking(model, cap)
    >>> program is not None and compiled_tracking(model, cap) is program
    True
    """
    graph = cap.require_graph("compiled_tracking()").graph
    program: Any = vars(graph).get(_COMPILED, False)
    if program is False:
        code, namespace = cap.python_code()
        try:
            program = CompiledTracking(module, graph, code, namespace)
        except _NotCompiled:
            program = None
        setattr(graph, _COMPILED, program)
    return program
