"""Reference models and data used by the tutorials, tests and benchmarks (not the library).

>>> import torch
>>> from unitscale.examples import MLP
>>> MLP(4, hidden=8)(torch.randn(2, 4)).shape
torch.Size([2, 4])
"""

from unitscale.examples.data import MarkovSource as MarkovSource
from unitscale.examples.models import MLP as MLP
from unitscale.examples.models import BasicBlock as BasicBlock
from unitscale.examples.models import ResNet as ResNet
from unitscale.examples.models import TinyGPT as TinyGPT
from unitscale.examples.models import resnet18 as resnet18
from unitscale.examples.umup_models import SPGPT as SPGPT
from unitscale.examples.umup_models import UmupGPT as UmupGPT
from unitscale.examples.umup_models import markov_batches as markov_batches

__all__ = ["MLP", "TinyGPT", "ResNet", "BasicBlock", "resnet18", "MarkovSource", "UmupGPT", "SPGPT", "markov_batches"]
