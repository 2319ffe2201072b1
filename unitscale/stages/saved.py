"""A stage plan on disk: the stage modules (their code and weights) and the model's output structure.

What :meth:`~unitscale.StagePlan.save` writes and :meth:`~unitscale.StagePlan.load` reads:
a ``torch.save`` file of the chained stage :class:`~torch.fx.GraphModule`\\ s. A GraphModule
pickles as its generated code plus its submodules and tensors, so loading needs neither
the model's class nor the code that traced it (only the classes of leaf modules the
trace kept, such as ``nn.Linear``, and those the output structure names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import fx
from torch.utils._pytree import TreeSpec, tree_structure, tree_unflatten

from unitscale.errors import InputError


class _Plan(Protocol):
    """What :meth:`SavedPlan.from_plan` reads of a :class:`~unitscale.StagePlan` (no import of plan.py,
    which imports this module for ``StagePlan.save``)."""

    output_spec: TreeSpec | None
    model_name: str
    stage_costs: list[float]

    def stage_modules(self) -> list[fx.GraphModule]: ...


__all__ = ["SavedPlan", "load_plan", "save_plan"]

_FORMAT = "unitscale.stages.saved/1"


@dataclass
class SavedPlan:
    """The runnable part of a :class:`~unitscale.StagePlan`: what :func:`~unitscale.stages.pipeline_stage` needs.

    >>> import torch
    >>> from unitscale import partition
    >>> from unitscale.examples import MLP
    >>> from unitscale.stages import SavedPlan
    >>> SavedPlan.from_plan(partition(MLP(4, 8), 2, torch.randn(2, 4))).num_stages
    2

    Attributes:
        stage_modules: one module per stage, chained (see :meth:`~unitscale.StagePlan.stage_modules`).
        output_spec: the model's output structure, or ``None`` for one tensor.
        model_name: the model's class name.
        stage_costs: the plan's cost of each stage.
    """

    stage_modules: list[fx.GraphModule]
    output_spec: TreeSpec | None
    model_name: str
    stage_costs: list[float]

    @property
    def num_stages(self) -> int:
        """Number of stages."""
        return len(self.stage_modules)

    @classmethod
    def from_plan(cls, plan: _Plan) -> SavedPlan:
        """The stage modules and output structure of ``plan`` (a :class:`~unitscale.StagePlan`)."""
        if not callable(getattr(plan, "stage_modules", None)) or not hasattr(plan, "output_spec"):
            raise InputError(
                f"expected a StagePlan, a SavedPlan or a path to a saved plan, got {type(plan).__name__} "
                f"{plan!r:.60}; make one with unitscale.partition(model, num_stages, example_inputs)"
            )
        return cls(plan.stage_modules(), plan.output_spec, plan.model_name, list(plan.stage_costs))

    def output_from_leaves(self, out: Any) -> Any:
        """The model's output rebuilt from what the last stage returns."""
        if self.output_spec is None:
            return out
        leaves = list(out) if isinstance(out, tuple) and self.output_spec.num_leaves != 1 else [out]
        return tree_unflatten(leaves, self.output_spec)

    def __call__(self, *inputs: Any) -> Any:
        """Run the stages one after the other in this process (a reference for the pipeline)."""
        out: Any = self.stage_modules[0](*inputs)
        for stage in self.stage_modules[1:]:
            out = stage(*out) if isinstance(out, tuple) else stage(out)
        return self.output_from_leaves(out)


def save_plan(plan: _Plan | SavedPlan, path: str | os.PathLike[str]) -> None:
    """Write ``plan``'s stage modules and output structure to ``path`` (``torch.save``)."""
    saved = plan if isinstance(plan, SavedPlan) else SavedPlan.from_plan(plan)
    torch.save(
        {
            "format": _FORMAT,
            "stage_modules": saved.stage_modules,
            # a TreeSpec unpickles with a deprecation warning in torch 2.13; an example of the
            # structure (ints for leaves) pickles as plain objects and gives the spec back
            "output_example": None
            if saved.output_spec is None
            else tree_unflatten(list(range(saved.output_spec.num_leaves)), saved.output_spec),
            "model_name": saved.model_name,
            "stage_costs": saved.stage_costs,
        },
        path,
    )


def load_plan(path: str | os.PathLike[str]) -> SavedPlan:
    """Read a plan :func:`save_plan` wrote. The file is unpickled: load only files you trust."""
    try:
        data = torch.load(path, weights_only=False)
    except FileNotFoundError as exc:
        raise InputError(f"no saved plan at {os.fspath(path)!r}; write one with plan.save(path)") from exc
    except Exception as exc:
        raise InputError(
            f"{os.fspath(path)!r} could not be loaded as a saved plan ({type(exc).__name__}: {exc}); "
            "write it with StagePlan.save(path)"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise InputError(f"{os.fspath(path)!r} is not a plan written by StagePlan.save (format {_FORMAT!r})")
    example = data["output_example"]
    spec = None if example is None else tree_structure(example)
    return SavedPlan(data["stage_modules"], spec, data["model_name"], data["stage_costs"])
