"""The ``torch.fx`` layer: tracers, execution order and graph rewrites (inline, invert).

What other rooms use beside these (the node meta keys and op tables, a module's state kept
across a trace, a plain run of one node, ...) is in this package's public modules, listed
"for other rooms" in ``unitscale/fx/README.md``.
"""

from unitscale.fx.autowrap import register_autowrap_module as register_autowrap_module
from unitscale.fx.exec_order import ExecOrder as ExecOrder
from unitscale.fx.exec_order import ExecOrderTracer as ExecOrderTracer
from unitscale.fx.exec_order import ParamUsageInfo as ParamUsageInfo
from unitscale.fx.exec_order import fx_exec_order as fx_exec_order
from unitscale.fx.inlining import inline as inline
from unitscale.fx.inversion import invert as invert
from unitscale.fx.inversion import register_inverse as register_inverse
from unitscale.fx.tracers import DeepTracer as DeepTracer
from unitscale.fx.tracers import LeafTracer as LeafTracer
from unitscale.fx.tracers import ModulePathTracer as ModulePathTracer
from unitscale.fx.tracers import TaggingTracer as TaggingTracer

__all__ = [
    "DeepTracer",
    "ModulePathTracer",
    "LeafTracer",
    "TaggingTracer",
    "register_autowrap_module",
    "ExecOrderTracer",
    "ExecOrder",
    "ParamUsageInfo",
    "fx_exec_order",
    "inline",
    "invert",
    "register_inverse",
]
