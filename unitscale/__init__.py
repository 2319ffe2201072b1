"""unitscale: see and shape what happens inside PyTorch models with torch.fx.

The top level holds what a newcomer reaches for first, one verb per tool: :func:`track_scales`
(the std of every tensor, forward and backward), :func:`unit_scale` and :func:`simulate_fp8`
(unit scaling and simulated FP8 as graph transforms), :func:`partition` and
:func:`run_pipeline` (pipeline stages), :func:`inline` and :func:`invert` (graph rewrites).
Everything else lives in the part it belongs to, each a folder whose ``__init__`` is its face:

- :mod:`unitscale.capture`: one graph capture for every tool (fx, export, Dynamo, eager);
- :mod:`unitscale.fx`: tracers, execution order, inline, invert;
- :mod:`unitscale.tracking`: scale statistics, reports and the training monitor;
- :mod:`unitscale.functional` (``import unitscale.functional as U``), :mod:`unitscale.nn`,
  :mod:`unitscale.optim` and :mod:`unitscale.scaling`: unit-scaled and u-muP ops, modules,
  optimisers and constraints;
- :mod:`unitscale.transforms`: unit scaling and simulated formats as graph transforms;
- :mod:`unitscale.stages`: partition, split, pipeline;
- :mod:`unitscale.formats` and :mod:`unitscale.errors`: number formats, typed exceptions;
- :mod:`unitscale.examples`: reference models and data for the tutorials (not the library).

>>> import torch, unitscale
>>> model = unitscale.examples.MLP(8, hidden=16)
>>> report = unitscale.track_scales(model, torch.randn(4, 8))
>>> type(report).__name__
'ScaleReport'
"""

# Every part is imported as a namespace, so ``import unitscale`` is enough to reach
# ``unitscale.examples.TinyGPT`` or ``unitscale.tracking.ScaleMonitor``. The parts are not in
# ``__all__``: ``from unitscale import *`` must not shadow ``torch.nn``.
from unitscale import capture as capture
from unitscale import errors as errors
from unitscale import examples as examples
from unitscale import formats as formats
from unitscale import functional as functional
from unitscale import fx as fx
from unitscale import nn as nn
from unitscale import optim as optim
from unitscale import scaling as scaling
from unitscale import stages as stages
from unitscale import tracking as tracking
from unitscale import transforms as transforms
from unitscale.fx import inline, invert
from unitscale.stages import StagePlan, partition, run_pipeline
from unitscale.tracking import ScaleReport, analyse_module, track_scales
from unitscale.transforms import simulate_fp8, unit_scale

__all__ = [
    # see: the scale of every tensor, forward and backward
    "track_scales",
    "ScaleReport",
    "analyse_module",
    # shape: unit scaling and simulated low precision, as graph transforms
    "unit_scale",
    "simulate_fp8",
    # split: pipeline stages
    "partition",
    "StagePlan",
    "run_pipeline",
    # rewrite: torch.fx graphs
    "inline",
    "invert",
]
