"""One home for what every graph tool agrees on about nodes: ``node.meta`` keys, op kinds and names.

Meta keys, and what writes them:

==================  =====================================================  ==========================================
key                 value                                                  written by
==================  =====================================================  ==========================================
``module_path``     qualified name of the module the node came from        :class:`~unitscale.fx.ModulePathTracer`,
                    (``""`` for the root)                                  the capture layer (every route)
``module_type``     qualified class name of that module                    the capture layer (every route)
``source``          ``"file.py:123"`` of the user code that made the node  the capture layer, where the route knows it
``tag``             whatever a tag function returned                       :class:`~unitscale.fx.TaggingTracer`
``inlined_from``    qualified name of the module an inlined node came from :func:`~unitscale.inline`
==================  =====================================================  ==========================================
"""

from __future__ import annotations

import operator
from typing import Any

import einops
import torch
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name
from torch.fx.passes.shape_prop import TensorMetadata

__all__ = [
    "MODULE_PATH_KEY",
    "MODULE_TYPE_KEY",
    "SOURCE_KEY",
    "TAG_KEY",
    "INLINED_FROM_KEY",
    "COMPUTE_OPS",
    "op_name",
    "VIEW_METHODS",
    "VIEW_FUNCTIONS",
    "VIEW_ATEN_OPS",
    "VIEW_ATTRIBUTES",
    "is_view_node",
    "SCALE_NEUTRAL_METHODS",
    "SCALE_NEUTRAL_FUNCTIONS",
    "tensor_metadata",
    "changes_in_place",
    "first_argument_alias",
    "in_place_name",
]

MODULE_PATH_KEY = "module_path"
MODULE_TYPE_KEY = "module_type"
SOURCE_KEY = "source"
TAG_KEY = "tag"
INLINED_FROM_KEY = "inlined_from"

#: ``node.op`` values of nodes that compute something (the others move values in and out).
COMPUTE_OPS = ("call_function", "call_method", "call_module")


def _strip_dunder(name: str) -> str:
    # Tensor.__add__ -> add; an in-place mul_ keeps its underscore
    return name[2:-2] if name.startswith("__") and name.endswith("__") and len(name) > 4 else name


# Private homes of public torch functions, and the names users call them by.
_PUBLIC_HOMES = (
    ("_operator.", "operator."),
    ("torch._C._nn.", "torch.nn.functional."),
    ("torch._C._VariableFunctions.", "torch."),
)


def op_name(target: Any, *, qualified: bool = False) -> str:
    """The name of an op (a node's ``target``): ``Tensor.<name>`` for a method, dunders dropped.

    ``qualified=True`` adds the module users import it from (``torch.nn.functional.relu``).

    >>> import operator, torch
    >>> from unitscale.fx.nodes import op_name
    >>> linear = torch.nn.functional.linear
    >>> [op_name(f) for f in (linear, torch.Tensor.add, "reshape")]
    ['linear', 'Tensor.add', 'Tensor.reshape']
    >>> [op_name(f, qualified=True) for f in (linear, operator.add)]
    ['torch.nn.functional.linear', 'operator.add']
    """
    if isinstance(target, str):
        return f"Tensor.{_strip_dunder(target)}"
    name = _strip_dunder(getattr(target, "__name__", None) or type(target).__name__)
    owner = getattr(target, "__objclass__", None)
    if isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return f"Tensor.{name}"
    if not qualified or name == "<lambda>":  # fx would name a lambda by its source line
        return name
    try:
        full = _get_qualified_name(target)
    except Exception:  # a lambda or an object without a module: its own name is all there is
        return name
    if "<locals>" in full:  # a dispatcher made in a function (F.max_pool2d's) carries the public name
        module = getattr(target, "__module__", None)
        full = f"{module}.{name}" if module else name
    for private, public in _PUBLIC_HOMES:
        if full.startswith(private):
            return public + full.removeprefix(private)
    return full


# Ops whose output holds the same values as their first input, rearranged: its std, and
# (when it is the input's only user) its gradient's std, are the input's.
VIEW_METHODS = frozenset(
    {"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "flatten", "unflatten"}
    | {"squeeze", "unsqueeze", "t", "movedim", "swapaxes", "swapdims"}
)
VIEW_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.squeeze, torch.unsqueeze, torch.t}
    | {torch.movedim, torch.swapaxes, torch.swapdims, einops.rearrange}
)

_aten = torch.ops.aten
#: The same views as ATen ops, the targets of an exported graph's nodes (``aten.view.default``, not
#: ``aten.view.dtype``, which reinterprets the bits; ``aten.clone`` copies the same values).
VIEW_ATEN_OPS: frozenset[Any] = frozenset(
    {_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default, _aten.transpose.int}
    | {_aten.permute.default, _aten.t.default, _aten.unsqueeze.default, _aten.squeeze.default}
    | {_aten.squeeze.dim, _aten.squeeze.dims, _aten.flatten.using_ints, _aten.unflatten.int}
    | {_aten.movedim.int, _aten.alias.default, _aten.clone.default}
)

#: Tensor attributes that are views of the tensor (``w.T`` in ``x @ w.T``): a graph reads them
#: as ``getattr(w, "T")``.
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH"})


def is_view_node(n: torch.fx.Node) -> bool:
    """Whether ``n`` only rearranges its first argument's elements: a view of :data:`VIEW_METHODS`,
    :data:`VIEW_FUNCTIONS` or :data:`VIEW_ATEN_OPS`, not one that reinterprets the bits.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.fx.nodes import is_view_node
    >>> graph = fx.symbolic_trace(lambda x: x.view(-1).view(torch.float16) + 1).graph
    >>> [is_view_node(n) for n in graph.nodes if n.op == "call_method"]
    [True, False]
    """
    if n.op == "call_method":
        is_view = n.target in VIEW_METHODS
    else:
        is_view = n.op == "call_function" and (n.target in VIEW_FUNCTIONS or n.target in VIEW_ATEN_OPS)
    # x.view(torch.float16) reinterprets the bits: not the same numbers.
    return is_view and not any(isinstance(a, torch.dtype) for a in n.args)


# Ops that move, select, copy or cast values without changing their scale: the views, and
# more (``cat`` joins tensors of like scale; dropout keeps the scale in expectation).
SCALE_NEUTRAL_METHODS = VIEW_METHODS | {
    "expand", "expand_as", "split", "chunk", "unbind", "size", "dim", "to", "float", "half", "bfloat16",
    "double", "type", "type_as", "detach", "clone", "repeat", "narrow", "select", "__getitem__", "roll",
    "flip", "masked_fill", "cpu", "cuda", "neg", "__neg__", "where",
}  # fmt: skip
SCALE_NEUTRAL_FUNCTIONS: frozenset[Any] = VIEW_FUNCTIONS | {
    operator.getitem, torch.cat, torch.concat, torch.stack, torch.split, torch.chunk, torch.unbind,
    torch.narrow, torch.select, torch.roll, torch.flip, torch.clone, torch.detach, torch.masked_fill,
    F.pad, torch._C._nn.pad, einops.repeat, F.dropout, operator.neg, torch.neg, torch.where,
}  # fmt: skip


_IN_PLACE_OPERATORS = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv})
_IN_PLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__"})


def in_place_name(name: str) -> bool:
    """Whether a tensor method of this name changes the tensor in place (``mul_``, ``__iadd__``).

    >>> from unitscale.fx.nodes import in_place_name
    >>> [in_place_name(name) for name in ("add_", "__iadd__", "add", "_foo_")]
    [True, True, False, False]
    """
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))


def changes_in_place(node: torch.fx.Node) -> bool:
    """Whether ``node`` changes its first argument in place and returns it (not ``x[i] = v``).

    In an exported graph: the ATen op whose schema writes its first argument (``Tensor(a!) self``).

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.fx.nodes import changes_in_place
    >>> def f(x):
    ...     y = torch.relu_(x.mul_(2))
    ...     return torch.nn.functional.relu(y, inplace=True) + y.add(1)
    >>> [n.name for n in fx.symbolic_trace(f).graph.nodes if changes_in_place(n)]
    ['mul_', 'relu_', 'relu']
    """
    if not node.args:
        return False
    if node.op == "call_method":
        return in_place_name(str(node.target))
    if node.op != "call_function":
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        alias = first_argument_alias(node.target)
        return alias is not None and alias.is_write
    try:
        if node.target in _IN_PLACE_OPERATORS:
            return True
    except TypeError:  # an unhashable target
        return False
    if node.kwargs.get("inplace") is True:
        return True
    name = getattr(node.target, "__name__", "")
    in_place = name.endswith("_") and not name.startswith("_")
    return in_place and node.target in (getattr(torch.Tensor, name, None), getattr(torch, name, None))


def first_argument_alias(op: torch._ops.OpOverload) -> Any:
    """The alias annotation of an ATen op's first argument, from its schema; ``None`` where it has none.

    >>> import torch
    >>> from unitscale.fx.nodes import first_argument_alias
    >>> aten = torch.ops.aten
    >>> first_argument_alias(aten.mul_.Tensor).is_write  # Tensor(a!) self
    True
    >>> first_argument_alias(aten.view.default).is_write  # Tensor(a) self
    False
    >>> first_argument_alias(aten.mul.Tensor) is None  # Tensor self
    True
    """
    arguments = op._schema.arguments
    return arguments[0].alias_info if arguments else None


def tensor_metadata(value: torch.Tensor) -> TensorMetadata:
    """``meta["tensor_meta"]`` for a tensor: shape, dtype, ``requires_grad`` and stride (fx's also probes
    memory formats and quantisation, which no tool of ours reads, at more than a small node's cost).

    >>> import torch
    >>> from unitscale.fx.nodes import tensor_metadata
    >>> tensor_metadata(torch.zeros(2, 3)).shape
    torch.Size([2, 3])
    """
    return TensorMetadata(value.shape, value.dtype, value.requires_grad, value.stride(), None, False, {})
