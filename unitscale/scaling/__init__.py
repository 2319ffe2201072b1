"""Unit-scaled ops (:mod:`unitscale.functional`), modules (:mod:`unitscale.nn`), the
constraints that reconcile forward and backward scales, u-μP (``unitscale.scaling.umup``:
parameter roles, ops with multipliers, modules; learning rates in :mod:`unitscale.optim`) and
the checks that a parametrisation transfers across width (``unitscale.scaling.transfer``).

>>> import torch
>>> from unitscale.scaling import functional as U
>>> round(U.linear(torch.randn(256, 512), torch.randn(128, 512), constraint=None).std().item(), 1)
1.0
"""

from unitscale.scaling import constraints as constraints
from unitscale.scaling import functional as functional
from unitscale.scaling import nn as nn
from unitscale.scaling.constraints import CONSTRAINTS as CONSTRAINTS
from unitscale.scaling.constraints import Constraint as Constraint
from unitscale.scaling.constraints import ConstraintArg as ConstraintArg
from unitscale.scaling.constraints import amean as amean
from unitscale.scaling.constraints import gmean as gmean
from unitscale.scaling.constraints import hmean as hmean
from unitscale.scaling.constraints import to_grad_input_scale as to_grad_input_scale
from unitscale.scaling.constraints import to_output_scale as to_output_scale
from unitscale.scaling.transfer import CoordCheck as CoordCheck
from unitscale.scaling.transfer import LRSweep as LRSweep
from unitscale.scaling.transfer import coord_check as coord_check
from unitscale.scaling.transfer import lr_sweep as lr_sweep
from unitscale.scaling.umup import ROLES as ROLES
from unitscale.scaling.umup import LinearReadout as LinearReadout
from unitscale.scaling.umup import ParamRole as ParamRole
from unitscale.scaling.umup import SwiGLU as SwiGLU
from unitscale.scaling.umup import check_mult as check_mult
from unitscale.scaling.umup import linear_readout as linear_readout
from unitscale.scaling.umup import residual_taus as residual_taus
from unitscale.scaling.umup import role_of as role_of
from unitscale.scaling.umup import set_depth as set_depth
from unitscale.scaling.umup import silu_glu as silu_glu
from unitscale.scaling.umup import tag as tag

__all__ = [
    "gmean",
    "hmean",
    "amean",
    "to_output_scale",
    "to_grad_input_scale",
    "Constraint",
    "ConstraintArg",
    "CONSTRAINTS",
    # u-μP (the modules whose names mirror unitscale.nn's live in unitscale.scaling.umup)
    "ROLES",
    "ParamRole",
    "tag",
    "role_of",
    "set_depth",
    "residual_taus",
    "check_mult",
    "silu_glu",
    "linear_readout",
    "LinearReadout",
    "SwiGLU",
    # transfer checks
    "coord_check",
    "CoordCheck",
    "lr_sweep",
    "LRSweep",
]
