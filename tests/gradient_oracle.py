"""The true-gradient oracle: central finite differences in float64, sharing no code with the library.

Unit scaling changes the scales of gradients, never their directions: every parameter's
and every input's gradient must be a positive multiple of the true gradient of the
forward that ran. :func:`true_gradient_cosines` measures, for each tensor, the cosine
between the gradient autograd returned and the true one, known only through directional
derivatives ``(L(t + h v) - L(t - h v)) / 2h``:

- along ``ĝ``, the returned gradient's own direction, the derivative is ``<G, ĝ>``: the
  part of the true gradient ``G`` along ``ĝ`` (its sign says whether ``g`` points uphill);
- along ``k`` Gaussian directions ``v`` with their ``ĝ`` part removed, the derivatives are
  ``N(0, |G_⊥|²)``, so their mean square estimates ``|G_⊥|²``, the part of ``G`` that ``g``
  misses;

and ``cos(g, G) = <G, ĝ> / sqrt(<G, ĝ>² + |G_⊥|²)``. A forward with float32 islands
(``transformers``' RMS norms compute in float32) needs a larger ``step`` (1e-3): the
differences' rounding is then float32's. A gradient that is an exact
multiple has ``|G_⊥|`` at the level of the differences' rounding (1e-9 relative); one
mixed from two scales misses a part of the size of the mixing, which the estimate finds
whatever ``k`` (its relative spread is ``sqrt(2 / k)``).

The loss is ``fn()``, a float64 scalar; ``fn`` is called again for each difference with
the same random seed, so dropout draws the same mask every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor


def _loss(fn: Callable[[], Tensor], seed: int) -> float:
    torch.manual_seed(seed)
    with torch.no_grad():
        return float(fn().detach())


def true_gradient_cosines(
    fn: Callable[[], Tensor],
    tensors: Mapping[str, Tensor],
    directions: int = 6,
    seed: int = 0,
    step: float = 1e-6,
) -> dict[str, float]:
    """``{name: cos(returned gradient, true gradient)}`` for each float64 leaf in ``tensors``.

    ``fn()`` must compute a scalar from the tensors (read by reference, so changing one in
    place changes the loss). A tensor whose returned gradient is zero scores 1 when the
    true gradient is zero too (no derivative above rounding), else 0.
    """
    for t in tensors.values():
        if t.dtype != torch.float64 or not t.requires_grad:
            raise ValueError("the oracle needs float64 leaves that require grad")
        t.grad = None
    torch.manual_seed(seed)
    fn().backward()
    grads = {name: (torch.zeros_like(t) if t.grad is None else t.grad.detach().clone()) for name, t in tensors.items()}
    generator = torch.Generator().manual_seed(seed + 1)
    cosines: dict[str, float] = {}
    with torch.no_grad():
        for name, t in tensors.items():

            def derivative(v: Tensor, t: Tensor = t) -> float:
                h = step * max(1.0, float(t.abs().max()))
                # Each change in its own no_grad: a forward may switch grad mode on and leave it so.
                with torch.no_grad():
                    t.add_(v, alpha=h)
                up = _loss(fn, seed)
                with torch.no_grad():
                    t.sub_(v, alpha=2 * h)
                down = _loss(fn, seed)
                with torch.no_grad():
                    t.add_(v, alpha=h)
                return (up - down) / (2 * h)

            g = grads[name]
            norm = float(g.norm())
            randoms = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for _ in range(directions)]
            if norm == 0.0:
                size = max(abs(derivative(v / v.norm())) for v in randoms) if t.numel() else 0.0
                cosines[name] = 1.0 if size < 1e-9 else 0.0
                continue
            unit = g / norm
            along = derivative(unit)
            missed = []
            for v in randoms:
                v = v - (v * unit).sum() * unit
                missed.append(derivative(v) ** 2)
            rest = sum(missed) / len(missed) if t.numel() > 1 else 0.0
            cosines[name] = along / math.sqrt(along * along + rest) if along or rest else 0.0
    return cosines


def module_cosines(
    module: torch.nn.Module,
    forward: Callable[[], Tensor],
    inputs: Mapping[str, Tensor] | None = None,
    **kwargs: float,
) -> dict[str, float]:
    """:func:`true_gradient_cosines` over a float64 module's parameters (and float inputs)."""
    tensors = {name: p for name, p in module.named_parameters() if p.requires_grad}
    tensors.update({f"input:{name}": t for name, t in (inputs or {}).items()})
    return true_gradient_cosines(forward, tensors, **kwargs)  # type: ignore[arg-type]


def projected(output: Tensor | tuple[Tensor, ...], seed: int = 99) -> Tensor:
    """A scalar loss from any output: its inner product with fixed N(0, 1) tensors (one per output tensor)."""
    outputs = output if isinstance(output, tuple) else (output,)
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros((), dtype=torch.float64)
    for o in outputs:
        total = total + (o * torch.randn(o.shape, generator=generator, dtype=o.dtype)).sum()
    return total


def worst(cosines: Mapping[str, float]) -> tuple[str, float]:
    """The tensor with the smallest cosine, for assertion messages."""
    name = min(cosines, key=lambda n: cosines[n])
    return name, cosines[name]
