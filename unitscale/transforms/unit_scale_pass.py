"""The graph pass behind :func:`unitscale.unit_scale`: the loop over :mod:`unitscale.transforms.rules`' list.

After the rules it lists in ``graph_module.meta`` what it kept (``"kept_ops"``), left whole
(``"unscaled_regions"``) and left as it was on the activation path (``"unscaled_ops"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import unitscale.functional as U
from unitscale.fx.nodes import SCALE_NEUTRAL_FUNCTIONS
from unitscale.scaling.parameter import tag
from unitscale.transforms import rules
from unitscale.transforms._frozen import GradScales
from unitscale.transforms._graph import (
    _argument_name,
    _attr,
    _consumers,
    _function_of,
    _is_float_tensor,
    _is_neutral,
    _is_scaled,
    _member,
    describe,
)
from unitscale.transforms._kept import region_lines

__all__ = ["KEPT_KEY", "UnitScalePass", "describe", "unit_init_"]

#: ``node.meta`` key of an op kept as it was because it keeps unit scale as a whole: the reason.
KEPT_KEY = "unitscale_kept"


_NORM_FUNCTIONS: set[Any] = {F.layer_norm, U.layer_norm, F.group_norm, F.batch_norm, F.instance_norm, F.rms_norm}
_NORM_FUNCTIONS |= {U.rms_norm, U.batch_norm, U.layer_scale}  # a layer scale's gain starts at 1, as a norm's


@torch.no_grad()
def unit_init_(gm: fx.GraphModule) -> None:
    """Re-initialise the parameters that feed unit-scaled ops, by the role the graph gives them.

    A parameter passed as ``bias`` or added to a tensor is zeroed, the ``weight`` of a norm set
    to 1, every other drawn from ``N(0, 1)``; one that an op left unscaled reads keeps its values.
    A unit-scaled batch norm's running statistics are reset to mean 0 and variance 1, its count
    of batches to 0. Each is tagged with its u-μP role (``bias``, ``norm``, ``embedding``, else
    ``weight``, a last linear layer too), so the model trains with :mod:`unitscale.optim`.

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
                owner = str(node.target).rpartition(".")[0]
                count = getattr(_attr(gm, owner) if owner else gm, "num_batches_tracked", None)
                if isinstance(count, torch.Tensor):  # no batch seen: U.batch_norm's warm-up starts again
                    count.zero_()
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


class UnitScalePass:
    """Rewrites a captured graph into its unit-scaled form: each rule of the list as it was when made, in order.

    On a model's first graph it then re-initialises the parameters (:func:`unit_init_`).
    """

    __name__ = "unit_scale"

    def __init__(self, replace: Mapping[Any, Callable[..., Any]], torch_map: Mapping[Any, Callable[..., Any]]) -> None:
        self.replace = dict(replace)
        self.torch_map = dict(torch_map)
        self.rules = rules.rules()
        self.initialised = False
        #: the frozen gradient factors of every graph this pass rewrites (one model's)
        self.grad_scales = GradScales()

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        state = rules.PassState(gm, self.replace, self.torch_map, self.grad_scales)
        for rule in self.rules:
            rule.fn(state)
        kept = state.kept
        gm.meta["kept_ops"] = [f"{describe(n)}: {reason}" for n, reason in kept.items()]
        for n in kept:
            n.meta[KEPT_KEY] = kept[n]
        gm.meta["unscaled_ops"] = [
            describe(n)
            for n in gm.graph.nodes
            if n in state.live and n not in kept and n not in state.frozen and self._left_unscaled(n, state.done)
        ]
        gm.meta["unscaled_regions"] = region_lines(state)
        if not self.initialised and not self.grad_scales.loaded:  # a loaded state_dict is the model's
            unit_init_(gm)
        self.initialised = True
        gm.graph.lint()
        gm.recompile()
        return gm

    def _left_unscaled(self, node: fx.Node, done: set[fx.Node]) -> bool:
        if node in done or node.op not in ("call_function", "call_method", "call_module"):
            return False
        if not _is_float_tensor(node.meta.get("example_value")):
            return False
        # a method's function (``torch.Tensor.flatten``) may be scale-neutral under its function's name
        return not (_is_neutral(node) or _is_scaled(node) or _member(_function_of(node), SCALE_NEUTRAL_FUNCTIONS))
