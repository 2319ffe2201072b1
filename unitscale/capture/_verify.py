"""Run a captured graph once: fill in ``val`` and ``tensor_meta``, and check it computes what the model does."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from unitscale.fx.nodes import tensor_metadata
from unitscale.fx.plain_run import run_plainly

__all__ = ["GraphMismatch", "flat_graph_inputs", "kept_state", "record_and_compare", "tensor_leaves"]

RTOL, ATOL = 1e-4, 1e-5


class GraphMismatch(Exception):
    """The captured graph's outputs are not the model's (internal: becomes a route's reason)."""


@contextmanager
def kept_state(module: nn.Module, seed: int = 0) -> Iterator[None]:
    """Run under a fixed seed, then put back the RNG and every buffer: every run sees the same state."""
    saved = {name: b.detach().clone() for name, b in module.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, b in module.named_buffers():
                    if name in saved and b.shape == saved[name].shape:
                        b.copy_(saved[name])


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a (pytree) value, in flattening order."""
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def flat_graph_inputs(
    gm: fx.GraphModule, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The values of ``gm``'s placeholders, in order, for a call ``module(*args, **kwargs)``.

    >>> import torch
    >>> from unitscale.capture import capture
    >>> from unitscale.capture.toolkit import flat_graph_inputs
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> x = torch.randn(1, 2)
    >>> gm = capture(model, x, route="export").graph_module
    >>> [v is x for v in flat_graph_inputs(gm, model, (x,), {})]
    [True]
    """
    if isinstance(gm.graph._codegen, fx.graph._PyTreeCodeGen):
        # export and TorchDynamo flatten (args, kwargs) into one placeholder per leaf.
        return list(pytree.tree_leaves((tuple(args), dict(kwargs))))
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    values = list(bound.arguments.values())
    count = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    return values[:count]


class _Recorder(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        out = run_plainly(self, n)
        if n.op != "output":
            if "val" not in n.meta:
                # most nodes give one tensor: skip pytree's walk (a third of this run on a long graph)
                n.meta["val"] = (
                    torch.empty_like(out, device="meta")
                    if type(out) is torch.Tensor
                    else pytree.tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"), out)
                )
            if "tensor_meta" not in n.meta and isinstance(out, torch.Tensor):
                n.meta["tensor_meta"] = tensor_metadata(out)
        return out


def record_and_compare(
    gm: fx.GraphModule, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], expected: Any
) -> None:
    """Run ``gm`` on the example inputs, write shapes into its meta, compare with ``expected``.

    Raises:
        GraphMismatch: a different number of tensor outputs, a shape, or values beyond the tolerances.
    """
    with kept_state(module), torch.no_grad():
        got = _Recorder(gm).run(*flat_graph_inputs(gm, module, args, kwargs), enable_io_processing=False)
    want, have = tensor_leaves(expected), tensor_leaves(got)
    if len(want) != len(have):
        raise GraphMismatch(f"the graph returns {len(have)} tensors where the model returns {len(want)}")
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        if w.shape != h.shape:
            raise GraphMismatch(f"output tensor {i} has shape {tuple(h.shape)}; the model's has {tuple(w.shape)}")
        if w.is_floating_point() or w.is_complex():
            same = torch.allclose(w, h, rtol=RTOL, atol=ATOL, equal_nan=True)
        else:
            same = torch.equal(w, h)
        if not same:
            diff = (w.double() - h.double()).abs().max().item()
            raise GraphMismatch(
                f"output tensor {i} differs from the model's by up to {diff:.3g} on the example inputs "
                "(control flow that depends on tensor values, or random ops)"
            )
