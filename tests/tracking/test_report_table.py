"""ScaleReport.table() fits a code block (88 columns) by default, and prints everything on request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.real_models import gpt2
from unitscale import ScaleReport, track_scales
from unitscale.errors import InputError
from unitscale.tracking import ScaleRow


def _columns(header: str, line: str) -> list[str]:
    """The cells of ``line`` under the node, module and op headings of ``header``."""
    starts = [header.index(name) for name in ("node", "module", "op ", "shape")]
    return [line[a:b].strip() for a, b in zip(starts, starts[1:], strict=False)]


def test_a_transformers_gpt2_report_fits_88_columns_and_keeps_the_end_of_every_name() -> None:
    model, inputs = gpt2(n_layer=1)
    report = track_scales(model, *inputs)
    full = report.table(full=True).splitlines()
    assert max(map(len, full)) > 120, "the test needs a report wider than the default"
    assert full[0].split()[4] == "dtype"
    lines = report.table().splitlines()
    assert max(map(len, lines)) <= 88
    assert "dtype" not in lines[0]  # every tensor is float32
    assert len(lines) == len(report) + 1
    shortened = 0
    for line, row in zip(lines[1:], report, strict=True):
        printed_names = _columns(lines[0], line)
        for printed, name in zip(printed_names, (row.node, row.module_path, row.op), strict=True):
            if printed != name:
                assert printed.startswith("…") and name.endswith(printed[1:]), (printed, name)
                shortened += 1
    assert shortened > 0


def test_a_long_path_is_cut_from_the_left_to_the_width_asked_for() -> None:
    rows = [
        ScaleRow("linear", "encoder.layers.11.attention.output.dense", "linear", (2, 8), "float32", 1.0, 0.5, 3.0),
        ScaleRow("x", "", "input", (2, 8), "float32", 1.0, 0.25, 2.0),
    ]
    lines = ScaleReport(rows, "Net").table(width=66).splitlines()
    # node 6, op 6, shape 6, three numbers of 7, six gaps of 2: 51, so the module path gets 15
    assert lines == [
        "node    module           op      shape   fwd std  bwd std  abs max",
        "linear  …n.output.dense  linear  (2, 8)  1        0.5      3",
        "x                        input   (2, 8)  1        0.25     2",
    ]


def test_dtype_is_shown_when_the_rows_differ() -> None:
    rows = [
        ScaleRow("x", "", "input", (2,), "float32", 1.0, 1.0, 1.0),
        ScaleRow("h", "fc", "to", (2,), "bfloat16", 1.0, 1.0, 1.0),
    ]
    assert ScaleReport(rows, "Net").table().splitlines()[0].split()[4] == "dtype"


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(st.text(alphabet="abcdefgh._0123", min_size=1, max_size=60), min_size=1, max_size=6),
    width=st.integers(70, 120),
)
def test_any_names_fit_any_width_from_70(names: list[str], width: int) -> None:
    rows = [ScaleRow(n, n, n, (2, 3), "float32", 1.0, 2.0, 3.0) for n in names]
    lines = ScaleReport(rows, "Net").table(width=width).splitlines()
    assert max(map(len, lines)) <= width


@pytest.mark.parametrize("width", [39, 0, -5, 88.0, "88", True, None])
def test_a_width_that_is_not_an_int_of_at_least_40_is_refused(width: object) -> None:
    report = ScaleReport([ScaleRow("x", "", "input", (2,), "float32", 1.0, 1.0, 1.0)], "Net")
    with pytest.raises(InputError, match=r"^ScaleReport.table\(width="):
        report.table(width=width)  # type: ignore[arg-type]
