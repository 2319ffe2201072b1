"""Several stages per rank: interleaved 1F1B, interleaved zero bubble and ZBV on gloo, against the unsplit model.

Each run starts two fresh interpreters, so the runs are few: one training step per schedule
on TinyGPT (4 stages on 2 ranks), a forward pass and a training step on a tiny Llama.
Argument errors are checked before any worker starts.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale import partition, run_pipeline
from unitscale.errors import InputError, PipelineError, StageCountError, UnknownScheduleError
from unitscale.examples.models import MLP, TinyGPT
from unitscale.stages import check_schedule, plan_pipeline
from unitscale.stages.runtime import placement
from unitscale.stages.schedules import schedule_order

REPO = Path(__file__).resolve().parents[2]


def logits_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


def lm_loss(output: object, target: torch.Tensor) -> torch.Tensor:
    return logits_loss(output.logits, target)  # type: ignore[attr-defined]


def assert_matches_unsplit(result: object, model: nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach(), atol=1e-5, rtol=0)  # type: ignore[attr-defined]
    grads = result.grads  # type: ignore[attr-defined]
    assert {id(model.get_parameter(n)) for n in grads} == {id(p) for p in model.parameters()}
    for name, grad in grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "interleaved_zero_bubble", "zbv"])
def test_two_stages_per_rank_training_step_matches_unsplit_tinygpt(schedule: str) -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=4, n_heads=2, seq_len=8)
    idx = torch.randint(0, 16, (4, 8))
    target = torch.roll(idx, -1, dims=1)
    plan = partition(model, 4, idx, boundary_depth=2)
    result = run_pipeline(
        plan, idx, 4, schedule, stages_per_rank=2, loss_fn=logits_loss, target=target, timeout=90, steps=2, warmup=1
    )
    torch.testing.assert_close(result.output, model(idx), atol=1e-5, rtol=0)
    assert_matches_unsplit(result, model, logits_loss(model(idx), target))
    assert 0 < result.step_time < 60 and math.isfinite(result.step_time)


def test_llama_interleaved_forward_and_zbv_training_match_the_model() -> None:
    from tests.real_models import llama, token_ids

    model, _ = llama(num_hidden_layers=4)
    ids = token_ids(batch=4, seed=4)
    target = torch.roll(ids, -1, dims=1)
    plan = partition(model, 4, ids, boundary_depth=3)
    out = run_pipeline(plan, ids, 2, "interleaved_1f1b", stages_per_rank=2, timeout=120)
    torch.testing.assert_close(out.logits, model(ids).logits, atol=1e-5, rtol=0)
    result = run_pipeline(plan, ids, 2, "zbv", stages_per_rank=2, loss_fn=lm_loss, target=target, timeout=120)
    torch.testing.assert_close(result.output.logits, model(ids).logits, atol=1e-5, rtol=0)
    assert_matches_unsplit(result, model, lm_loss(model(ids), target))


def test_a_script_without_a_main_guard_piped_to_python_stdin_runs_a_pipeline(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        from unitscale import partition, run_pipeline

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
        x, y = torch.randn(4, 4), torch.randn(4, 2)
        r = run_pipeline(partition(model, 4, x), x, 2, "interleaved_1f1b", stages_per_rank=2,
                         loss_fn=nn.MSELoss(), target=y, timeout=60)
        print("MATCH", torch.allclose(r.output, model(x), atol=1e-6), round(r.loss.item(), 5),
              round(nn.MSELoss()(model(x), y).item(), 5))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("MATCH") == 1
    _, same, got, want = done.stdout.split()
    assert same == "True" and got == want


def fail_on_rank(x: torch.Tensor, rank: int) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() == rank:  # only inside a worker
        raise ValueError(f"fault injected on rank {rank}")
    return x


torch.fx.wrap("fail_on_rank")


class FailOnRank(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fail_on_rank(x, 1)


def test_a_failing_rank_holding_two_stages_is_named_with_its_stages() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), FailOnRank())
    x = torch.randn(4, 4)
    plan = partition(model, 4, x)
    assert plan.assignment[next(n for n, _ in plan.node_costs if "fail_on_rank" in n)] in (1, 3)
    with pytest.raises(
        PipelineError, match=r"^rank 1 \(stages 1, 3\) worker failed: ValueError: fault injected on rank 1\n"
    ):
        run_pipeline(plan, x, 2, "interleaved_1f1b", stages_per_rank=2, timeout=60)


def test_default_call_result_has_a_step_time_and_keeps_its_fields() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    result = run_pipeline(partition(model, 2, x), x, 2, loss_fn=nn.MSELoss(), target=y, timeout=60)
    # the first four fields keep their places; the measurements follow
    assert [f for f in vars(result)][:4] == ["output", "loss", "grads", "step_time"]
    assert 0 < result.step_time < 60
    torch.testing.assert_close(result.loss, nn.MSELoss()(model(x), y).detach(), atol=1e-6, rtol=0)


# --- bad input: refused before any worker starts --------------------------------------------------


def mlp_plan(num_stages: int) -> object:
    torch.manual_seed(0)
    return partition(nn.Sequential(*[MLP(4, 8) for _ in range(num_stages)]), num_stages, torch.randn(8, 4))


@pytest.mark.parametrize(
    ("num_stages", "schedule", "per_rank", "micro", "error", "pattern"),
    [
        (
            4,
            "interleaved_1f1b",
            3,
            4,
            StageCountError,
            r"4 stages cannot be spread evenly with stages_per_rank=3; .*\[1, 2, 4\]",
        ),
        (4, "gpipe", 2, 4, StageCountError, r"schedule 'gpipe' runs one stage per rank.*'interleaved_1f1b'"),
        (
            6,
            "zbv",
            3,
            6,
            StageCountError,
            r"schedule 'zbv' places exactly 2 stages per rank .*stages_per_rank=3.*stages_per_rank=2",
        ),
        (
            3,
            "1f1b",
            1,
            2,
            InputError,
            r"1f1b needs at least as many microbatches as stages \(3\); use num_microbatches in \[3",
        ),
        (
            4,
            "interleaved_zero_bubble",
            2,
            5,
            InputError,
            r"num_microbatches=5 does not fit interleaved_zero_bubble on 2 ranks: .*in \[2, 3, 4, 6",
        ),
        (4, "interleaved_1f1b", 0, 4, StageCountError, r"stages_per_rank=0 must be an int >= 1"),
    ],
    ids=["not-dividing", "gpipe-looped", "zbv-three", "1f1b-few", "interleaved-rounds", "zero-per-rank"],
)
def test_schedules_refuse_placements_and_microbatch_counts_they_cannot_run(
    num_stages: int, schedule: str, per_rank: int, micro: int, error: type[Exception], pattern: str
) -> None:
    plan = mlp_plan(num_stages)
    x = torch.randn(micro * 2, 4)
    y = torch.randn(micro * 2, 4)
    with pytest.raises(error, match=pattern):
        run_pipeline(plan, x, micro, schedule, stages_per_rank=per_rank, loss_fn=nn.MSELoss(), target=y)


def test_unknown_schedule_and_forward_only_zbv_and_bad_steps_are_refused() -> None:
    plan = mlp_plan(4)
    x = torch.randn(4, 4)
    with pytest.raises(UnknownScheduleError, match=r"^unknown schedule 'zb-v'; use one of .*'zbv'"):
        run_pipeline(plan, x, 2, "zb-v", stages_per_rank=2)
    with pytest.raises(InputError, match=r"schedule='zbv' cannot run a forward-only step.*'interleaved_1f1b'"):
        run_pipeline(plan, x, 2, "zbv", stages_per_rank=2)
    with pytest.raises(InputError, match=r"run_pipeline\(steps=0\) must be an int >= 1"):
        run_pipeline(plan, x, 2, "interleaved_1f1b", stages_per_rank=2, steps=0)
    with pytest.raises(InputError, match=r"run_pipeline\(warmup=-1\) must be an int >= 0"):
        run_pipeline(plan, x, 2, "interleaved_1f1b", stages_per_rank=2, warmup=-1)


def _torch_accepts(schedule: str, ranks: int, per_rank: int, micro: int) -> bool:
    """Whether torch's own schedule class takes ``micro`` microbatches (built on stand-in stages:
    its constructor reads only their counts and indices)."""
    from torch.distributed import pipelining as pp

    cls = {
        "1f1b": pp.Schedule1F1B,
        "interleaved_1f1b": pp.ScheduleInterleaved1F1B,
        "interleaved_zero_bubble": pp.ScheduleInterleavedZeroBubble,
    }[schedule]
    total = ranks * per_rank
    stages = [
        SimpleNamespace(
            num_stages=total,
            group_size=ranks,
            group_rank=0,
            stage_index=i * ranks,
            is_first=i == 0,
            is_last=False,
            submod=nn.Identity(),
        )
        for i in range(per_rank)
    ]
    try:
        cls(stages[0] if schedule == "1f1b" else stages, n_microbatches=micro)
    except ValueError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(
    schedule=st.sampled_from(["1f1b", "interleaved_1f1b", "interleaved_zero_bubble"]),
    ranks=st.integers(1, 8),
    micro=st.integers(1, 40),
    per_rank=st.integers(1, 4),
)
def test_the_microbatch_check_agrees_with_torchs_schedule_classes_and_its_advice_works(
    schedule: str, ranks: int, micro: int, per_rank: int
) -> None:
    per_rank = 1 if schedule == "1f1b" else per_rank
    total = ranks * per_rank
    try:
        assert check_schedule(schedule, total, per_rank, micro) == ranks
        assert _torch_accepts(schedule, ranks, per_rank, micro)
    except InputError as exc:
        assert not _torch_accepts(schedule, ranks, per_rank, micro)
        advised = [int(n) for n in str(exc).split("use num_microbatches in [")[1].split("]")[0].split(", ")]
        for n in advised:
            assert check_schedule(schedule, total, per_rank, n) == ranks
            assert _torch_accepts(schedule, ranks, per_rank, n)


def test_the_interleaved_rule_on_the_torchrun_page_is_torchs() -> None:
    # docs/torchrun.md: with 4 ranks, any count below 8, then counts that m // 4 divides
    accepted = [m for m in range(1, 13) if _torch_accepts("interleaved_1f1b", 4, 2, m)]
    assert accepted == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12]
    for m in range(1, 13):
        try:
            check_schedule("interleaved_1f1b", 8, 2, m)
            ours = True
        except InputError:
            ours = False
        assert ours == (m in accepted)


@given(ranks=st.integers(1, 8), per_rank=st.integers(1, 4))
def test_placements_hold_every_stage_once(ranks: int, per_rank: int) -> None:
    looped = placement("interleaved_1f1b", ranks, per_rank)
    assert sorted(s for held in looped for s in held) == list(range(ranks * per_rank))
    assert all(s % ranks == r for r, held in enumerate(looped) for s in held)
    v = placement("zbv", ranks, 2)
    assert sorted(s for held in v for s in held) == list(range(2 * ranks))
    assert all(a + b == 2 * ranks - 1 for a, b in v)


def test_zbv_with_fewer_microbatches_than_stages_is_planned_and_runs_in_the_simulated_order() -> None:
    # torch's ZBV takes any microbatch count; the planner used to refuse fewer than 2 * ranks - 1
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(8)])
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    plan = plan_pipeline(model, x, 2, schedule="zbv", stages_per_rank=2, num_microbatches=2, cost="params")
    assert plan.num_stages == 4
    result = run_pipeline(plan, x, 2, "zbv", stages_per_rank=2, loss_fn=nn.MSELoss(), target=y, steps=1, warmup=0)
    torch.testing.assert_close(result.loss, nn.MSELoss()(model(x), y))
    for rank, record in enumerate(result.records):
        ran = [(kind, stage, mb) for kind, stage, mb, *_ in sorted(record.actions, key=lambda a: a[3])]
        assert ran == [tuple(op) for op in schedule_order("zbv", 2, 2, 2)[rank]], rank
