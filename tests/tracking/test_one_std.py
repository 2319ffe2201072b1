"""One std, one recording function: every statistic and every route gives the same numbers.

The oracles: ``torch.std(correction=0)`` of the values in float64 (the population std: the
root mean square about the mean, what unit scaling calls a scale; 0 for one element, NaN
where an infinity or a NaN is), and the model's own forward and ``.backward()`` seen through
torch's hooks.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from unitscale import track_scales
from unitscale.formats import FP8_E4M3
from unitscale.tracking import ScaleMonitor, cast_stats, std_stat
from unitscale.tracking.format_casts import CastBatch
from unitscale.tracking.recording import ScaleRecording
from unitscale.transforms.scale_check import check_scale

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool]


def _oracle(x: torch.Tensor) -> float:
    return torch.std(x.double(), correction=0).item()


# Sizes 1 and 2, small shapes, and sizes past the CPU path's 2**18-element dot-product blocks.
SHAPES = st.one_of(
    st.lists(st.integers(0, 9), min_size=0, max_size=3),
    st.sampled_from([[1], [2], [1, 1, 1], [2**18 + 3], [3, 2**17 + 1]]),
)


@settings(max_examples=120, deadline=None)
@given(
    shape=SHAPES,
    dtype=st.sampled_from(DTYPES),
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]),
    shift=st.sampled_from([0.0, 1.0, -50.0, 1e4]),  # 1e4: a large mean over a small std
    seed=st.integers(0, 2**16),
    device_path=st.booleans(),
)
def test_std_is_torch_std_correction_0_in_float64_on_every_path(
    shape: list[int], dtype: torch.dtype, scale: float, shift: float, seed: int, device_path: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift * scale
    if dtype.is_floating_point:
        x = values.to(dtype)
    else:
        x = (values / scale * 7).round().to(dtype)
    with pytest.MonkeyPatch.context() as patch:
        if device_path:  # as on a GPU: a 0-dim tensor left on the device
            patch.setattr("unitscale.tracking.stats.reads_at_once", lambda device: False)
        got = std_stat(x)
    if x.numel() == 0:
        assert got is None  # torch.std gives NaN (and a warning)
        return
    # torch's own answer everywhere else: 0 for one element, NaN for an infinity or a NaN;
    # integers, booleans and low precision as their values in float32
    wide = x if dtype in (torch.float32, torch.float64) else x.float()
    assert float(got) == pytest.approx(_oracle(wide), rel=1e-5, abs=1e-300, nan_ok=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("n", [1, 2, 1000])
def test_a_non_finite_value_gives_nan_even_alone(bad: float, n: int) -> None:
    x = torch.ones(n)
    x[0] = bad
    assert math.isnan(std_stat(x))  # type: ignore[arg-type]
    assert math.isnan(cast_stats(x, FP8_E4M3).std)


@pytest.mark.parametrize("n", [1, 2, 3, 700, 10_000])
def test_every_statistic_of_unitscale_is_that_std(n: int) -> None:
    torch.manual_seed(n)
    x = torch.randn(n) * 3 + (40 if n > 2 else 0)  # mean above the std: the careful path too
    want = _oracle(x)
    batch = CastBatch(FP8_E4M3)
    batch.add(x)
    assert std_stat(x) == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert cast_stats(x, FP8_E4M3).std == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert batch.finish()[0][0] == pytest.approx(want, rel=1e-5, abs=1e-12)
    model = nn.Identity()
    with ScaleMonitor(model, every=1, parameters=False) as monitor, monitor.step():
        model(x)
    (record,) = monitor.history.select(kind="activation")
    assert record.std == pytest.approx(want, rel=1e-5, abs=1e-12)


def test_the_scale_check_measures_with_that_std_and_judges_no_one_element_tensor() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x * 3).mean()  # a loss: one element

    x = torch.randn(4000, generator=torch.Generator().manual_seed(0))
    check = check_scale(fx.symbolic_trace(Net()), [x])
    stds = {name: (fwd, bwd) for name, fwd, bwd in check.stds}
    leaf = x.clone().requires_grad_()
    mul = leaf * 3
    mul.retain_grad()
    tanh = torch.tanh(mul)
    tanh.retain_grad()
    tanh.mean().backward()
    assert stds["x"] == pytest.approx((_oracle(x), _oracle(leaf.grad)), rel=1e-6)  # type: ignore[arg-type]
    assert stds["mul"] == pytest.approx((_oracle(mul), _oracle(mul.grad)), rel=1e-6)  # type: ignore[arg-type]
    assert stds["tanh"] == pytest.approx((_oracle(tanh), _oracle(tanh.grad)), rel=1e-6)  # type: ignore[arg-type]
    assert all(math.isnan(v) for v in stds["mean"])  # one element: no spread to judge
    assert math.isnan(check.output_std)  # the output is that one element


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)).t().contiguous().t())


def test_interpreter_compiled_and_eager_routes_record_the_models_own_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, x, grad = _Net(), torch.randn(32, 8).requires_grad_(), torch.randn(32, 4)
    # the oracle: the model's own forward and backward
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> object:
        def hook(module: nn.Module, args: object, out: torch.Tensor) -> None:
            seen[name] = out
            out.retain_grad()

        return hook

    hooks = [getattr(model, k).register_forward_hook(keep(k)) for k in ("fc1", "fc2")]
    leaf = x.detach().clone().requires_grad_()
    model(leaf).backward(grad)
    for h in hooks:
        h.remove()
    want = {k: (_oracle(seen[k]), _oracle(seen[k].grad)) for k in seen}  # type: ignore[arg-type]
    want["input"] = (_oracle(x), _oracle(leaf.grad))  # type: ignore[arg-type]
    model.zero_grad()

    calls: list[str] = []
    record = ScaleRecording.record
    monkeypatch.setattr(
        ScaleRecording, "record", lambda self, v, step, *s: calls.append(step.name) or record(self, v, step, *s)
    )
    routes = {
        "compiled": (model, "fx", {"input": "x", "fc1": "linear", "fc2": "linear_1"}),
        "eager": (model, "eager", {"input": "x", "fc1": "linear", "fc2": "linear_1"}),
        "interpreter": (fx.symbolic_trace(model), "auto", {"input": "x", "fc1": "fc1", "fc2": "fc2"}),
    }
    for route, (module, how, names) in routes.items():
        calls.clear()
        report = track_scales(module, x, grad, route=how)
        for key, node in names.items():
            got = (report[node].forward, report[node].backward)
            assert got == pytest.approx(want[key], rel=1e-6), (route, key)
        assert set(names.values()) <= set(calls), route  # every route records through ScaleRecording.record
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("slot", ["fwd", "bwd", "grad", ""])
def test_a_record_refuses_a_slot_it_does_not_have_and_stays_empty(slot: str) -> None:
    # Any slot but "backward" used to be taken as forward, silently.
    from unitscale.errors import InputError
    from unitscale.tracking import ScaleRecord

    record = ScaleRecord()
    with pytest.raises(
        InputError, match=rf"^ScaleRecord\.fill: slot='{slot}' is not known; pass 'forward' or 'backward'"
    ):
        record.fill(torch.tensor([1.0, 3.0]), slot, abs_max=True)
    assert (record.forward, record.backward, record.abs_max) == (None, None, None)
