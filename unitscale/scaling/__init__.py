"""What the unit-scaled ops (:mod:`unitscale.functional`), modules (:mod:`unitscale.nn`) and
optimisers (:mod:`unitscale.optim`) share: the constraints that reconcile forward and backward
scales, the u-μP parameter roles (``unitscale.scaling.parameter``), the checks of shared
arguments (``unitscale.scaling.checks``), the softmax statistics the scales come from, and the
checks that a parametrisation transfers across width (``unitscale.scaling.transfer``).

>>> from unitscale.scaling import gmean
>>> gmean(0.25, 1.0)
0.5
"""

from unitscale.scaling import constraints as constraints
from unitscale.scaling.checks import check_mult as check_mult
from unitscale.scaling.constraints import CONSTRAINTS as CONSTRAINTS
from unitscale.scaling.constraints import Constraint as Constraint
from unitscale.scaling.constraints import ConstraintArg as ConstraintArg
from unitscale.scaling.constraints import amean as amean
from unitscale.scaling.constraints import gmean as gmean
from unitscale.scaling.constraints import hmean as hmean
from unitscale.scaling.constraints import to_grad_input_scale as to_grad_input_scale
from unitscale.scaling.constraints import to_left_grad_scale as to_left_grad_scale
from unitscale.scaling.constraints import to_output_scale as to_output_scale
from unitscale.scaling.constraints import to_right_grad_scale as to_right_grad_scale
from unitscale.scaling.parameter import ROLES as ROLES
from unitscale.scaling.parameter import ParamRole as ParamRole
from unitscale.scaling.parameter import residual_taus as residual_taus
from unitscale.scaling.parameter import role_of as role_of
from unitscale.scaling.parameter import set_depth as set_depth
from unitscale.scaling.parameter import tag as tag
from unitscale.scaling.transfer import CoordCheck as CoordCheck
from unitscale.scaling.transfer import LRSweep as LRSweep
from unitscale.scaling.transfer import coord_check as coord_check
from unitscale.scaling.transfer import lr_sweep as lr_sweep

__all__ = [
    "gmean",
    "hmean",
    "amean",
    "to_output_scale",
    "to_grad_input_scale",
    "to_left_grad_scale",
    "to_right_grad_scale",
    "Constraint",
    "ConstraintArg",
    "CONSTRAINTS",
    # u-μP parameter roles
    "ROLES",
    "ParamRole",
    "tag",
    "role_of",
    "set_depth",
    "residual_taus",
    "check_mult",
    # transfer checks
    "coord_check",
    "CoordCheck",
    "lr_sweep",
    "LRSweep",
]
