"""Plan files are data: loading one runs no code, every field is checked, and saves are atomic (issue 37)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx, nn

from unitscale import StagePlan, partition
from unitscale.errors import InputError, PlanFileError, PlanSaveError
from unitscale.examples.models import TinyGPT
from unitscale.stages import pipeline_stage
from unitscale.stages.partitioner.plan_files import FORMAT

REPO = Path(__file__).resolve().parents[2]


class _Exploit:
    """An object whose unpickling runs a command (what a crafted plan file holds)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _mlp_plan() -> tuple[nn.Module, torch.Tensor, StagePlan]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    return model, x, partition(model, 2, x)


def _crafted_files(tmp_path: Path, marker: Path) -> dict[str, Path]:
    files = {name: tmp_path / f"{name}.pt" for name in ("new_format", "old_format", "plain_pickle")}
    torch.save({"format": FORMAT, "plan": "{}", "tensors": {}, "x": _Exploit(marker)}, files["new_format"])
    torch.save({"format": "unitscale.stages.saved/1", "stage_modules": _Exploit(marker)}, files["old_format"])
    files["plain_pickle"].write_bytes(pickle.dumps(_Exploit(marker)))
    return files


def test_a_crafted_plan_file_runs_no_code_in_load_or_pipeline_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    # the oracle: plain unpickling of the same file does run the command
    pickle.loads(pickle.dumps(_Exploit(marker)))
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    for name, path in _crafted_files(tmp_path, marker).items():
        with pytest.raises(PlanFileError, match=r"StagePlan\.load"):
            StagePlan.load(path)
        with pytest.raises(PlanFileError):
            pipeline_stage(path, 2)
        assert not marker.exists(), f"loading the {name} file ran its command"


def test_an_old_pickled_plan_is_refused_with_how_to_save_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, plan = _mlp_plan()
    old = tmp_path / "old.pt"
    # what StagePlan.save wrote before plans were data
    torch.save(
        {
            "format": "unitscale.stages.saved/1",
            "stage_modules": plan.stage_modules(),
            "output_example": None,
            "model_name": "Sequential",
            "stage_costs": plan.stage_costs,
        },
        old,
    )
    with pytest.raises(PlanFileError, match=r"older unitscale .*would run code.*save it again with plan\.save\(path\)"):
        StagePlan.load(old)
    # the API page's recipe for a file one trusts converts it, and the result computes the same
    page = (REPO / "docs" / "api.md").read_text()
    recipe = page.split("convert it once", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    old.rename(tmp_path / "old_plan.pt")
    exec(textwrap.dedent(recipe), {})
    x = torch.randn(3, 4)
    assert torch.equal(StagePlan.load(tmp_path / "plan.pt")(x), plan.stage_modules()[1](plan.stage_modules()[0](x)))


def test_a_saved_plan_is_plain_data_and_rebuilds_the_same_stages(tmp_path: Path) -> None:
    model, x, _ = _mlp_plan()
    model[3].weight.requires_grad_(False)
    plan = partition(model, 2, x)
    path = tmp_path / "plan.pt"
    plan.save(path)
    # torch's own safe loader reads the whole file: tensors, strings and dicts only
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"format", "plan", "tensors"} and isinstance(json.loads(raw["plan"]), dict)
    loaded = StagePlan.load(path)
    for ours, theirs in zip(loaded.stage_modules, plan.stage_modules(), strict=True):
        assert ours.code == theirs.code
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        assert all(torch.equal(ours.state_dict()[k], v) for k, v in theirs.state_dict().items())
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_tied_weights_frozen_parameters_and_modes_survive_a_save(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    model.head.weight = model.tok_emb.weight  # tied: one parameter, used by the first and the last stage
    model.blocks[0].ln1.weight.requires_grad_(False)
    model.eval()
    idx = torch.randint(0, 16, (2, 8))
    plan = partition(model, 1, idx)
    plan.save(tmp_path / "plan.pt")
    (stage,) = StagePlan.load(tmp_path / "plan.pt").stage_modules
    (original,) = plan.stage_modules()
    # the oracle: the stage the plan builds in memory, and the model itself
    assert [(n, p.requires_grad) for n, p in stage.named_parameters()] == [
        (n, p.requires_grad) for n, p in original.named_parameters()
    ]
    assert [(n, m.training) for n, m in stage.named_modules()] == [(n, m.training) for n, m in original.named_modules()]
    assert torch.equal(stage(idx), model(idx))


def _edited(path: Path, edit: Any) -> Path:
    raw = torch.load(path, weights_only=True)
    data = json.loads(raw["plan"])
    edit(data, raw)
    raw["plan"] = json.dumps(data)
    out = path.with_name("edited.pt")
    torch.save(raw, out)
    return out


def _node(data: dict[str, Any], stage: int, op: str) -> list[Any]:
    return next(n for n in data["stages"][stage]["graph"] if n[0] == op)


def _call(target: Any, op: str = "call_function") -> Any:
    """An edit that makes stage 0's first layer call ``target`` instead."""

    def edit(data: dict[str, Any], raw: dict[str, Any]) -> None:
        node = _node(data, 0, "call_module")
        node[0], node[2] = op, target

    return edit


def _set(*keys: Any, value: Any) -> Any:
    def edit(data: dict[str, Any], raw: dict[str, Any]) -> None:
        owner = data
        for key in keys[:-1]:
            owner = owner[key]
        owner[keys[-1]] = value

    return edit


GARBAGE: dict[str, tuple[Any, str]] = {
    "os.system": (_call({"function": ["os", "system"]}), r"calls os\.system, which is not on the allow-list"),
    "torch.os.system": (_call({"function": ["torch.os", "system"]}), r"not on the allow-list"),
    "torch.load": (_call({"function": ["torch", "load"]}), r"is not a function of torch"),
    "builtins.eval": (_call({"function": ["builtins", "eval"]}), r"not on the allow-list"),
    "a private method": (_call("__reduce__", "call_method"), r"public methods"),
    "a function target that is not data": (_call("os.system"), r"not one a plan file writes"),
    "a layer class outside torch.nn": (
        _set("stages", 0, "modules", "0", "class", value=["builtins", "eval"]),
        "class",
    ),
    "a missing tensor": (lambda d, r: r["tensors"].clear(), r"does not hold"),
    # well-formed everywhere, but stage 0's first weight has the wrong shape: only running it tells
    "a weight of the wrong shape": (
        lambda d, r: r["tensors"].__setitem__("t0", torch.zeros(8, 5)),
        r"its stages do not run on inputs like those the plan was made with \(RuntimeError: .*same reduction dim",
    ),
    "example inputs of another plan": (_set("inputs", value=[None, None]), r"not stage 0's 1 inputs"),
    "a layer that is not there": (_call("nowhere", "call_module"), r"not a submodule"),
    "a node read before it is made": (lambda d, r: d["stages"][0]["graph"].reverse(), r"holds|output"),
    "stage costs of another plan": (_set("stage_costs", value=[1.0]), r"stage_costs"),
    "no stages": (_set("stages", value=[]), r"no stages"),
    "stages that are not a list": (_set("stages", value={"a": 1}), r"stages"),
    "an output of the wrong size": (
        _set("output", value='[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]'),
        r"output",
    ),
    "a graph that is not a list": (_set("stages", 1, "graph", value="x"), r"graph"),
    "a name where a dtype goes": (_set("stages", 0, "graph", 1, 3, value={"dtype": "system"}), r"holds"),
    "a private attribute read": (
        lambda d, r: _node(d, 0, "call_module").__setitem__(
            slice(0, 5),
            [
                "call_function",
                "x",
                {"function": ["builtins", "getattr"]},
                {"tuple": [{"node": d["stages"][0]["graph"][0][1]}, "__class__"]},
                {"dict": []},
            ],
        ),
        r"not public",
    ),
}


@pytest.mark.parametrize("edit", list(GARBAGE), ids=list(GARBAGE))
def test_garbage_in_a_plan_file_is_refused_at_load_naming_what(tmp_path: Path, edit: str) -> None:
    _, _, plan = _mlp_plan()
    plan.save(tmp_path / "plan.pt")
    change, message = GARBAGE[edit]
    path = _edited(tmp_path / "plan.pt", change)
    with pytest.raises(PlanFileError, match=message) as info:
        StagePlan.load(path)
    assert "StagePlan.load(" in str(info.value)


def test_load_of_something_that_is_not_a_plan_file_names_load_and_the_argument(tmp_path: Path) -> None:
    for bad in (42, None, b"plan.pt"):
        with pytest.raises(PlanFileError, match=rf"StagePlan\.load\(path={bad!r}\): pass the path"):
            StagePlan.load(bad)  # type: ignore[arg-type]
    with pytest.raises(PlanFileError, match=r"that path is a directory"):
        StagePlan.load(tmp_path)
    torch.save({"format": FORMAT}, tmp_path / "keys.pt")
    with pytest.raises(PlanFileError, match=r"no 'plan' field"):
        StagePlan.load(tmp_path / "keys.pt")
    torch.save({"format": FORMAT, "plan": "{}", "tensors": {}}, tmp_path / "keys.pt")
    with pytest.raises(PlanFileError, match=r"has no 'stages' field"):
        StagePlan.load(tmp_path / "keys.pt")
    assert issubclass(PlanFileError, (InputError, ValueError))


def test_a_save_that_fails_leaves_the_old_plan_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, plan = _mlp_plan()
    path = tmp_path / "plan.pt"
    plan.save(path)
    before = path.read_bytes()
    # a lambda left on a layer: not data
    model2, _, _ = _mlp_plan()
    model2[0].act = lambda t: t  # type: ignore[assignment]
    with pytest.raises(PlanSaveError, match=r"stage 0's module '0', attribute 'act', holds function"):
        partition(model2, 2, x).save(path)
    assert path.read_bytes() == before

    # the disk fails half-way through the write
    def failing_save(obj: Any, file: Any, *args: Any, **kwargs: Any) -> None:
        file.write(b"half a plan")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        partition(model, 2, x, cost="flops").save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.pt"]  # no temporary file left
    with pytest.raises(PlanSaveError, match=r"the directory .*missing' does not exist; create it first"):
        plan.save(tmp_path / "missing" / "plan.pt")
    with pytest.raises(PlanSaveError, match=r"that path is a directory"):
        plan.save(tmp_path)


_SAVE_A_LARGE_PLAN = """
import sys, torch
from torch import nn
from unitscale import partition
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(48)])  # 200 MB of weights
plan = partition(model, 2, torch.randn(2, 1024))
print("saving", flush=True)
plan.save(sys.argv[1])
"""


def test_a_save_killed_half_way_leaves_the_old_plan_byte_for_byte(tmp_path: Path) -> None:
    _, _, plan = _mlp_plan()
    path = tmp_path / "plan.pt"
    plan.save(path)
    before, stat = path.read_bytes(), path.stat()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    child = subprocess.Popen(
        [sys.executable, "-c", _SAVE_A_LARGE_PLAN, str(path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "saving\n"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            temporary = [p for p in tmp_path.iterdir() if p.name != "plan.pt" and p.stat().st_size > 1_000_000]
            if temporary or path.stat().st_mtime_ns != stat.st_mtime_ns or path.stat().st_size != stat.st_size:
                break  # the save is writing (beside the plan, or over it)
            time.sleep(0.001)
        assert child.poll() is None, "the save finished before it could be killed"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        assert child.stdout is not None
        child.stdout.close()
    assert path.read_bytes() == before
    assert torch.equal(
        StagePlan.load(path)(torch.ones(1, 4)), plan.stage_modules()[1](plan.stage_modules()[0](torch.ones(1, 4)))
    )


def test_a_stage_holding_a_users_leaf_module_is_refused_at_save(tmp_path: Path) -> None:
    class Mine(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t * 2

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return isinstance(m, Mine) or super().is_leaf_module(m, qualname)

    model = nn.Sequential(nn.Linear(2, 2), Mine())
    traced = fx.GraphModule(model, Tracer().trace(model))
    with pytest.raises(PlanSaveError, match=r"stage 0's module '1' is a .*Mine, whose code a plan file cannot hold"):
        partition(traced, 1, torch.randn(1, 2)).save(tmp_path / "plan.pt")
    assert not (tmp_path / "plan.pt").exists()


def doubled(t: torch.Tensor) -> torch.Tensor:
    return t * 2


torch.fx.wrap("doubled")


class _Doubling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return doubled(self.fc(t))


def test_a_function_off_the_allow_list_loads_only_when_the_caller_names_it(tmp_path: Path) -> None:
    model = _Doubling()
    x = torch.randn(2, 3)
    partition(model, 1, x).save(tmp_path / "plan.pt")
    with pytest.raises(
        PlanFileError,
        match=r"calls tests\.stages\.test_plan_files\.doubled, which is not on the allow-list .*"
        r"StagePlan\.load\(path, functions=\[tests\.stages\.test_plan_files\.doubled\]\)",
    ):
        StagePlan.load(tmp_path / "plan.pt")
    loaded = StagePlan.load(tmp_path / "plan.pt", functions=[doubled])
    assert torch.equal(loaded(x), model(x))
    with pytest.raises(PlanFileError, match=r"StagePlan\.load\(functions=<function"):
        StagePlan.load(tmp_path / "plan.pt", functions=doubled)  # type: ignore[arg-type]
