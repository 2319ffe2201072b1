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
from unitscale.scaling.checks import check_mult
from unitscale.scaling.constraints import (
    CONSTRAINTS,
    Constraint,
    ConstraintArg,
    amean,
    gmean,
    hmean,
    to_grad_input_scale,
    to_left_grad_scale,
    to_output_scale,
    to_right_grad_scale,
)
from unitscale.scaling.parameter import ROLES, ParamRole, residual_taus, role_of, set_depth, tag
from unitscale.scaling.transfer import CoordCheck, LRSweep, coord_check, lr_sweep

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
