"""ScaleReport in a notebook: HTML tables with every value, key columns first."""

from __future__ import annotations

import torch

from tests.tracking.test_history_html import table_cells
from unitscale import track_scales
from unitscale.examples import MLP


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def test_a_reports_html_table_puts_the_stds_first_and_holds_every_row() -> None:
    torch.manual_seed(0)
    report = track_scales(MLP(8, 16), torch.randn(4, 8))
    header, *rows = table_cells(report._repr_html_())
    assert header[0] == ("node", "op · module · shape · dtype")
    assert [h for h, _ in header[1:]] == ["fwd std", "bwd std", "abs max"]
    assert len(rows) == len(report)
    for (name, *numbers), tensor in zip(rows, report, strict=True):
        where = " · ".join(p for p in (tensor.op, tensor.module_path, str(tensor.shape), tensor.dtype) if p)
        assert name == (tensor.node, where)
        assert [n for n, _ in numbers] == [_num(tensor.forward), _num(tensor.backward), _num(tensor.abs_max)]
    assert 'class="unitscale-table"' in report._repr_html_() and "overflow-x: auto" in report._repr_html_()


def test_a_reports_html_holds_the_text_tables_numbers() -> None:
    torch.manual_seed(0)
    report = track_scales(MLP(8, 16), torch.randn(4, 8))
    text = [line.split()[-3:] for line in report.table().splitlines()[1:]]
    rows = table_cells(report._repr_html_())[1:]
    assert [[n for n, _ in row[1:]] for row in rows] == text


def test_names_are_escaped_in_the_html_table() -> None:
    from unitscale import ScaleReport
    from unitscale.tracking import ScaleRow

    report = ScaleReport([ScaleRow("<b>x</b>", "a&b", "input", (2,), "float32", 1.0, 0.5)], "Net<1>")
    markup = report._repr_html_()
    assert "<b>" not in markup and table_cells(markup)[1][0] == ("<b>x</b>", "input · a&b · (2,) · float32")
