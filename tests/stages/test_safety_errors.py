"""Typed errors where a pipeline call used to fail with torch's own (issue 37, item 7)."""

from __future__ import annotations

import math
import socket

import pytest
import torch
from torch import nn

from unitscale import partition, run_pipeline
from unitscale.errors import CostError, InputError, PipelineError
from unitscale.stages import pipeline_stage, plan_pipeline


def _model_and_plan() -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, partition(model, 2, torch.randn(4, 4))


def test_run_pipeline_on_inputs_of_the_wrong_width_names_both_shapes_before_any_worker() -> None:
    model, plan = _model_and_plan()
    wrong = torch.randn(4, 5)
    with pytest.raises(RuntimeError, match="mat1 and mat2"):  # the oracle: the model itself refuses it
        model(wrong)
    with pytest.raises(InputError, match=r"verify\(\) could not run"):  # and so does the plan's own check
        plan.verify(wrong)  # type: ignore[attr-defined]
    with pytest.raises(
        InputError,
        match=r"^run_pipeline: stage 0 cannot run on inputs of shapes \(4, 5\) \(RuntimeError: mat1 and mat2.*\); "
        r"the plan was made with example inputs of shapes \(4, 4\); pass inputs like those",
    ):
        run_pipeline(plan, wrong, num_microbatches=2)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1e-9"], ids=repr)
def test_plan_pipeline_refuses_a_seconds_per_cost_that_is_not_a_positive_number(bad: object) -> None:
    with pytest.raises(CostError, match=r"^plan_pipeline\(seconds_per_cost=.*\): pass a finite number of seconds > 0"):
        plan_pipeline(nn.Linear(2, 2), torch.randn(2, 2), 1, schedule="gpipe", num_microbatches=1, seconds_per_cost=bad)  # type: ignore[arg-type]


def test_pipeline_stage_with_master_port_taken_names_the_port_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    _, plan = _model_and_plan()
    one_stage = partition(nn.Linear(4, 2), 1, torch.randn(4, 4))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1").items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("MASTER_PORT", str(port))
        with pytest.raises(
            PipelineError,
            match=rf"^pipeline_stage could not join the process group at MASTER_ADDR=127.0.0.1 MASTER_PORT={port}: "
            r"that port is taken .*launch with another port \(torchrun --master-port PORT",
        ):
            pipeline_stage(one_stage, 1, "gpipe", backend="gloo")
    assert not torch.distributed.is_initialized()
