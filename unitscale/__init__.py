"""unitscale: see and shape what happens inside PyTorch models with torch.fx."""

from unitscale.models import MLP, TinyGPT, resnet18
from unitscale.tracers import DeepTracer, ModulePathTracer

__all__ = [
    # models
    "MLP",
    "TinyGPT",
    "resnet18",
    # tracers
    "DeepTracer",
    "ModulePathTracer",
]
