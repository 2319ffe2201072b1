"""The normaliser: every route's spelling of a module path reads as the same qualified name."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale.capture._meta import type_name
from unitscale.capture._where import innermost_frame
from unitscale.capture.toolkit import normalise_path

_name = st.from_regex(r"[a-z][a-z_]{0,6}", fullmatch=True) | st.integers(0, 30).map(str)


def _dynamo_spelling(parts: list[str]) -> str:
    """How TorchDynamo writes a path: L['self'] root, [i] for numbers, getattr for some."""
    text = "L['self']"
    for part in parts:
        text = (
            f"getattr({text}, '{part}')"
            if part.isdigit() and len(part) > 1
            else (f"{text}[{part}]" if part.isdigit() else f"{text}.{part}")
        )
    return text


@settings(max_examples=100, deadline=None)
@given(st.lists(_name, min_size=0, max_size=6))
def test_every_route_spelling_normalises_to_the_qualified_name(parts: list[str]) -> None:
    qualified = ".".join(parts)
    assert normalise_path(qualified) == qualified  # export already writes it this way
    assert normalise_path(_dynamo_spelling(parts)) == qualified
    modules = "L['self']" + "".join(f"._modules['{p}']" for p in parts)
    assert normalise_path(modules) == qualified


def test_type_names_are_qualified_whether_given_a_class_or_a_string() -> None:
    assert type_name(nn.Linear) == type_name("torch.nn.modules.linear.Linear") == "torch.nn.modules.linear.Linear"


def test_innermost_frame_skips_torch_and_keeps_the_users_line() -> None:
    trace = (
        'File "/home/u/model.py", line 10, in forward\n    y = self.fc(x)\n'
        'File "/venv/lib/torch/nn/modules/linear.py", line 125, in forward\n    return F.linear(x)\n'
    )
    assert innermost_frame(trace) == "/home/u/model.py:10"
    assert innermost_frame('File "/venv/lib/torch/x.py", line 3, in f') == "/venv/lib/torch/x.py:3"
    assert innermost_frame(None) == "" and innermost_frame('File "/a.py", line -1, in f') == ""
