"""StageReport.table() fits 88 columns by default: the largest tensors a stage sends are named, the rest counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.errors import InputError
from unitscale.stages.partitioner import StageReport, StageRow


def _report(sends: list[tuple[str, tuple[int, ...], int]]) -> StageReport:
    rows = [StageRow(0, 10, "x", "y", 5.0, 0.5, 1000, sends), StageRow(1, 10, "y", "out", 5.0, 0.5, 1000)]
    return StageReport(rows, "flops", num_microbatches=4, bubble=1 / 5)


def test_a_long_send_list_names_the_largest_first_and_keeps_the_total() -> None:
    sends = [("mask", (4, 1, 32, 32), 4096), ("cos", (1, 32, 16), 2048), ("sin", (1, 32, 16), 2048)]
    sends += [("add_8", (4, 32, 64), 32768)]
    report = _report(sends)
    full = report.table(full=True).splitlines()[1]
    assert full.endswith("mask[4, 1, 32, 32], cos[1, 32, 16], sin[1, 32, 16], add_8[4, 32, 64] (40,960 B)")
    assert len(full) > 88
    line = report.table().splitlines()[1]
    # the columns before the sends take 47 characters, so 41 are left: the largest tensor fits, two do not
    assert line.endswith("  add_8[4, 32, 64] +3 more (40,960 B)"), line
    assert len(line) <= 88


def test_a_short_send_list_is_printed_whole() -> None:
    line = _report([("act", (2, 8), 64)]).table().splitlines()[1]
    assert line.endswith("  act[2, 8] (64 B)")


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=12),
    width=st.integers(72, 120),
)
def test_any_send_list_fits_any_width_from_72(sizes: list[int], width: int) -> None:
    sends = [(f"tensor_{i}", (i + 1, 64, 64), size) for i, size in enumerate(sizes)]
    lines = _report(sends).table(width=width).splitlines()
    assert max(len(line) for line in lines[:3]) <= width
    assert f"({sum(sizes):,} B)" in lines[1]


@pytest.mark.parametrize("width", [71, 0, 88.0, "88", True])
def test_a_width_that_is_not_an_int_of_at_least_72_is_refused(width: object) -> None:
    with pytest.raises(InputError, match=r"^StageReport.table\(width="):
        _report([]).table(width=width)  # type: ignore[arg-type]
