"""``constant_result`` marks a function exactly as torch's own decorator does, without importing TorchDynamo."""

import subprocess
import sys

import torch

from unitscale.scaling.constant import constant_result


def test_the_mark_is_the_one_torch_sets() -> None:
    def ours() -> float:
        return 1.0

    def theirs() -> float:
        return 1.0

    assert vars(constant_result(ours)) == vars(torch.compiler.assume_constant_result(theirs))


def test_export_keeps_the_marked_result_as_a_constant() -> None:
    calls = []

    @constant_result
    def table(n: int) -> float:
        calls.append(n)
        return float(sum(range(n)))

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * table(5)

    x = torch.ones(3)
    exported = torch.export.export(M(), (x,), strict=True)
    assert torch.equal(exported.module()(x), x * 10.0)
    assert not [n for n in exported.graph.nodes if n.op == "call_function" and "table" in str(n.target)]


def test_marking_does_not_import_torchdynamo() -> None:
    code = "import sys; from unitscale.scaling.constant import constant_result; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "False"
