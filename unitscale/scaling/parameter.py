"""u-μP parameter roles: what a parameter is, the width and depth its learning rate scales with.

The modules of :mod:`unitscale.nn` tag their parameters; :func:`tag` tags one of your own, and
the optimisers of :mod:`unitscale.optim` read the tag from the parameter itself.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from unitscale.errors import MultiplierError, UnknownRoleError, UntaggedParameterError
from unitscale.scaling.checks import check_mult

__all__ = ["ROLES", "ParamRole", "tag", "role_of", "set_depth", "residual_taus"]

ROLES = ("weight", "bias", "norm", "readout", "embedding")
"""The u-μP roles. ``"output"`` (the reference library's name for ``"readout"``) is accepted as an alias."""

_ALIASES = {"output": "readout"}
_P = TypeVar("_P", bound=Tensor)
_ATTR = "umup_role"


@dataclass(frozen=True)
class ParamRole:
    """A parameter's u-μP role and the sizes its learning rate scales with.

    Attributes:
        role: one of :data:`ROLES`.
        width: the width the role's rule reads: the fan-in of a ``weight`` or ``readout``
            matrix (input features, times the kernel size of a convolution), the embedding
            dimension of an ``embedding`` (its fan-out), the size of a ``bias`` or ``norm``.
        depth: the number of residual blocks when the parameter sits in a residual branch
            whose output is weighted by depth (:func:`residual_taus`), else ``None``.
    """

    role: str
    width: int
    depth: int | None = None


class _RoleParameter(nn.Parameter):
    """A ``Parameter`` whose copies keep its attributes.

    torch's ``deepcopy`` of a parameter drops them, and its pickle rebuilds a plain ``Parameter``
    whose next ``deepcopy`` drops them: both are overridden here.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Parameter:
        result = super().__deepcopy__(memo)
        result.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return result

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (_rebuild_role_parameter, (self.data, self.requires_grad, dict(self.__dict__)))


def _rebuild_role_parameter(data: Tensor, requires_grad: bool, state: dict[str, Any]) -> nn.Parameter:
    param = _RoleParameter(data, requires_grad)
    param.__dict__.update(state)
    return param


# torch.load(weights_only=True), torch's default, rebuilds only allow-listed globals.
torch.serialization.add_safe_globals([_rebuild_role_parameter, _RoleParameter, ParamRole])


def _check_size(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MultiplierError(f"{owner}: {name}={value!r:.60} must be an int >= 1")
    return value


def _default_width(role: str, shape: tuple[int, ...]) -> int:
    if role in ("bias", "norm") or len(shape) < 2:
        return max(math.prod(shape), 1)
    if role == "embedding":
        return shape[1]
    return max(math.prod(shape[1:]), 1)


def tag(param: _P, role: str, width: int | None = None, depth: int | None = None) -> _P:
    """Tag ``param`` with a u-μP role, in place, and return it.

    With the Adam of :mod:`unitscale.optim`, a ``weight`` or ``embedding`` learns at
    ``lr * width**-0.5``, a ``readout``, ``bias`` or ``norm`` at ``lr``, and a parameter with a
    ``depth`` at a further ``depth**-0.5``. The tag survives ``copy.deepcopy``, ``pickle``,
    ``torch.save``/``torch.load``, ``load_state_dict`` into :mod:`unitscale.nn` modules
    (``assign=True`` included) and ``torch.compile``.

    Args:
        role: one of :data:`ROLES` (or ``"output"``, an alias of ``"readout"``).
        width: the width the rule reads (see :class:`ParamRole`); ``None`` reads it from the
            shape: ``shape[1:]``'s product for a weight or readout, ``shape[1]`` for an
            embedding, the element count for a bias or norm.
        depth: the number of residual blocks, for a parameter inside a depth-weighted
            residual branch; ``None`` otherwise.

    Raises:
        UnknownRoleError: ``role`` is not a u-μP role.
        MultiplierError: ``width`` or ``depth`` is not an int >= 1.
        TypeError: ``param`` is not a ``torch.nn.Parameter`` (an :class:`~unitscale.errors.UntaggedParameterError`).

    >>> import torch
    >>> from unitscale.scaling import role_of, tag
    >>> emb = tag(torch.nn.Parameter(torch.randn(100, 64)), "embedding")
    >>> role_of(emb).width
    64
    """
    if not isinstance(param, nn.Parameter):
        raise UntaggedParameterError(
            f"tag: param is a {type(param).__name__}; pass a torch.nn.Parameter (e.g. module.weight)"
        )
    name = _ALIASES.get(role, role) if isinstance(role, str) else role
    if name not in ROLES:
        raise UnknownRoleError(f"tag: role={role!r:.60} is not a u-μP role; pass one of {', '.join(ROLES)}")
    width = _default_width(name, tuple(param.shape)) if width is None else _check_size("tag", "width", width)
    if depth is not None:
        _check_size("tag", "depth", depth)
    if type(param) is nn.Parameter:
        param.__class__ = _RoleParameter  # type: ignore[assignment]
    setattr(param, _ATTR, ParamRole(name, width, depth))
    return param


def role_of(param: object) -> ParamRole | None:
    """The :class:`ParamRole` of a tagged parameter, or ``None``.

    >>> import torch
    >>> from unitscale.scaling import role_of
    >>> role_of(torch.nn.Parameter(torch.zeros(3))) is None
    True
    """
    role = getattr(param, _ATTR, None)
    return role if isinstance(role, ParamRole) else None


def set_depth(module: nn.Module, depth: int) -> nn.Module:
    """Record ``depth`` (the number of residual blocks) on every tagged parameter of ``module``, in place.

    Call it on the blocks of a residual stack weighted by :func:`residual_taus`: their parameters
    then learn at a further ``depth**-0.5`` under the u-μP optimisers. Untagged parameters are
    left alone. Returns ``module``.

    Raises:
        MultiplierError: ``depth`` is not an int >= 1.

    >>> from unitscale.nn import Linear
    >>> from unitscale.scaling import role_of, set_depth
    >>> role_of(set_depth(Linear(8, 8), 6).weight).depth
    6
    """
    _check_size("set_depth", "depth", depth)
    for param in module.parameters():
        role = role_of(param)
        if role is not None:
            setattr(param, _ATTR, ParamRole(role.role, role.width, depth))
    return module


def residual_taus(blocks: int, residual_mult: float = 1.0, attn_ratio: float = 1.0) -> list[float]:
    """The residual weights of a transformer of ``blocks`` (attention, MLP) blocks: u-μP's depth rule.

    u-μP, Appendix G: each branch carries a share of the variance that falls as ``1 / depth``.
    Each ``tau`` is the share of the output's variance its branch carries, as in
    :func:`~unitscale.functional.residual_add`; the reference library's
    ``transformer_residual_scaling_rule`` returns the branch-to-skip ratio ``t`` instead, and
    ``tau = t² / (1 + t²)``.

    Args:
        blocks: number of transformer blocks (each has two branches).
        residual_mult: α_res, the branches' total contribution relative to the embedding.
        attn_ratio: α_res-attn-ratio, attention's contribution relative to the MLP's.

    Returns:
        ``2 * blocks`` taus: attention, MLP, attention, ...

    Raises:
        MultiplierError: ``blocks`` is not an int >= 1, or a multiplier is not a finite number > 0.

    >>> from unitscale.scaling import residual_taus
    >>> [round(t, 3) for t in residual_taus(2)]
    [0.333, 0.25, 0.2, 0.167]
    """
    _check_size("residual_taus", "blocks", blocks)
    residual_mult = check_mult("residual_taus", "residual_mult", residual_mult)
    attn_ratio = check_mult("residual_taus", "attn_ratio", attn_ratio)
    alpha_mlp = residual_mult * (2 / (1 + attn_ratio**2)) ** 0.5
    alpha_attn = attn_ratio * alpha_mlp
    # Variances in units of one branch at α = 1: the embedding carries `blocks` of them,
    # so that the attention branches, the MLP branches and the embedding all weigh the same
    # when every α is 1.
    accumulated = float(blocks)
    taus = []
    for index in range(2 * blocks):
        alpha = alpha_attn if index % 2 == 0 else alpha_mlp
        taus.append(alpha**2 / (accumulated + alpha**2))
        accumulated += alpha**2
    return taus
