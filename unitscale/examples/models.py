"""Small reference models used by the tutorials, tests and benchmarks.

They trace with ``torch.fx`` (no data-dependent control flow) and capture with TorchDynamo in one graph."""

import torch
import torch.nn.functional as F
from torch import nn

from unitscale.errors import ConfigError
from unitscale.examples._checks import check_int

__all__ = ["MLP", "TinyGPT", "ResNet", "resnet18"]


class MLP(nn.Module):
    """``Linear(d, hidden) -> activation -> Linear(hidden, d_out)``.

    Args:
        d: input width.
        hidden: hidden width (default ``4 * d``).
        d_out: output width (default ``d``).
        activation: the activation module (default ``nn.ReLU()``).

    >>> import torch
    >>> from unitscale.examples import MLP
    >>> MLP(8)(torch.randn(2, 8)).shape
    torch.Size([2, 8])
    """

    def __init__(
        self, d: int, hidden: int | None = None, d_out: int | None = None, activation: nn.Module | None = None
    ) -> None:
        super().__init__()
        check_int("MLP", "d", d, 1)
        hidden = 4 * d if hidden is None else check_int("MLP", "hidden", hidden, 1)
        d_out = d if d_out is None else check_int("MLP", "d_out", d_out, 1)
        if activation is not None and not isinstance(activation, nn.Module):
            raise ConfigError(
                f"MLP: activation={activation!r:.60} is a {type(activation).__name__}; pass a module such as nn.GELU()"
            )
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.ReLU() if activation is None else activation
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused QKV projection."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        h = self.n_heads
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``, the MLP's activation GELU."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, activation=nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small decoder-only transformer: token ids ``(batch, seq)`` to logits ``(batch, seq, vocab_size)``.

    Token and position embeddings, ``n_layers`` pre-norm blocks with residuals, a final layer
    norm and a linear head.

    Args:
        n_layers: number of transformer blocks (``blocks.0`` ... ``blocks.{n-1}``).
        seq_len: longest sequence the position embedding covers.

    >>> import torch
    >>> from unitscale.examples import TinyGPT
    >>> model = TinyGPT(vocab_size=11, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    >>> model(torch.randint(0, 11, (3, 8))).shape
    torch.Size([3, 8, 11])
    """

    def __init__(
        self, vocab_size: int = 64, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, seq_len: int = 64
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("n_heads", n_heads)):
            check_int("TinyGPT", name, value, 1)
        check_int("TinyGPT", "seq_len", seq_len, 1)
        check_int("TinyGPT", "n_layers", n_layers, 0)
        if d_model % n_heads:
            divisors = [h for h in range(1, d_model + 1) if d_model % h == 0][:8]
            raise ConfigError(
                f"TinyGPT: d_model={d_model} is not divisible by n_heads={n_heads}; "
                f"pick n_heads dividing d_model (e.g. one of {divisors})"
            )
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        x = self.blocks(x)
        return self.head(self.ln_f(x))


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: two 3x3 convolutions and a skip connection."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet of basic blocks, module names unchanged; build one with :func:`resnet18`.

    Args:
        layers: basic blocks in each of the four stages (``layer1`` ... ``layer4``).
        num_classes: width of the final ``fc`` layer.
        width: channels of the first stage.

    >>> import torch
    >>> from unitscale.examples import ResNet
    >>> ResNet((1, 1, 1, 1), num_classes=5, width=4)(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 5])
    """

    def __init__(
        self, layers: tuple[int, int, int, int] = (2, 2, 2, 2), num_classes: int = 1000, width: int = 64
    ) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes: int = 1000, width: int = 64) -> ResNet:
    """ResNet-18 with torchvision's structure and module names (``layer1.0.conv1``, ...).

    Args:
        num_classes: width of the final ``fc`` layer.
        width: channels of the first stage (64 in torchvision; smaller is faster).

    >>> from unitscale.examples import resnet18
    >>> model = resnet18(num_classes=10, width=8)
    >>> print(*(name for name, _ in model.named_children()))
    conv1 bn1 relu maxpool layer1 layer2 layer3 layer4 avgpool fc
    >>> sum(p.numel() for p in resnet18().parameters())
    11689512
    """
    check_int("resnet18", "num_classes", num_classes, 1)
    check_int("resnet18", "width", width, 1)
    return ResNet((2, 2, 2, 2), num_classes=num_classes, width=width)
