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
"""

from unitscale.transforms.dynamo import GraphTransform as GraphTransform
from unitscale.transforms.dynamo import TransformedModule as TransformedModule
from unitscale.transforms.passes import apply_transform as apply_transform
from unitscale.transforms.passes import simulate_format as simulate_format
from unitscale.transforms.passes import simulate_fp8 as simulate_fp8
from unitscale.transforms.passes import unit_scale as unit_scale
from unitscale.transforms.scale_check import OffScale as OffScale
from unitscale.transforms.scale_check import ScaleCheck as ScaleCheck
from unitscale.transforms.scale_check import check_scale as check_scale

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
]
