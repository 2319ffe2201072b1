"""Graph transforms over the capture layer's graphs: unit scaling and simulated number formats.

``unit_scale`` measures the std along each graph it makes (:class:`ScaleCheck`), and names
the ops that move a model off unit scale (:class:`OffScale`).

Captured lazily with TorchDynamo on the first call, or at once by
:func:`unitscale.capture.capture`'s routes with ``example_inputs=``. They nest:
``simulate_fp8(unit_scale(model))`` captures once and runs both.

>>> import torch
>>> from unitscale.transforms import unit_scale
>>> model = unit_scale(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()))
>>> round(model(torch.randn(512, 64)).std().item(), 1)
1.0

``unit_scale`` is an ordered list of named rules over one :class:`PassState`, run in
order; :func:`register_rule` adds one of yours, :func:`unregister_rule` takes it out:

>>> from unitscale.transforms import rule_names
>>> rule_names()[-3:]
['freeze_trunk_batch_norms', 'balance_gates', 'share_loss_scales']
"""

from unitscale.transforms.pass_state import PassState
from unitscale.transforms.passes import apply_transform, simulate_format, simulate_fp8, unit_scale
from unitscale.transforms.rules import register_rule, rule_names, unregister_rule
from unitscale.transforms.scale_check import OffScale, ScaleCheck, check_scale
from unitscale.transforms.transformed_module import GraphTransform, TransformedModule

__all__ = [
    "GraphTransform",
    "TransformedModule",
    "apply_transform",
    "simulate_format",
    "simulate_fp8",
    "unit_scale",
    "ScaleCheck",
    "OffScale",
    "check_scale",
    "register_rule",
    "unregister_rule",
    "rule_names",
    "PassState",
]
