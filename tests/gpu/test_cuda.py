"""The GPU paths, checked against the CPU and against torch's own float8 casts.

Skipped without CUDA (CI has none). Run on a GPU machine with
``python -m pytest -p no:cacheprovider tests/gpu``.
"""

import copy

import pytest
import torch

import unitscale
from unitscale.examples import TinyGPT
from unitscale.formats import FP8_E4M3, FP8_E5M2, FPFormat
from unitscale.transforms import simulate_fp8

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize(
    ("fmt", "dtype"), [(FP8_E4M3, torch.float8_e4m3fn), (FP8_E5M2, torch.float8_e5m2)], ids=["e4m3", "e5m2"]
)
def test_fp8_rounding_on_the_gpu_is_torchs_float8_cast(fmt: FPFormat, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    # Normal, subnormal and tie values across the format's whole range (inside it: torch's cast
    # does not saturate, ours does).
    x = torch.randn(1 << 16, device="cuda") * torch.logspace(-10, 7, 1 << 16, base=2, device="cuda")
    x = x.clamp(-fmt.max_value, fmt.max_value)
    ours = fmt.quantise_fwd(x)
    assert torch.equal(ours, x.to(dtype).to(torch.float32))
    assert torch.equal(ours.cpu(), fmt.quantise_fwd(x.cpu()))


def _gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab_size=64, d_model=64, n_layers=2, n_heads=4, seq_len=16)


def test_unit_scaled_model_gives_the_cpus_output_and_gradients_on_the_gpu() -> None:
    model = unitscale.unit_scale(_gpt())
    idx = torch.randint(0, 64, (8, 16))
    on_cpu = model(idx)
    on_cpu.sum().backward()
    grads_cpu = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    gpu_model = model.cuda()  # the same transformed model, moved: captured again for CUDA inputs
    gpu_model.zero_grad()
    on_gpu = gpu_model(idx.cuda())
    on_gpu.sum().backward()
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-4)
    assert 0.5 < on_gpu.std().item() < 2.0
    for name, param in gpu_model.named_parameters():
        if name in grads_cpu:
            torch.testing.assert_close(param.grad.cpu(), grads_cpu[name], rtol=1e-3, atol=1e-4)


def test_simulated_fp8_on_the_gpu_rounds_as_on_the_cpu() -> None:
    model = simulate_fp8(unitscale.unit_scale(_gpt()))
    idx = torch.randint(0, 64, (8, 16))
    on_cpu = model(idx)
    on_gpu = model.cuda()(idx.cuda()).cpu()
    # Rounding is elementwise and exact; only the matmuls' summation order differs, which can
    # move a value across a rounding boundary: almost all outputs agree to float32 precision.
    close = torch.isclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-4).float().mean().item()
    assert close > 0.99
    assert torch.isfinite(on_gpu).all()


def test_scale_report_on_the_gpu_matches_the_cpus() -> None:
    model = _gpt()
    idx = torch.randint(0, 64, (4, 16))
    grad = torch.randn(4, 16, 64)
    on_cpu = unitscale.track_scales(model, idx, backward=grad)
    on_gpu = unitscale.track_scales(copy.deepcopy(model).cuda(), idx.cuda(), backward=grad.cuda())
    assert len(on_gpu) == len(on_cpu)
    for row, cpu_row in zip(on_gpu, on_cpu, strict=True):
        assert row.forward == pytest.approx(cpu_row.forward, rel=1e-3, abs=1e-6)
        assert row.backward == pytest.approx(cpu_row.backward, rel=1e-3, abs=1e-6)


def test_one_adam_step_on_the_gpu_is_the_cpus() -> None:
    import unitscale.nn as unn
    import unitscale.optim

    torch.manual_seed(0)
    model = torch.nn.Sequential(unn.Linear(32, 64), unn.GELU(), unn.LinearReadout(64, 8))
    gpu_model = copy.deepcopy(model).cuda()
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    for m, device in ((model, "cpu"), (gpu_model, "cuda")):
        opt = unitscale.optim.Adam(m.parameters(), lr=0.1)
        torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device)).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), gpu_model.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
