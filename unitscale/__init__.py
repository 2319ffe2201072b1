"""unitscale: see and shape what happens inside PyTorch models with torch.fx.

The package is in parts, each a folder: :mod:`unitscale.capture` (one graph capture for every
tool: fx, export, Dynamo, eager; ``from unitscale.capture import capture``, since the function
would shadow its package), :mod:`unitscale.fx` (tracers, execution order,
inline, invert), :mod:`unitscale.tracking` (scale statistics and reports),
:mod:`unitscale.scaling` (unit-scaled ops, modules, constraints), :mod:`unitscale.transforms`
(unit scaling and simulated formats as graph transforms), :mod:`unitscale.stages` (partition,
split, pipeline) and :mod:`unitscale.examples` (reference models and data, not the library).
"""

from unitscale import functional as functional
from unitscale import nn as nn
from unitscale.capture import trace_exec_order
from unitscale.errors import NotInvertibleError
from unitscale.examples import MLP, MarkovSource, TinyGPT, resnet18
from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FPFormat
from unitscale.fx import (
    DeepTracer,
    ExecOrder,
    ExecOrderTracer,
    LeafTracer,
    ModulePathTracer,
    TaggingTracer,
    inline,
    invert,
    register_inverse,
)
from unitscale.scaling import amean, gmean, hmean, to_grad_input_scale, to_output_scale
from unitscale.stages import StagePlan, partition, run_pipeline
from unitscale.tracking import (
    ScaleMonitor,
    ScalePair,
    ScaleReport,
    ScaleTracker,
    ScaleTrackingInterpreter,
    analyse_module,
    track_scales,
)
from unitscale.transforms import apply_transform, simulate_format, simulate_fp8, unit_scale

# Submodules used as namespaces (``import unitscale.functional as U``, ``from unitscale import nn as unn``)
# are imported but not in __all__: their op names mirror torch's, and ``from unitscale import *``
# must not shadow ``torch.nn``.
__all__ = [
    # models
    "MLP",
    "TinyGPT",
    "resnet18",
    # tracers
    "DeepTracer",
    "ModulePathTracer",
    "LeafTracer",
    "TaggingTracer",
    "ExecOrderTracer",
    "ExecOrder",
    "trace_exec_order",
    # rewrite
    "inline",
    "invert",
    "register_inverse",
    "NotInvertibleError",
    # scale
    "ScalePair",
    "ScaleTracker",
    # stages
    "partition",
    "StagePlan",
    "run_pipeline",
    # analysis
    "ScaleTrackingInterpreter",
    "analyse_module",
    "track_scales",
    "ScaleReport",
    # constraints
    "gmean",
    "hmean",
    "amean",
    "to_output_scale",
    "to_grad_input_scale",
    # formats
    "FPFormat",
    "FP8_E4M3",
    "FP8_E5M2",
    "FP16",
    "BF16",
    # transforms
    "unit_scale",
    "simulate_format",
    "simulate_fp8",
    "apply_transform",
    # data
    "MarkovSource",
    # monitor
    "ScaleMonitor",
]
