"""A stage report in a notebook: the HTML holds the text table's rows and numbers, key columns first."""

from __future__ import annotations

import html

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tracking.test_history_html import table_cells
from unitscale import partition
from unitscale.examples import TinyGPT
from unitscale.stages.partitioner import StageReport, StageRow


def test_a_stage_reports_html_holds_the_text_tables_rows_and_numbers() -> None:
    """Every stage of a real plan, number by number against ``table(full=True)`` (the text
    names every tensor sent, as the HTML does): stage, then cost and share, then the sends."""
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=4, n_heads=2, seq_len=8)
    plan = partition(model, 3, torch.randint(0, 16, (2, 8)), boundary_depth=2)
    report = plan.report(num_microbatches=4)
    header, *rows = table_cells(report._repr_html_())
    text = report.table(full=True).splitlines()
    assert header == [("stage", "nodes · params"), ("cost (params)", ""), ("share", ""), ("sends", "")]
    assert len(rows) == plan.num_stages == len(text) - 2
    assert any(r.sends for r in report.rows)
    for ((stage, under), *cells), line in zip(rows, text[1:], strict=False):
        at = text[0].index("sends")  # the text's last column, which names hold spaces in
        t_stage, t_nodes, t_cost, t_share, t_params = line[:at].split()
        t_sends = line[at:]
        assert (stage, under) == (t_stage, f"{t_nodes} · {t_params}")
        assert [c for c, _ in cells] == [t_cost, t_share, t_sends]
    assert text[-1].startswith("bubble with 4 microbatches") and html.escape(text[-1]) in report._repr_html_()
    assert html.escape(repr(plan)) in plan._repr_html_()


@settings(max_examples=30, deadline=None)
@given(
    names=st.lists(st.text("ab_.<&>\"'[] ,", min_size=1, max_size=8), min_size=1, max_size=4, unique=True),
    cost=st.floats(1e-30, 1e30),
)
def test_any_tensor_name_a_stage_sends_comes_back_whole_and_escaped(names: list[str], cost: float) -> None:
    sends = [(n, (2, i + 1), 8 * (i + 1)) for i, n in enumerate(names)]
    rows = [StageRow(0, 5, "<x>", "&y", cost, 0.5, 10, sends), StageRow(1, 5, "&y", "<z>", cost, 0.5, 10)]
    report = StageReport(rows, "flops<&>", num_microbatches=2, bubble=1 / 3)
    markup = report._repr_html_()
    assert "<&" not in markup and "&>" not in markup
    header, first, _ = table_cells(markup)
    assert header[1] == ("cost (flops<&>)", "")
    header_line, line = report.table(full=True).splitlines()[:2]
    sent = line[header_line.index("sends") :]
    assert [c for c, _ in first[1:]] == [f"{cost:.4g}", "50.0%", sent]
    assert sent == ", ".join(f"{n}{list(s)}" for n, s, _ in sends) + f" ({sum(b for *_, b in sends):,} B)"
