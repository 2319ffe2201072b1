"""Reference models and data used by the tutorials, tests and benchmarks (not the library).

>>> import torch
>>> from unitscale.examples import MLP
>>> MLP(4, hidden=8)(torch.randn(2, 4)).shape
torch.Size([2, 4])
"""

from unitscale.examples.data import MarkovSource
from unitscale.examples.models import MLP, BasicBlock, ResNet, TinyGPT, resnet18
from unitscale.examples.umup_models import SPGPT, UmupGPT, markov_batches

__all__ = ["MLP", "TinyGPT", "ResNet", "BasicBlock", "resnet18", "MarkovSource", "UmupGPT", "SPGPT", "markov_batches"]
