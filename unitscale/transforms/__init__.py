"""Graph transforms over the capture layer's graphs: unit scaling and simulated number formats.

Captured lazily with TorchDynamo on the first call, or at once by :func:`unitscale.capture.capture`'s
routes with ``example_inputs=``. They nest: ``simulate_fp8(unit_scale(model))`` captures once and
runs both. ``unit_scale`` is an ordered list of named rules over one :class:`PassState`
(:func:`register_rule` adds one of yours), and measures the std along each graph it makes
(:class:`ScaleCheck`, :class:`OffScale`).

>>> import torch
>>> from unitscale.transforms import unit_scale
>>> model = unit_scale(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()))
>>> round(model(torch.randn(512, 64)).std().item(), 1)
1.0
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
