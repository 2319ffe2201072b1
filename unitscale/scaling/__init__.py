"""Unit-scaled ops (:mod:`unitscale.functional`), modules (:mod:`unitscale.nn`) and the
constraints that reconcile forward and backward scales.

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

__all__ = [
    "gmean",
    "hmean",
    "amean",
    "to_output_scale",
    "to_grad_input_scale",
    "Constraint",
    "ConstraintArg",
    "CONSTRAINTS",
]
