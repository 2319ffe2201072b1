"""timm and torchvision models for tests, imported beside the CPU torch without torchvision's C extension.

torchvision from PyPI is built for CUDA: its C extension does not load beside the CPU torch,
and ``import torchvision`` fails in ``torchvision._meta_registrations``, which registers
meta kernels for the extension's ops (``torchvision::nms``). The models are pure Python and
need none of those ops, so a stub module stands in for ``_meta_registrations``.

Installed in ``.venv/vision`` (``make`` does it: ``pip install --no-deps --target``), not in
site-packages: there, ``transformers`` would find torchvision and import it without the stub,
and every ``transformers`` model would fail to import. Importing this module adds the stub
and that folder to ``sys.path``; the library never imports either package. Skips when the
folder is missing.

>>> model, x = build("resnet18")
>>> type(model).__name__, tuple(x.shape)
('ResNet', (8, 3, 32, 32))
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

VISION = Path(sys.prefix) / "vision"
if not (VISION / "torchvision").is_dir():
    pytest.skip(f"timm and torchvision are not installed in {VISION} (run make)", allow_module_level=True)
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
if str(VISION) not in sys.path:
    sys.path.append(str(VISION))

import timm  # noqa: E402
import torchvision  # noqa: E402

__all__ = ["MODELS", "build", "timm", "torchvision"]

#: name -> (library, constructor keyword arguments, input shape): tiny enough for a test, large
#: enough that the last feature maps are not mostly padding.
MODELS: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    "resnet18": ("torchvision", {}, (8, 3, 32, 32)),
    "mobilenet_v3_small": ("torchvision", {}, (8, 3, 64, 64)),
    "mobilenet_v2": ("torchvision", {"width_mult": 0.5}, (8, 3, 64, 64)),
    "efficientnet_b0": ("torchvision", {}, (8, 3, 64, 64)),
    "regnet_y_400mf": ("torchvision", {}, (8, 3, 64, 64)),
    "botnet26t_256": ("timm", {"img_size": 64}, (4, 3, 64, 64)),
    "levit_128s": ("timm", {"img_size": 64}, (4, 3, 64, 64)),
    "regnetx_002": ("timm", {}, (8, 3, 64, 64)),
}


def build(name: str, **kwargs: Any) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model of :data:`MODELS` called ``name`` (10 classes, seeded, in training mode) and an ``N(0, 1)`` batch.

    ``kwargs`` update the model's keyword arguments.
    """
    library, defaults, shape = MODELS[name]
    torch.manual_seed(0)
    if library == "torchvision":
        model = getattr(torchvision.models, name)(num_classes=10, **{**defaults, **kwargs})
    else:
        model = timm.create_model(name, num_classes=10, **{**defaults, **kwargs})
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    return model.train(), x
