"""The ``torch.fx`` layer: tracers, execution order and graph rewrites (inline, invert).

>>> import torch
>>> from unitscale.fx import ModulePathTracer
>>> graph = ModulePathTracer().trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
>>> [n.meta.get("module_path") for n in graph.nodes if n.op == "call_module"]
['0']
"""

from unitscale.fx.autograd_functions import FunctionCall as FunctionCall
from unitscale.fx.autograd_functions import functions_applied as functions_applied
from unitscale.fx.autowrap import register_autowrap_module as register_autowrap_module
from unitscale.fx.inlining import inline as inline
from unitscale.fx.inversion import invert as invert
from unitscale.fx.inversion import register_inverse as register_inverse
from unitscale.fx.tracers import DeepTracer as DeepTracer
from unitscale.fx.tracers import ExecOrder as ExecOrder
from unitscale.fx.tracers import ExecOrderTracer as ExecOrderTracer
from unitscale.fx.tracers import LeafTracer as LeafTracer
from unitscale.fx.tracers import ModulePathTracer as ModulePathTracer
from unitscale.fx.tracers import ParamUsageInfo as ParamUsageInfo
from unitscale.fx.tracers import TaggingTracer as TaggingTracer
from unitscale.fx.tracers import fx_exec_order as fx_exec_order

__all__ = [
    "DeepTracer",
    "ModulePathTracer",
    "LeafTracer",
    "TaggingTracer",
    "ExecOrderTracer",
    "ExecOrder",
    "ParamUsageInfo",
    "fx_exec_order",
    "inline",
    "invert",
    "register_inverse",
    "register_autowrap_module",
    "FunctionCall",
    "functions_applied",
]
