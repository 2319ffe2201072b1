"""Constraints reconcile forward and backward scales; names resolve, unknown names fail clearly."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.errors import UnknownConstraintError
from unitscale.scaling.constraints import (
    CONSTRAINTS,
    amean,
    gmean,
    hmean,
    resolve_constraint,
    to_grad_input_scale,
    to_output_scale,
)

scales = st.floats(min_value=1e-4, max_value=1e4, allow_nan=False, allow_infinity=False)


def test_constraints_give_their_textbook_values():
    assert gmean(0.25, 1.0) == pytest.approx(0.5)
    assert hmean(0.25, 1.0) == pytest.approx(0.4)
    assert amean(0.25, 1.0) == pytest.approx(0.625)
    assert to_output_scale(0.25, 1.0) == 0.25
    assert to_grad_input_scale(0.25, 1.0) == 1.0


def test_constraints_take_several_grad_input_scales():
    assert gmean(1.0, 8.0, 1 / 8) == pytest.approx(1.0)
    assert amean(1.0, 2.0, 3.0) == pytest.approx(2.0)
    assert hmean(1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert to_output_scale(0.5, 2.0, 3.0) == 0.5
    assert to_grad_input_scale(0.5, 2.0, 8.0) == pytest.approx(4.0)


@settings(max_examples=50, deadline=None)
@given(output=scales, grad=scales)
def test_means_lie_between_the_scales_and_are_ordered(output, grad):
    lo, hi = min(output, grad), max(output, grad)
    h, g, a = hmean(output, grad), gmean(output, grad), amean(output, grad)
    tol = 1e-9 * hi
    assert lo - tol <= h <= g + tol <= a + 2 * tol <= hi + 3 * tol


@settings(max_examples=50, deadline=None)
@given(output=scales, grad=scales)
def test_gmean_misses_both_scales_by_the_same_factor(output, grad):
    g = gmean(output, grad)
    assert math.isclose(g / output, grad / g, rel_tol=1e-9)


def test_every_named_constraint_is_exported_from_the_scaling_package():
    import unitscale.scaling

    for name, fn in CONSTRAINTS.items():
        assert getattr(unitscale.scaling, name) is fn


def test_resolve_accepts_names_callables_and_none():
    assert resolve_constraint("hmean") is hmean
    assert resolve_constraint(None) is None

    def custom(output_scale, *grad_scales):
        return output_scale

    assert resolve_constraint(custom) is custom


def test_unknown_constraint_name_lists_the_valid_names():
    message = (
        "unknown constraint 'geomean'; use one of 'gmean', 'hmean', 'amean', 'to_output_scale', "
        "'to_grad_input_scale', 'to_left_grad_scale', 'to_right_grad_scale', "
        "a callable (output_scale, *grad_input_scales) -> float, or None"
    )
    with pytest.raises(UnknownConstraintError, match=f"^{re.escape(message)}$"):
        resolve_constraint("geomean")


def test_constraint_of_the_wrong_type_is_rejected():
    with pytest.raises(
        UnknownConstraintError, match=r"^constraint must be a name, a callable or None, not int 3; use one of 'gmean'"
    ):
        resolve_constraint(3)  # type: ignore[arg-type]


def test_unknown_constraint_error_is_a_value_error():
    with pytest.raises(ValueError):
        resolve_constraint("nope")
