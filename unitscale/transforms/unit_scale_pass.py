"""The graph pass behind :func:`unitscale.unit_scale`.

On a graph of torch functions (TorchDynamo's, a flat ``torch.fx`` trace, or an exported
graph read by :func:`unitscale.transforms.aten.to_torch_functions`), whose nodes carry
``example_value`` and the capture layer's ``module_path``/``source``:

1. user replacements first: a node whose function is a key of ``replace`` calls the value;
   then written-out composites (RMS norm, tanh GELU) are folded into their twins
   (:mod:`unitscale.transforms.patterns`);
2. residual adds, found by dependency analysis (an add where one operand is an ancestor
   of the other: the ancestor is the skip connection, the other the branch), become
   ``residual_split`` at the skip and ``residual_add`` at the join, with ``tau = 0.01``
   when the branch holds attention (softmax or scaled dot-product attention) and 0.5
   otherwise; every other add of two float tensors becomes an unconstrained ``U.add``;
3. every other op found in :data:`unitscale.functional.torch_map` becomes its twin, with
   ``constraint=None`` on the trunk alone: where every path from the inputs to the output
   passes through the op (the stem of a ResNet, an op between two residual blocks, the
   head after the last residual add), its input's gradient reaches everything upstream
   through it alone, so a mismatch of its two scales multiplies every upstream gradient
   by one number, and the two directions may be scaled independently (Blake et al.'s
   cut edges). Off the trunk (a residual branch, a squeeze-excitation gate's branch, one
   of two heads read by one loss) the gradient meets another path's upstream, and the
   op keeps its constraint;
4. a product with a constant (``x * c``, ``x / c``) that only linear layers and norms
   read becomes ``sign(c) * x``: the unit-scaled op after it sets its own scale;
5. ops that keep the scale of unit-scaled operands without a twin are left as they are
   and listed, with the reason, in ``graph_module.meta["kept_ops"]``: rotary embeddings
   (``x * cos + rotate_half(x) * sin``, with ``cos``/``sin`` off the activation path)
   and elementwise products of two activations of one shape (gated MLPs); a product
   whose one factor is broadcast over the other (a squeeze-excitation gate) becomes
   :func:`~unitscale.functional.mul`, which scales the broadcast factor's summed gradient
   where that keeps gradients true: the factors share no input, or the gate's branch
   starts at a global average pool, which then gets the inverse backward scale;
6. convolutional networks: a matmul or convolution only batch norm reads takes its
   backward scale both ways (batch norm undoes its forward scale); a max pool of a ReLU,
   an average pool to one value per channel (for the mean its input has) and a ReLU after
   a residual add whose skip is a ReLU (post-activation ResNets) get the scales of their
   actual inputs rather than of ``N(0, 1)``; an add of two paths from one fork (a
   projection shortcut) becomes a residual pair; batch norm keeps scale 1 both ways; on
   the trunk (a cut edge), before each residual block that holds batch norm and before
   each batch norm, a gradient factor is measured once, by the first backward pass, then
   frozen in a buffer saved with the model (:func:`~unitscale.functional.frozen_grad_scale`;
   ``_frozen.py``): every scale is a constant during training, so backward stays linear;
   higher-order ops and inlined ``vmap``
   bodies are left whole and listed in ``graph_module.meta["unscaled_regions"]``;
7. the ops left as they were, other than ones that move data without changing its scale
   (reshapes, indexing, concatenation, ...) or produce no float tensor, are
   listed in ``graph_module.meta["unscaled_ops"]``.

Only ops on the activation path are scaled or listed: those that read, directly or
not, a float input or a parameter. Position tables, masks and bucket indices computed
from integer inputs and buffers carry no gradient and keep their values.

Parameters are re-initialised (:func:`unit_init_`) only where every use is a unit-scaled
op; a parameter that feeds an op left unscaled keeps its values, so the ops around it
compute what they did.

The rules for batch norm, pools, post-activation ReLUs and squeeze-excitation gates (steps
5 and 6) live in ``_cnn_rules.py``; the questions every step asks of the graph (what a
node runs, who reads it, the activation path and the trunk) in ``_graph.py``.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import unitscale.functional as U
from unitscale.fx.nodes import (
    MODULE_PATH_KEY,
    SCALE_NEUTRAL_FUNCTIONS,
    SCALE_NEUTRAL_METHODS,
    SOURCE_KEY,
    changes_in_place,
    op_name,
)
from unitscale.scaling.parameter import tag
from unitscale.transforms._cnn_rules import (
    _balance_gates,
    _constrain_before_batch_norms,
    _forward_scale_global_pools,
    _rescale_max_pools_of_relus,
    _rescale_relus_after_residuals,
)
from unitscale.transforms._frozen import GradScales, freeze_grads_before_batch_norm_blocks, freeze_trunk_batch_norms
from unitscale.transforms._graph import (
    _SCALED,
    _activation_path,
    _ancestors,
    _argument_name,
    _aten_neutral,
    _attr,
    _consumers,
    _function_of,
    _insert_after,
    _is_add,
    _is_float_node,
    _is_float_tensor,
    _is_mul,
    _is_scaled,
    _is_view_attribute,
    _lookup,
    _member,
    _stream,
    _trunk,
    check_replacement,
)
from unitscale.transforms._losses import share_loss_scales
from unitscale.transforms._op_rules import rewrite_by_rule
from unitscale.transforms.patterns import fold_patterns

__all__ = ["KEPT_KEY", "UnitScalePass", "unit_init_"]

#: ``node.meta`` key of an op kept as it was because it keeps unit scale as a whole (a rotary
#: embedding's products, whose sum has the std of ``x``): the reason, for the std check.
KEPT_KEY = "unitscale_kept"

_ATTENTION: set[Any] = {F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax, U.softmax}
_ATTENTION |= {U.scaled_dot_product_attention}

_TRIG: dict[Any, str] = {torch.cos: "cos", torch.Tensor.cos: "cos", torch.sin: "sin", torch.Tensor.sin: "sin"}


def _location(node: fx.Node) -> str:
    source = str(node.meta.get(SOURCE_KEY) or "")
    if source:
        return f" at {os.path.basename(source)}"
    trace = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if not found:
        return ""
    path, line = found[-1]
    return f" at {os.path.basename(path)}:{line}"


def describe(node: fx.Node) -> str:
    """``"<op> (node <name>, module <path>) at <file>:<line>"`` for reports and errors.

    The module path and source are the capture layer's normalised meta; the module part
    is left out for an op of the root module.
    """
    path = node.meta.get(MODULE_PATH_KEY) or ""
    module = f", module {path}" if path else ""
    return f"{op_name(_function_of(node), qualified=True)} (node {node.name}{module}){_location(node)}"


def _takes_constraint(fn: Callable[..., Any]) -> bool:
    try:
        return "constraint" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


_NORM_FUNCTIONS: set[Any] = {F.layer_norm, U.layer_norm, F.group_norm, F.batch_norm, F.instance_norm, F.rms_norm}
_NORM_FUNCTIONS |= {U.rms_norm, U.batch_norm}
_NORM_FUNCTIONS |= {U.layer_scale}  # a layer scale's gain starts at 1, as a norm's does


@torch.no_grad()
def unit_init_(gm: fx.GraphModule) -> None:
    """Re-initialise the parameters that feed unit-scaled ops, by the role the graph gives them.

    A parameter passed as ``bias`` or added to a tensor is zeroed; one passed as the
    ``weight`` of a norm is set to 1; every other (weights, embeddings) is drawn
    from ``N(0, 1)``. Roles come from the graph, so ``self.b1`` in a functional model is
    a bias as much as ``nn.Linear.bias`` is. A parameter that any op left unscaled reads
    (through reshapes or casts or not) keeps its values: the unscaled op was written for
    them. The running statistics of a unit-scaled batch norm are reset to mean 0 and
    variance 1, those of the unit-scaled activations that reach it. Each re-initialised
    parameter is tagged with the u-μP role :mod:`unitscale.nn`'s modules give theirs
    (``bias``, ``norm``, ``embedding``, else ``weight``: a last linear layer stays a
    ``weight``, since unit scaling does not give it u-μP's readout multiplier), so the
    unit-scaled model trains with :mod:`unitscale.optim`.

    Args:
        gm: a graph after the unit-scaling pass, reading parameters through ``get_attr``.

    >>> import torch
    >>> from torch import fx
    >>> import unitscale.functional as U
    >>> from unitscale.fx import DeepTracer
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         return U.linear(torch.tanh(self.a(x)), self.b.weight, self.b.bias)
    >>> net = Net()
    >>> kept = net.a.weight.clone()
    >>> unit_init_(fx.GraphModule(net, DeepTracer().trace(net)))
    >>> torch.equal(net.a.weight, kept), net.b.bias.abs().sum().item()
    (True, 0.0)
    """
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        param = _attr(gm, str(node.target))
        if not isinstance(param, torch.Tensor):
            continue
        consumers = _consumers(node)
        if not consumers or not all(_is_scaled(user) for user, _ in consumers):
            continue
        roles = {_argument_name(user, via) if user.target is not U.add else "bias" for user, via in consumers}
        if not isinstance(param, torch.nn.Parameter):
            if roles == {"running_mean"}:
                param.zero_()
            elif roles == {"running_var"}:
                param.fill_(1.0)
        elif any(str(role).endswith("bias") for role in roles):  # in_proj_bias of attention too
            param.zero_()
            tag(param, "bias")
        elif "weight" in roles and any(_member(user.target, _NORM_FUNCTIONS) for user, _ in consumers):
            param.fill_(1.0)
            tag(param, "norm")
        else:
            param.normal_()
            tag(param, "embedding" if all(user.target is U.embedding for user, _ in consumers) else "weight")


_DIVS: set[Any] = {operator.truediv, torch.div, torch.true_divide, torch.Tensor.div}
_DIV_METHODS = {"div", "__truediv__", "true_divide"}
# Unit-scaled ops whose output only changes by a factor, or not at all, when an input does.
_HOMOGENEOUS: set[Any] = {U.linear, U.matmul, U.addmm, U.conv2d, U.layer_norm, U.rms_norm}


def _constant_factor(node: fx.Node) -> tuple[fx.Node, float] | None:
    """``(x, c)`` if ``node`` is ``x * c``, ``c * x`` or ``x / c`` for a float tensor ``x`` and a number ``c``."""
    args = node.args[:2]
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    tensors = [a for a in args if _is_float_node(a)]
    if len(args) != 2 or len(numbers) != 1 or len(tensors) != 1 or numbers[0] == 0:
        return None
    if _is_mul(node):
        return tensors[0], float(numbers[0])  # type: ignore[return-value]
    divides = node.target in _DIV_METHODS if node.op == "call_method" else _member(node.target, _DIVS)
    if divides and args[0] is tensors[0] and not node.kwargs:
        return tensors[0], 1 / float(numbers[0])  # type: ignore[return-value]
    return None


def _drop_constant_factor(node: fx.Node) -> bool:
    """Turn ``x * c`` into ``sign(c) * x`` where unit scaling already sets the scale the constant sets.

    Three places:

    - only linear layers and norms read the product: the unit-scaled op after it sets the
      scale of its own output, so the constant (T5's ``d_model ** -0.5`` before its tied
      head, a hand-written ``/ sqrt(d)``) would only move that output off unit scale;
    - the graph's output is the product (Cohere's ``logits * 0.0625``, Granite's
      ``logits / 8``): unit scaling promises a unit-scaled output, and a constant tuned for
      the original initialisation's logits moves it off by that constant;
    - ``x`` is a unit-scaled matmul over ``d`` elements and ``c = d**-0.5`` (attention's
      ``q @ k.T * head_dim**-0.5`` written out, BotNet, LeViT): the twin already divides
      by ``d**0.5``, and dividing again would leave the softmax logits ``d**-0.5`` small.

    Elsewhere (inside an activation function written out, a softmax temperature other than
    ``d**-0.5``) the constant changes what is computed and stays, listed as unscaled.
    """
    found = _constant_factor(node)
    if found is None:
        return False
    x, factor = found
    readers = [user for user, _ in _consumers(node)]
    homogeneous = all(user.op == "call_function" and _member(user.target, _HOMOGENEOUS) for user in readers)
    output = all(user.op == "output" for user in readers)
    if not readers or not (homogeneous or output or _repeats_matmul_scale(x, factor)):
        return False
    sign = 1.0 if factor > 0 else -1.0
    node.op, node.target, node.args, node.kwargs = "call_function", U.scale, (x, sign, sign), {}
    return True


def _repeats_matmul_scale(x: fx.Node, factor: float) -> bool:
    """Whether ``x`` is a unit-scaled matmul over ``d`` elements and ``factor`` is ``d**-0.5``."""
    if not (x.op == "call_function" and x.target is U.matmul and len(x.args) >= 2):
        return False
    left = x.args[0].meta.get("example_value") if isinstance(x.args[0], fx.Node) else None
    if not isinstance(left, torch.Tensor) or left.dim() == 0:
        return False
    return abs(factor * left.shape[-1] ** 0.5 - 1) < 1e-3


def _is_product_of_activations(node: fx.Node, stream: set[fx.Node]) -> bool:
    """``a * b`` for two activations computed from the inputs (not a gain computed from a parameter)."""
    if not _is_mul(node) or len(node.args) < 2:
        return False
    a, b = node.args[0], node.args[1]
    if a is b:  # a square is not a product of independent factors
        return False
    return all(isinstance(x, fx.Node) and x in stream and _is_float_node(x) for x in (a, b))


def _meet_upstream(a: Any, b: Any, ancestors: dict[fx.Node, set[fx.Node]], stream: set[fx.Node]) -> bool:
    """Whether two activations' gradients meet again upstream (they share an op of the stream)."""
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return False
    shared = ({a} | ancestors.get(a, set())) & ({b} | ancestors.get(b, set())) & stream
    return any(_is_float_node(n) for n in shared)  # token ids carry no gradient


def _is_broadcast_product(node: fx.Node) -> bool:
    """A product of activations where one is broadcast over the other (a squeeze-excitation gate)."""
    out = node.meta.get("example_value")
    values = [a.meta.get("example_value") for a in node.args[:2] if isinstance(a, fx.Node)]
    if not isinstance(out, torch.Tensor) or len(values) != 2 or node.kwargs:
        return False
    return any(isinstance(v, torch.Tensor) and v.numel() < out.numel() for v in values)


_VMAP_ENTER, _VMAP_EXIT = "_vmap_increment_nesting", "_vmap_decrement_nesting"


def _whole_regions(graph: fx.Graph) -> dict[fx.Node, set[fx.Node]]:
    """Parts of the graph the pass leaves whole: higher-order ops and inlined ``vmap`` bodies.

    A higher-order op (``cond``, ``while_loop``, ``map``, ``scan``, ``associative_scan``,
    ``flex_attention``: a node whose target is a ``HigherOrderOperator``) runs bodies held
    as sub-graphs; TorchDynamo inlines a CPU ``associative_scan`` (Mamba's selective scan)
    into the graph as a ``vmap`` over its combine function instead, between
    ``_vmap_increment_nesting`` and ``_vmap_decrement_nesting``. Either way the body
    defines what the op computes (scaling the ``+`` of a scan's combine function changes
    the recurrence), and its ops run under transforms that unit-scaled ops, autograd
    Functions, cannot run under. Returns each region's first node with the nodes it holds.
    """
    regions: dict[fx.Node, set[fx.Node]] = {}
    depth, head = 0, None
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if name == _VMAP_ENTER:
            if depth == 0:
                head = node
                regions[head] = set()
            depth += 1
        if head is not None:
            regions[head].add(node)
        if name == _VMAP_EXIT:
            depth -= 1
            if depth == 0:
                head = None
        if head is None and isinstance(node.target, torch._ops.HigherOrderOperator) and node.target not in _KNOWN:
            regions[node] = {node}
    return regions


def _region_name(head: fx.Node) -> str:
    """``describe(head)``, with an inlined vmap named ``vmap`` rather than by its bookkeeping call."""
    text = describe(head)
    if getattr(head.target, "__name__", "") == _VMAP_ENTER:
        return "vmap" + text[text.index(" (node") :]
    return text


def _region_size(gm: fx.GraphModule, head: fx.Node, nodes: set[fx.Node]) -> int:
    """The ops a region holds: those of an inlined vmap, or those of a higher-order op's bodies."""
    bodies = [getattr(gm, str(a.target), None) for a in head.args if isinstance(a, fx.Node) and a.op == "get_attr"]
    inner = [n for b in bodies if isinstance(b, fx.GraphModule) for n in b.graph.nodes if n.op.startswith("call")]
    return len(inner) if inner else len([n for n in nodes if n.op.startswith("call")])


# Higher-order ops whose bodies the pass reads (export's grad-mode wrapper around position tables).
_KNOWN: set[Any] = {torch.ops.higher_order.wrap_with_set_grad_enabled}


def _changes_in_place(node: fx.Node) -> bool:
    """Whether ``node`` changes its first argument, a float tensor, in place (``x += 1``, ``x.mul_(2)``)."""
    return bool(node.args) and _is_float_node(node.args[0]) and changes_in_place(node)


def _follow_in_place_changes(graph: fx.Graph) -> None:
    """Make every read of a tensor after an op changed it in place read that op.

    ``skip = x; x += 1`` changes the tensor ``skip`` also names, but the graph's later
    reads of ``skip`` point at the node before the change; the pass would place a
    residual split there and give the skip the value from before it. The op returns the
    tensor it changed, so reading the op instead computes the same and puts the change
    in the graph's edges.
    """
    for node in list(graph.nodes):
        changed = node.args[0] if node.args else None
        if not (isinstance(changed, fx.Node) and _changes_in_place(node)):
            continue
        for user in list(changed.users):
            if user is not node and node < user:
                user.replace_input_with(changed, node)


def _rotary_ops(
    graph: fx.Graph, live: set[fx.Node], ancestors: dict[fx.Node, set[fx.Node]], done: set[fx.Node]
) -> dict[fx.Node, str]:
    """``x * cos + rotate_half(x) * sin`` with ``cos``/``sin`` tables off the activation path.

    Rotating pairs of features by an angle keeps their norm, so the sum has the std
    of ``x``: the two products and the add are kept as they are (an add would be
    scaled by ``2**-0.5`` as :func:`~unitscale.functional.add`).
    """
    kept: dict[fx.Node, str] = {}
    for node in graph.nodes:
        if node in done or not _is_add(node) or len(node.args) < 2:
            continue
        products = node.args[0], node.args[1]
        tables = []
        for product in products:
            if not (_is_mul(product) and len(product.args) >= 2):
                break
            args = [a for a in product.args[:2] if isinstance(a, fx.Node)]
            factors = [a for a in args if a not in live and _is_float_node(a)]
            if len(args) != 2 or len(factors) != 1:
                break
            table = factors[0]
            functions = [fn for n in ancestors[table] | {table} for fn in _functions_run_by(n)]
            tables.append({_TRIG[fn] for fn in functions if _member(fn, set(_TRIG))})
        if len(tables) == 2 and tables[0] and tables[1] and tables[0] | tables[1] == {"cos", "sin"}:
            for n in (node, *products):
                kept[n] = "rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)"
    return kept


_TANH: set[Any] = {torch.tanh, torch.Tensor.tanh, F.tanh}


def _soft_caps(graph: fx.Graph, done: set[fx.Node]) -> dict[fx.Node, str]:
    """``c * tanh(x / c)`` (Gemma 2's logit and attention soft-capping): kept as it is.

    Below ``c`` it is ``x``, so it keeps the std of a unit-scaled ``x`` (``c`` is 30 or 50);
    dropping the outer ``* c`` as a constant factor would leave ``tanh(x / c)``, ``1 / c``
    of the logits.
    """
    kept: dict[fx.Node, str] = {}
    for node in graph.nodes:
        if node in done:
            continue
        found = _constant_factor(node) if _is_mul(node) else None
        if found is None or not _member(_function_of(found[0]), _TANH) or not found[0].args:
            continue
        tanh, cap = found
        inner = tanh.args[0]
        if not isinstance(inner, fx.Node):
            continue
        divided = _constant_factor(inner)
        if divided is not None and cap > 0 and abs(divided[1] * cap - 1) < 1e-6:
            for n in (node, tanh, inner):
                kept[n] = f"soft-capping ({cap:g} * tanh(x / {cap:g}) keeps the std of x below {cap:g})"
    return kept


def _functions_run_by(node: fx.Node) -> list[Any]:
    """The node's function, and those of a higher-order op's body (export's ``wrap_with_set_grad_enabled``)."""
    functions = [_function_of(node)]
    owner = node.graph.owning_module
    for arg in node.args:
        if owner is not None and isinstance(arg, fx.Node) and arg.op == "get_attr":
            body = getattr(owner, str(arg.target), None)
            if isinstance(body, fx.GraphModule):
                functions += [_function_of(n) for n in body.graph.nodes]
    return functions


class UnitScalePass:
    """Rewrites a captured graph into its unit-scaled form (see the module docstring).

    Args:
        replace: user replacements, looked up before :data:`unitscale.functional.torch_map`.
        torch_map: the default map (torch function -> unit-scaled twin).
    """

    __name__ = "unit_scale"

    def __init__(self, replace: Mapping[Any, Callable[..., Any]], torch_map: Mapping[Any, Callable[..., Any]]) -> None:
        self.replace = dict(replace)
        self.torch_map = dict(torch_map)
        self.initialised = False
        #: the frozen gradient factors of every graph this pass rewrites (one model's)
        self.grad_scales = GradScales()

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        graph = gm.graph
        _follow_in_place_changes(graph)
        regions = _whole_regions(graph)
        frozen = {n for nodes in regions.values() for n in nodes}
        done: set[fx.Node] = set(frozen)
        for node in list(graph.nodes):
            if node in frozen:
                continue
            fn = _function_of(node)
            user_fn = _lookup(self.replace, fn) if fn is not None else None
            if user_fn is not None:
                check_replacement(node, user_fn)
                self._retarget(node, user_fn, {})
                done.add(node)
        folded = fold_patterns(graph)
        done.update(folded)
        ancestors = _ancestors(graph)
        live = _activation_path(gm)
        kept = _rotary_ops(graph, live, ancestors, done)
        kept.update(_soft_caps(graph, done))
        trunk = _trunk(graph, live)
        stream = _stream(graph, live)
        self._residual_adds(graph, ancestors, done | set(kept), stream - frozen, frozen)
        # Off the trunk an op's input gradient meets another path's upstream (a skip, a gate's
        # branch, a second output's head): its two scales must be one.
        constrained = live - trunk
        for node in folded:
            if node not in constrained and _takes_constraint(node.target):  # type: ignore[arg-type]
                node.kwargs = {**node.kwargs, "constraint": None}
        for node in list(graph.nodes):
            if node in done or node in kept or node not in live or node.op not in ("call_function", "call_method"):
                continue
            if _is_add(node):
                if len(node.args) >= 2 and _is_float_node(node.args[0]) and _is_float_node(node.args[1]):
                    # Unconstrained, a broadcast operand's gradient is scaled apart from the other's:
                    # only true where the two meet nowhere upstream (a GRU's ``out + h[-1]`` meet).
                    meet = _is_broadcast_product(node) and _meet_upstream(node.args[0], node.args[1], ancestors, stream)
                    self._retarget(node, U.add, {} if meet else {"constraint": None})
                    done.add(node)
                continue
            if _is_product_of_activations(node, stream):
                if _is_broadcast_product(node):
                    self._retarget(node, U.mul, {"constraint": "to_output_scale"})
                    node.args = tuple(node.args[:2])
                    done.add(node)
                else:
                    kept[node] = "product of two activations (unit std times unit std stays unit std)"
                continue
            if rewrite_by_rule(gm, node, stream, constrained):  # mean pools, layer scales
                done.add(node)
                continue
            twin = _lookup(self.torch_map, _function_of(node))
            if twin is None:
                continue
            extra = {"constraint": None} if node not in constrained and _takes_constraint(twin) else {}
            self._retarget(node, twin, extra)
            done.add(node)
        for node in list(graph.nodes):
            if node in live and node not in done and node not in kept and _drop_constant_factor(node):
                done.add(node)
        _constrain_before_batch_norms(graph)
        done.update(_rescale_relus_after_residuals(graph, constrained))
        done.update(_forward_scale_global_pools(graph))
        done.update(_rescale_max_pools_of_relus(graph))
        blocks = freeze_grads_before_batch_norm_blocks(gm, trunk, self.grad_scales)
        done.update(blocks)
        done.update(freeze_trunk_batch_norms(gm, trunk, self.grad_scales, len(blocks)))
        done.update(_balance_gates(gm))
        gm.meta["loss_scales"] = share_loss_scales(graph, describe)
        gm.meta["kept_ops"] = [f"{describe(n)}: {reason}" for n, reason in kept.items()]
        for n in kept:
            n.meta[KEPT_KEY] = kept[n]
        gm.meta["unscaled_ops"] = [
            describe(n)
            for n in graph.nodes
            if n in live and n not in kept and n not in frozen and self._left_unscaled(n, done)
        ]
        gm.meta["unscaled_regions"] = [
            f"{_region_name(head)}: {_region_size(gm, head, nodes)} op(s) left whole"
            for head, nodes in regions.items()
            if nodes & live
        ]
        if not self.initialised and not self.grad_scales.loaded:  # a loaded state_dict is the model's
            unit_init_(gm)
        self.initialised = True
        graph.lint()
        gm.recompile()
        return gm

    @staticmethod
    def _retarget(node: fx.Node, fn: Callable[..., Any], extra_kwargs: dict[str, Any]) -> None:
        node.op = "call_function"
        node.target = fn
        node.kwargs = {**node.kwargs, **extra_kwargs}

    def _residual_adds(
        self,
        graph: fx.Graph,
        ancestors: dict[fx.Node, set[fx.Node]],
        done: set[fx.Node],
        stream: set[fx.Node],
        frozen: set[fx.Node],
    ) -> list[fx.Node]:
        found = []
        for node in list(graph.nodes):
            if node in done or not _is_add(node) or len(node.args) < 2 or node.kwargs.get("alpha", 1) != 1:
                continue
            a, b = node.args[0], node.args[1]
            if not (isinstance(a, fx.Node) and isinstance(b, fx.Node) and _is_float_node(a) and _is_float_node(b)):
                continue
            if a in frozen or b in frozen:
                continue  # an operand inside a region left whole
            if a in ancestors[b]:
                skip, branch = a, b
            elif b in ancestors[a]:
                skip, branch = b, a
            else:
                added = self._fork_join(node, a, b, ancestors, stream)
                if added:
                    done.update({node, *added})
                    found.append(node)
                continue
            body = {n for n in ancestors[branch] | {branch} if skip in ancestors[n]}
            tau = 0.01 if any(_member(_function_of(n), _ATTENTION) for n in body) else 0.5
            value = skip.meta.get("example_value")
            split = _insert_after(skip, U.residual_split, (skip, tau), f"{skip.name}_split", node, (value, value))
            to_branch = _insert_after(split, operator.getitem, (split, 0), f"{skip.name}_residual", node, value)
            to_skip = _insert_after(to_branch, operator.getitem, (split, 1), f"{skip.name}_skip", node, value)
            for user in list(skip.users):
                if user in body:
                    user.replace_input_with(skip, to_branch)
            node.op, node.target, node.args, node.kwargs = "call_function", U.residual_add, (branch, to_skip, tau), {}
            done.update({node, split, to_branch, to_skip})
            found.append(node)
        return found

    @staticmethod
    def _fork_join(
        node: fx.Node, a: fx.Node, b: fx.Node, ancestors: dict[fx.Node, set[fx.Node]], stream: set[fx.Node]
    ) -> list[fx.Node]:
        """``a + b`` where both paths start at one fork (a projection shortcut): a residual pair there.

        ResNet's downsampling block adds ``bn2(conv2(...(x)))`` and ``downsample(x)``: neither
        operand is an ancestor of the other, but both come from ``x``, whose gradient would be
        the sum of two unit-std gradients (std ``2**0.5``) at every such block. With a
        :func:`~unitscale.functional.residual_split` at the fork (the latest common ancestor on
        the activation stream, whose every reader leads to exactly one of the two operands) and
        a :func:`~unitscale.functional.residual_add` at the join, the forward weights stay
        those of :func:`~unitscale.functional.add` (``tau = 0.5``) and the gradients meet
        weighted. Returns the nodes it added (none: the add is not such a join).
        """
        if a not in stream or b not in stream:
            return []
        common = ancestors.get(a, set()) & ancestors.get(b, set()) & stream
        # A node returning a tuple (multi-head attention with its weights, a GRU's output and
        # state) is no fork: each side reads its own element. The getitem both sides read is.
        forks = [n for n in node.graph.nodes if n in common and isinstance(n.meta.get("example_value"), torch.Tensor)]
        if not forks or not _is_float_node(forks[-1]):
            return []
        fork = forks[-1]
        sides = {}
        for user in fork.users:
            on_a = user is a or user in ancestors.get(a, set())
            on_b = user is b or user in ancestors.get(b, set())
            if on_a == on_b:
                if on_a:
                    return []
                continue
            sides[user] = 0 if on_a else 1
        if set(sides.values()) != {0, 1}:
            return []
        body_a = {n for n in ancestors.get(a, set()) | {a} if fork in ancestors.get(n, set())}
        body_b = {n for n in ancestors.get(b, set()) | {b} if fork in ancestors.get(n, set())}
        inside = body_a | body_b | {fork}
        if any(p in common and p not in inside for n in inside - {fork} for p in n.all_input_nodes):
            # a path from upstream reaches a side around the fork (attention weights times
            # the block's input): a split there would weight only part of that gradient
            return []
        attention_a = any(_member(_function_of(n), _ATTENTION) for n in body_a)
        attention_b = any(_member(_function_of(n), _ATTENTION) for n in body_b)
        # The branch is the side with attention, else the longer one; the other is the skip.
        branch_side = 0 if (attention_a, len(body_a)) >= (attention_b, len(body_b)) else 1
        tau = 0.01 if attention_a or attention_b else 0.5
        value = fork.meta.get("example_value")
        split = _insert_after(fork, U.residual_split, (fork, tau), f"{fork.name}_split", node, (value, value))
        to_branch = _insert_after(split, operator.getitem, (split, 0), f"{fork.name}_residual", node, value)
        to_skip = _insert_after(to_branch, operator.getitem, (split, 1), f"{fork.name}_skip", node, value)
        for user, side in sides.items():
            user.replace_input_with(fork, to_branch if side == branch_side else to_skip)
        branch, skip = (a, b) if branch_side == 0 else (b, a)
        node.op, node.target, node.args, node.kwargs = "call_function", U.residual_add, (branch, skip, tau), {}
        return [split, to_branch, to_skip]

    def _left_unscaled(self, node: fx.Node, done: set[fx.Node]) -> bool:
        if node in done or node.op not in ("call_function", "call_method", "call_module"):
            return False
        if not _is_float_tensor(node.meta.get("example_value")):
            return False
        fn = _function_of(node)
        if node.op == "call_method" and node.target in SCALE_NEUTRAL_METHODS or _is_view_attribute(node):
            return False
        if _member(fn, SCALE_NEUTRAL_FUNCTIONS) or _member(fn, _SCALED) or _aten_neutral(fn):
            return False
        return not (isinstance(fn, torch._ops.OpOverload) and fn.namespace == "unitscale")
