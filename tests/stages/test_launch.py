"""Saved plans and ``pipeline_stage`` under ``torchrun``: the same numbers as the unsplit model."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from unitscale import StagePlan, partition
from unitscale.errors import InputError
from unitscale.examples.models import TinyGPT
from unitscale.stages import SavedPlan, pipeline_stage

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _launch(command: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``cwd`` with this repository importable, one thread, gloo on loopback; it must succeed."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_saved_plan_loads_without_the_model_class_and_computes_the_same(tmp_path: Path) -> None:
    class Local(nn.Module):  # a local class cannot be pickled by reference: loading must not need it
        def __init__(self) -> None:
            super().__init__()
            self.gpt = TinyGPT(vocab_size=16, d_model=16, n_layers=2, n_heads=2, seq_len=8)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.gpt(idx).tanh()

    torch.manual_seed(0)
    model = Local()
    idx = torch.randint(0, 16, (2, 8))
    plan = partition(model, 3, idx, boundary_depth=3)
    plan.save(tmp_path / "plan.pt")
    loaded = StagePlan.load(tmp_path / "plan.pt")
    assert isinstance(loaded, SavedPlan)
    assert (loaded.num_stages, loaded.model_name, loaded.stage_costs) == (3, "Local", plan.stage_costs)
    assert torch.equal(loaded(idx), model(idx))


def test_a_saved_llama_plan_rebuilds_the_model_output(tmp_path: Path) -> None:
    from tests.real_models import llama

    model, (ids,) = llama()
    plan = partition(model, 2, ids, boundary_depth=3)
    plan.save(tmp_path / "llama.pt")
    out = StagePlan.load(tmp_path / "llama.pt")(ids)
    assert type(out) is type(model(ids))
    assert torch.equal(out.logits, model(ids).logits)


def test_loading_something_else_and_running_outside_torchrun_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match=r"no saved plan at '.*missing\.pt'; write one with plan\.save"):
        StagePlan.load(tmp_path / "missing.pt")
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(InputError, match=r"other\.pt' is not a plan written by StagePlan\.save"):
        StagePlan.load(tmp_path / "other.pt")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(
        InputError, match=r"needs the environment variable RANK \(got None\); run the script with torchrun"
    ):
        pipeline_stage(tmp_path / "other.pt", 2)


def test_pipeline_stage_refuses_a_world_size_that_does_not_fit_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.ReLU(), nn.Linear(2, 2))
    partition(model, 3, torch.randn(2, 4)).save(tmp_path / "plan.pt")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(InputError, match=r"3 stages, 1 per rank, so it needs 3 ranks, but WORLD_SIZE=2"):
        pipeline_stage(tmp_path / "plan.pt", 4, "1f1b")


def test_torchrun_two_processes_train_a_saved_plan_like_the_unsplit_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(4, 4), torch.randn(4, 3)
    partition(model, 2, x).save(tmp_path / "plan.pt")
    torch.save({"x": x, "y": y}, tmp_path / "data.pt")
    script = Path(__file__).with_name("torchrun_train.py")
    _launch(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script)]
        + [str(tmp_path / "plan.pt"), str(tmp_path / "data.pt"), str(tmp_path)],
        tmp_path,
        timeout=240,
    )
    first, last = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert first["output"] is None
    torch.testing.assert_close(last["output"], model(x), atol=1e-6, rtol=0)
    loss = nn.MSELoss()(model(x), y)
    loss.backward()
    torch.testing.assert_close(torch.stack(last["losses"]).mean(), loss.detach(), atol=1e-6, rtol=0)
    grads = {**first["grads"], **last["grads"]}
    assert sorted(grads) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=0)


def _tutorial_script() -> str:
    """``train.py`` exactly as tutorial 11 shows it (the string its torchrun cell writes and launches)."""
    text = (REPO / "tutorials" / "11_pipelines_at_scale.md").read_text()
    return text.split('train_py = """\\\n', 1)[1].split('\n"""\n', 1)[0] + "\n"


def test_tutorial_11s_torchrun_script_trains_the_plan_it_saves_like_the_unsplit_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    d = 768  # tutorial 11's model
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(d, d), nn.GELU())], nn.Linear(d, 8))
    x = torch.randn(512, d)
    partition(model, 4, x, cost="flops").save(tmp_path / "plan.pt")  # 2 ranks, 2 stages each
    (tmp_path / "train.py").write_text(_tutorial_script())
    launch = ["--standalone", "--nproc-per-node", "2", "train.py", "interleaved_1f1b", "2"]
    done = _launch([sys.executable, "-m", "torch.distributed.run", *launch], tmp_path)
    printed = [float(line.split("loss ")[1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    # the same three SGD steps on the unsplit model: a mean-reduced loss over the whole batch
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    expected = []
    for _ in range(3):
        bx, by = torch.randn(512, d, generator=generator), torch.randn(512, 8, generator=generator)
        optimizer.zero_grad()
        loss = nn.MSELoss()(model(bx), by)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    assert printed == pytest.approx(expected, abs=2e-4)  # printed to 4 decimals


def _page_blocks(path: Path) -> list[str]:
    """The ``python`` code blocks of a guide page, in order."""
    text = path.read_text()
    return [block.split("\n```", 1)[0] + "\n" for block in text.split("```python\n")[1:]]


def test_the_torchrun_pages_save_and_train_scripts_run_as_the_page_launches_them(tmp_path: Path) -> None:
    save, train, *_ = _page_blocks(REPO / "docs" / "torchrun.md")
    assert "plan.save(" in save and "pipeline_stage(" in train
    _launch([sys.executable, "-c", save], tmp_path)
    (tmp_path / "train.py").write_text(train)
    # the page's launch line: torchrun --standalone --nproc-per-node 4 train.py
    done = _launch(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "train.py"], tmp_path
    )
    printed = [line.split() for line in done.stdout.splitlines()]
    losses = {int(step): float(loss) for step, loss in printed}
    assert sorted(losses) == list(range(0, 100, 10))
    # step 0's loss is the saved model's on step 0's batch (its stages run in this process)
    idx = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(0))
    logits = StagePlan.load(tmp_path / "plan.pt")(idx)
    first = nn.functional.cross_entropy(logits.flatten(0, 1), torch.roll(idx, -1, dims=1).flatten())
    assert losses[0] == pytest.approx(first.item(), rel=1e-5)
    assert all(math.isfinite(loss) for loss in losses.values())
