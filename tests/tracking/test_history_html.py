"""A monitor's tables in a notebook: the HTML holds the text table's rows and numbers, name first."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale.tracking import MonitorRecord, ScaleHistory, ScaleMonitor


class _Cells(HTMLParser):
    """The cells of a table as (name, small line) for a cell with one, else its text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str]]] = []
        self.cell: list[str] | None = None
        self.small = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ["", ""]
        elif tag == "small":
            self.small = True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append((self.cell[0], self.cell[1]))
            self.cell = None
        elif tag == "small":
            self.small = False

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell[self.small] += data


def table_cells(markup: str) -> list[list[tuple[str, str]]]:
    """The header row, then the body rows, of the one table in ``markup``."""
    parser = _Cells()
    parser.feed(markup)
    return parser.rows


def text_rows(text: str) -> list[list[str]]:
    """The cells of a text table (columns two spaces apart), its header left out."""
    return [line.split() for line in text.splitlines()[1:]]


def _trained_monitor() -> ScaleMonitor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with ScaleMonitor(model, every=2) as monitor:
        for _ in range(5):
            with monitor.step():
                model(torch.randn(32, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return monitor


def test_a_historys_html_holds_the_text_tables_rows_and_numbers() -> None:
    monitor = _trained_monitor()
    view = monitor.history.where(step=4, direction="bwd")
    header, *rows = table_cells(view._repr_html_())
    text = text_rows(monitor.table(step=4, direction="bwd"))
    assert header[0] == ("tensor", "kind · dir · step")
    assert [h for h, _ in header[1:]] == ["std", "absmax", "underflow", "overflow", "sqnr dB"]
    assert len(rows) == len(text) == len(monitor.history.select(step=4, direction="bwd")) > 0
    for (name, *numbers), (step, tensor, kind, direction, *values) in zip(rows, text, strict=True):
        assert name == (tensor, f"{kind} · {direction} · {step}")
        assert [n for n, _ in numbers] == values


def test_a_drift_tables_html_holds_the_text_tables_rows_and_numbers() -> None:
    drifted = _trained_monitor().drifted(top=5)
    header, *rows = table_cells(drifted._repr_html_())
    text = text_rows(drifted.table())
    assert [h for h, _ in header] == ["tensor", "first std", "last std", "octaves"]
    assert len(rows) == len(text) == len(drifted) > 0
    for (name, *numbers), (tensor, kind, direction, steps, *values) in zip(rows, text, strict=True):
        assert name == (tensor, f"{kind} · {direction} · {steps.replace('-', '–')}")
        assert [n for n, _ in numbers] == values


@settings(max_examples=30, deadline=None)
@given(
    names=st.lists(st.text("ab.<&>_", min_size=1, max_size=8), min_size=1, max_size=5, unique=True),
    std=st.floats(1e-30, 1e30),
)
def test_any_tensor_name_comes_back_whole_and_escaped(names: list[str], std: float) -> None:
    history = ScaleHistory([MonitorRecord(0, n, "activation", "fwd", std, std, 0.0, 0.0, 9.0) for n in names])
    markup = history._repr_html_()
    assert "<&" not in markup
    assert [row[0][0] for row in table_cells(markup)[1:]] == names
    assert {row[1][0] for row in table_cells(markup)[1:]} == {f"{std:.3g}"}


def test_a_long_history_shows_its_first_200_records_and_says_so() -> None:
    history = ScaleHistory([MonitorRecord(s, "fc", "activation", "fwd", 1.0, 1.0, 0.0, 0.0, 9.0) for s in range(250)])
    markup = history._repr_html_()
    assert len(table_cells(markup)) == 1 + 200
    assert "the first 200 of 250" in markup


@pytest.mark.parametrize("selection", [{"step": 0}, {"kind": "parameter"}, {"direction": "fwd"}])
def test_where_keeps_the_records_select_gives_and_the_formats(selection: dict) -> None:
    history = _trained_monitor().history
    view = history.where(**selection)
    assert view.records == history.select(**selection)
    assert (view.fwd_format, view.bwd_format) == (history.fwd_format, history.bwd_format)


def _two_step_history() -> ScaleHistory:
    return ScaleHistory(
        [
            MonitorRecord(s, "fc", k, d, 1.0, 1.0, 0.0, 0.0, 9.0)
            for s in (0, 10)
            for k in ("activation", "parameter")
            for d in ("fwd", "bwd")
        ]
    )


@pytest.mark.parametrize("call", ["select", "where", "table"])
@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"kind": "activations"}, r"kind='activations' is not known; pass one of \('activation', 'parameter', None\)"),
        ({"direction": "forward"}, r"direction='forward' is not known; pass one of \('fwd', 'bwd', None\)"),
        ({"step": 5}, r"step=5 was not recorded; pass one of the recorded steps \[0, 10\]"),
    ],
)
def test_a_selection_that_matches_nothing_by_mistake_raises_naming_the_call(
    call: str, selection: dict, message: str
) -> None:
    # A misspelt kind or direction, or a step between two recorded ones, used to select nothing, silently.
    from unitscale.errors import InputError

    history = _two_step_history()
    with pytest.raises(InputError, match=rf"^{call}: {message}"):
        getattr(history, call)(**selection)
    assert len(history.select(step=10, kind="parameter", direction="bwd")) == 1


def test_tensors_of_an_unknown_kind_raise() -> None:
    from unitscale.errors import InputError

    with pytest.raises(InputError, match=r"^tensors: kind='weights' is not known"):
        _two_step_history().tensors("weights")


@pytest.mark.parametrize("call", ["drifted", "heatmap"])
@pytest.mark.parametrize("selection", [{"kind": "weights"}, {"direction": "forward"}])
def test_drifted_and_heatmap_refuse_a_bad_selection_before_saying_nothing_was_recorded(
    call: str, selection: dict
) -> None:
    # The errors name the call the user made (not select, which checks them), in the order stat, kind, direction.
    from unitscale.errors import InputError, UnknownStatError

    name, value = next(iter(selection.items()))
    with pytest.raises(InputError, match=rf"^{call}: {name}={value!r} is not known"):
        getattr(ScaleHistory(), call)(**selection)
    with pytest.raises(UnknownStatError, match=rf"^{call}: stat='mean'"):
        getattr(ScaleHistory(), call)(stat="mean", **selection)
    if call == "drifted":
        with pytest.raises(InputError, match=rf"^drifted: {name}="):
            ScaleHistory().drifted(top=0, **selection)
