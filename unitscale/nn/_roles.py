"""The base of every unit-scaled module with parameters: they keep their u-μP roles through ``load_state_dict``."""

from __future__ import annotations

from typing import Any

from torch import nn

from unitscale.scaling.parameter import role_of, tag


class RoleModule(nn.Module):
    """A module whose own parameters keep their u-μP role when a state dict is loaded into it.

    ``load_state_dict(..., assign=True)`` makes new, untagged parameters; their roles are put
    back. A unit-scaled module of your own subclasses it first: ``class Mine(RoleModule, nn.Linear)``.

    >>> import torch
    >>> from unitscale.nn import Linear
    >>> from unitscale.scaling import role_of
    >>> layer = Linear(4, 4)
    >>> _ = layer.load_state_dict({"weight": torch.zeros(4, 4)}, assign=True)
    >>> role_of(layer.weight).role
    'weight'
    """

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        roles = {name: role_of(param) for name, param in self._parameters.items()}
        super()._load_from_state_dict(*args, **kwargs)
        for name, role in roles.items():
            param = self._parameters.get(name)
            if role is not None and param is not None and role_of(param) is None:
                tag(param, role.role, role.width, role.depth)
