"""Read an exported (aten-level) graph as torch functions (``F.linear``), the passes' one vocabulary.

The training IR keeps the high-level ops, so the rewrite is a table (:data:`TORCH_LEVEL`). Export's
dtype checks are dropped (as second readers they would hide patterns); an in-place op becomes
out-of-place only if nothing else reads what it overwrites and that is no buffer (a batch count).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

__all__ = ["ATEN_NEUTRAL", "TORCH_LEVEL", "to_torch_functions"]

aten = torch.ops.aten

Rewrite = Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, Any, tuple[Any, ...], dict[str, Any]]]


def _same(target: Any, op: str = "call_function") -> Rewrite:
    return lambda args, kwargs: (op, target, args, kwargs)


def _at(args: tuple[Any, ...], i: int, default: Any) -> Any:
    return args[i] if len(args) > i else default


def _options(args: tuple[Any, ...], kwargs: dict[str, Any], first: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments from aten's positional ones, ``first`` on (else its keywords, else ``defaults``)."""
    return {name: _at(args, first + i, kwargs.get(name, d)) for i, (name, d) in enumerate(defaults.items())}


def _embedding(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    options = _options(args, kwargs, 2, {"padding_idx": -1, "scale_grad_by_freq": False, "sparse": False})
    options["padding_idx"] = None if options["padding_idx"] == -1 else options["padding_idx"]
    return "call_function", F.embedding, (args[1], args[0]), options


def _batch_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, weight, bias, mean, var, training, momentum, eps = args[:8]
    return "call_function", F.batch_norm, (x, mean, var, weight, bias, training, momentum, eps), {}


def _pool(fn: Any) -> Rewrite:
    def rewrite(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        stride = _at(args, 2, kwargs.get("stride", []))
        return "call_function", fn, (args[0], args[1], stride or None, *args[3:]), {}

    return rewrite


_REDUCTIONS = ("none", "mean", "sum")  # aten's int reduction, as torch.nn.functional names it


def _cross_entropy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    defaults = {"weight": None, "reduction": 1, "ignore_index": -100, "label_smoothing": 0.0}
    options = _options(args, kwargs, 2, defaults)
    options["reduction"] = _REDUCTIONS[options["reduction"]]
    return "call_function", F.cross_entropy, (args[0], args[1]), options


def _numpy_t(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # ``x.T`` (Falcon's linear: ``x @ self.weight.T``): ``t`` for a matrix, all dims reversed beyond
    value = getattr(args[0], "meta", {}).get("val")
    dims = value.dim() if isinstance(value, torch.Tensor) else 2
    if dims <= 2:
        return "call_function", torch.t, (args[0],), {}
    return "call_function", torch.permute, (args[0], tuple(reversed(range(dims)))), {}


def _upsample(mode: str, antialias: bool = False) -> Rewrite:
    # aten.upsample_<mode>.vec(input, output_size, [align_corners,] scale_factors): F.interpolate's decomposition
    aligned = not mode.startswith("nearest")

    def rewrite(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        scales = _at(args, 3 if aligned else 2, kwargs.get("scale_factors"))
        options = {"mode": mode, "align_corners": _at(args, 2, kwargs.get("align_corners")) if aligned else None}
        size = _at(args, 1, kwargs.get("output_size"))
        return "call_function", F.interpolate, (args[0], size, scales), {**options, "antialias": antialias}

    return rewrite


#: aten overload -> how to write it as the torch function the passes know.
TORCH_LEVEL: dict[Any, Rewrite] = {
    aten.linear.default: _same(F.linear),
    aten.addmm.default: _same(torch.addmm),
    aten.matmul.default: _same(torch.matmul),
    aten.mm.default: _same(torch.mm),
    aten.bmm.default: _same(torch.bmm),
    aten.embedding.default: _embedding,
    aten.layer_norm.default: lambda a, k: (  # aten's sixth argument, cudnn_enable, is not F.layer_norm's
        "call_function", F.layer_norm, tuple(a[:5]), {n: v for n, v in k.items() if n != "cudnn_enable"}),
    aten.rms_norm.default: _same(F.rms_norm),
    aten.batch_norm.default: _batch_norm,
    aten.gelu.default: lambda a, k: ("call_function", F.gelu, (a[0],), {"approximate": k.get("approximate", "none")}),
    aten.silu.default: _same(F.silu),
    aten.relu.default: _same(F.relu), aten.relu_.default: _same(F.relu),
    aten.hardtanh.default: _same(F.hardtanh), aten.hardtanh_.default: _same(F.hardtanh),
    aten.sigmoid.default: _same(torch.sigmoid),
    aten.hardsigmoid.default: _same(F.hardsigmoid), aten.hardsigmoid_.default: _same(F.hardsigmoid),
    aten.hardswish.default: _same(F.hardswish), aten.hardswish_.default: _same(F.hardswish),
    aten.pad.default: _same(F.pad),
    aten.softmax.int: lambda a, k: (
        "call_function", F.softmax, (a[0],), {"dim": a[1], "dtype": _at(a, 2, k.get("dtype"))}),
    aten._softmax.default: lambda a, k: ("call_function", F.softmax, (a[0],), {"dim": a[1]}),
    aten.scaled_dot_product_attention.default: _same(F.scaled_dot_product_attention),
    aten.dropout.default: _same(F.dropout), aten.dropout_.default: _same(F.dropout),
    aten.cross_entropy_loss.default: _cross_entropy,
    aten.conv2d.default: _same(F.conv2d),
    aten.conv2d.padding: _same(F.conv2d),  # padding="same" or "valid"
    aten.max_pool2d.default: _pool(F.max_pool2d),
    aten.avg_pool2d.default: _pool(F.avg_pool2d),
    aten.adaptive_avg_pool2d.default: _same(F.adaptive_avg_pool2d),
    aten.upsample_nearest1d.vec: _upsample("nearest"), aten.upsample_nearest2d.vec: _upsample("nearest"),
    aten.upsample_nearest3d.vec: _upsample("nearest"), aten._upsample_nearest_exact1d.vec: _upsample("nearest-exact"),
    aten._upsample_nearest_exact2d.vec: _upsample("nearest-exact"),
    aten._upsample_nearest_exact3d.vec: _upsample("nearest-exact"),
    aten.upsample_linear1d.vec: _upsample("linear"), aten.upsample_bilinear2d.vec: _upsample("bilinear"),
    aten.upsample_trilinear3d.vec: _upsample("trilinear"), aten.upsample_bicubic2d.vec: _upsample("bicubic"),
    aten._upsample_bilinear2d_aa.vec: _upsample("bilinear", antialias=True),
    aten._upsample_bicubic2d_aa.vec: _upsample("bicubic", antialias=True),
    aten.add.Tensor: _same(torch.add), aten.add_.Tensor: _same(torch.add),
    aten.mul.Tensor: _same(torch.mul),
    aten.div.Tensor: _same(torch.div),
    aten.div_.Tensor: _same("div_", "call_method"),
    # stochastic depth's keep mask, ``new_empty(shape).bernoulli_(q).div_(q)``: aten leaves out q = 0.5
    aten.bernoulli_.float: lambda a, k: ("call_method", "bernoulli_", (a[0], _at(a, 1, k.get("p", 0.5))), {}),
    aten.bernoulli.p: _same(torch.bernoulli),
    aten.pow.Tensor_Scalar: _same(torch.pow),
    aten.mean.dim: lambda a, k: (
        "call_function", torch.mean, tuple(a[:2]), {"keepdim": _at(a, 2, k.get("keepdim", False))}),
    aten.rsqrt.default: _same(torch.rsqrt),
    aten.tanh.default: _same(torch.tanh),
    aten.cos.default: _same(torch.cos),
    aten.sin.default: _same(torch.sin),
    aten.neg.default: _same(torch.neg),
    aten.cat.default: _same(torch.cat),
    aten.view.default: _same("view", "call_method"),
    aten.reshape.default: _same(torch.reshape),
    aten.transpose.int: _same(torch.transpose),
    aten.permute.default: _same(torch.permute),
    aten.unsqueeze.default: _same(torch.unsqueeze),
    aten.squeeze.dim: _same(torch.squeeze),
    aten.flatten.using_ints: _same(torch.flatten),
    aten.t.default: _same(torch.t),
    aten.numpy_T.default: _numpy_t,
    aten.select.int: _same(torch.select),
    aten.split.Tensor: _same(torch.split),
    aten.clone.default: _same(torch.clone),
    aten.expand.default: _same("expand", "call_method"),
    aten.contiguous.default: _same("contiguous", "call_method"),
    aten.to.dtype: _same("to", "call_method"),
    aten.lstm.input: _same(torch.lstm), aten.gru.input: _same(torch.gru),
    aten.rnn_tanh.input: _same(torch.rnn_tanh), aten.rnn_relu.input: _same(torch.rnn_relu),
}  # fmt: skip

_IN_PLACE = {aten.relu_.default, aten.hardtanh_.default, aten.add_.Tensor, aten.hardsigmoid_.default}
_IN_PLACE |= {aten.hardswish_.default, aten.dropout_.default}

#: aten ops left as they are that only move, select or cast data: scale-neutral.
ATEN_NEUTRAL: frozenset[Any] = frozenset(
    {aten.slice.Tensor, aten.to.dtype_layout, aten._to_copy.default, aten.alias.default, aten.detach.default}
    | {aten.index.Tensor, aten.gather.default, aten.where.self, aten.squeeze.default, aten.unbind.int}
    | {aten.chunk.default, aten.split_with_sizes.default, aten.narrow.default, aten.lift_fresh_copy.default}
    | {aten.constant_pad_nd.default, aten.zeros.default}  # zeros: an RNN's h_0 where none is passed
    | {aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar, aten.masked_fill.Scalar}
    # the aten spellings of SCALE_NEUTRAL_FUNCTIONS' torch.stack, roll, flip, repeat, masked_fill
    | {aten.stack.default, aten.roll.default, aten.flip.default, aten.repeat.default, aten.masked_fill.Tensor}
)

_CHECKS = {aten._assert_tensor_metadata.default}


def to_torch_functions(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite ``gm``'s aten ops of :data:`TORCH_LEVEL` into torch functions, in place; returns ``gm``.

    Node names, meta (module path, source, example values) and users are kept.

    >>> import torch
    >>> from unitscale.transforms.aten import to_torch_functions
    >>> ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()), (torch.randn(1, 2),))
    >>> gm = to_torch_functions(ep.module())
    >>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"]
    ['linear', 'gelu']
    """
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, fx.GraphModule):
                to_torch_functions(sub)
            continue
        if node.op != "call_function":
            continue
        if node.target in _CHECKS and not node.users:
            gm.graph.erase_node(node)
            continue
        try:
            rewrite = TORCH_LEVEL.get(node.target)
        except TypeError:  # an unhashable target
            continue
        overwritten = node.args[0] if node.target in _IN_PLACE else None
        shared = isinstance(overwritten, fx.Node) and (len(overwritten.users) > 1 or overwritten.op == "get_attr")
        if rewrite is None or shared:  # an in-place op whose tensor is read again, or a buffer, stays
            continue
        node.op, node.target, node.args, node.kwargs = rewrite(tuple(node.args), dict(node.kwargs))
    gm.graph.lint()
    gm.recompile()
    return gm
