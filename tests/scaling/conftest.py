"""Fixtures that several test files of this folder use (each asks for them by name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def float64() -> Iterator[None]:
    """float64 as torch's default dtype and a seeded generator for one test; the dtype is put back after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(previous)
