"""One node of an :class:`torch.fx.Interpreter`, run without the per-node bookkeeping (a third of a big run)."""

from __future__ import annotations

from typing import Any

from torch import fx

__all__ = ["run_plainly"]


def run_plainly(interpreter: fx.Interpreter, n: fx.Node) -> Any:
    """What ``interpreter.run_node(n)`` returns, for overrides that only run the graph (no tracing under it).

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.fx.plain_run import run_plainly
    >>> class Plain(fx.Interpreter):
    ...     def run_node(self, n):
    ...         return run_plainly(self, n)
    >>> Plain(fx.symbolic_trace(torch.nn.ReLU())).run(torch.tensor([-1.0, 2.0]))
    tensor([0., 2.])
    """
    load = interpreter.env.__getitem__
    return getattr(interpreter, n.op)(n.target, fx.node.map_arg(n.args, load), fx.node.map_arg(n.kwargs, load))
