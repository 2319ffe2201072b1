"""Pipeline stages: :func:`partition` and the :class:`StagePlan` it returns, with its report."""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_leaves, tree_structure

from unitscale.capture.toolkit import html_table, normalise_path, stack_entries
from unitscale.errors import CostError, InputError, PlanMismatchError, SplitSpecError, StageCountError
from unitscale.fx.nodes import COMPUTE_OPS, MODULE_PATH_KEY
from unitscale.stages.partitioner import search
from unitscale.stages.partitioner.costs import (
    COST_MODELS,
    _graph_for_stages,
    as_tuple,
    check_input_shapes,
    flat_inputs,
    node_costs,
    node_parameters,
    output_bytes,
    run_profiler,
)
from unitscale.stages.partitioner.cuts import allowed_cuts, check_no_idle_stage
from unitscale.stages.partitioner.plan_files import SavedPlan, load_plan, output_from_leaves, run_chained, save_plan
from unitscale.stages.partitioner.split import chain_stages, live_values, split_graph

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from unitscale.stages.schedules import ChainCosts

__all__ = ["partition", "StagePlan", "StageReport", "StageRow", "bubble_fraction"]

METHODS = ("optimal", "equal_count", "greedy_threshold")


def _not_int_from(least: int, value: Any) -> bool:
    """Whether ``value`` is anything but an int (not a bool) of at least ``least``."""
    return isinstance(value, bool) or not isinstance(value, int) or value < least


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle share ``(p - 1) / (m + p - 1)`` of a GPipe/1F1B pipeline, ``p = num_stages``, ``m = num_microbatches``.

    Raises:
        StageCountError: ``num_stages`` is not an int >= 1.
        InputError: ``num_microbatches`` is not an int >= 1.

    >>> from unitscale.stages import bubble_fraction
    >>> bubble_fraction(4, 8)
    0.2727272727272727
    """
    if _not_int_from(1, num_stages):
        raise StageCountError(f"bubble_fraction: num_stages={num_stages!r} must be an int >= 1")
    if _not_int_from(1, num_microbatches):
        raise InputError(f"bubble_fraction: num_microbatches={num_microbatches!r} must be an int >= 1")
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


@dataclass
class StageRow:
    """One stage of a :class:`StageReport`: its size, cost, parameters and what it sends on.

    ``sends`` lists ``(node name, shape, bytes)`` for each tensor passed to the next stage.

    >>> from unitscale.stages.partitioner import StageRow
    >>> StageRow(0, 3, "fc1", "fc2", 10.0, 0.5, 76, [("fc2", (2, 4), 32)]).bytes_out
    32
    """

    stage: int
    nodes: int
    first: str
    last: str
    cost: float
    share: float
    params: int
    sends: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)

    @property
    def bytes_out(self) -> int:
        """Bytes this stage sends to the next one per (full) batch."""
        return sum(b for _, _, b in self.sends)


@dataclass
class StageReport:
    """Per-stage summary of a :class:`StagePlan` (from :meth:`StagePlan.report`); ``str()`` gives a table.

    >>> import torch
    >>> from unitscale import partition
    >>> from unitscale.examples import MLP
    >>> print(partition(MLP(4, 8), 2, torch.randn(2, 4)).report(num_microbatches=2))
    stage nodes    cost (params)  share    params  sends
        0     2               40  52.6%        40  act[2, 8] (64 B)
        1     1               36  47.4%        36  -
    bubble with 2 microbatches: (p-1)/(m+p-1) = 1/3 = 0.333
    """

    rows: list[StageRow]
    cost: str
    num_microbatches: int
    bubble: float
    #: the certificate of a plan from :func:`~unitscale.stages.plan_pipeline` (see :class:`StagePlan`)
    schedule: str | None = None
    step_time: float | None = None
    lower_bound: float | None = None
    optimal: bool | None = None

    def table(self, full: bool = False, width: int = 88) -> str:
        """The report as a plain-text table; a stage's sends that overflow the line are counted (``+2 more``).

        Args:
            full: name every tensor a stage sends, however long the line.
            width: the most characters a line may take when ``full`` is false (at least 72).

        Raises:
            InputError: ``width`` is not an int of at least 72.

        >>> from unitscale.stages.partitioner import StageReport, StageRow
        >>> sends = [(f"add_{i}", (4, 32, 64), 32768) for i in range(6)]
        >>> rows = [StageRow(0, 9, "x", "add_5", 9.0, 0.5, 64, sends),
        ...         StageRow(1, 9, "y", "out", 9.0, 0.5, 64)]
        >>> report = StageReport(rows, "params", num_microbatches=2, bubble=1 / 3)
        >>> print(report.table(width=80))
        stage nodes    cost (params)  share    params  sends
            0     9                9  50.0%        64  6 tensors (196,608 B)
            1     9                9  50.0%        64  -
        bubble with 2 microbatches: (p-1)/(m+p-1) = 1/3 = 0.333
        """
        if _not_int_from(72, width):
            raise InputError(f"StageReport.table(width={width!r}): pass an int of at least 72 (characters per line)")
        lines = [f"{'stage':>5} {'nodes':>5} {'cost (' + self.cost + ')':>16} {'share':>6} {'params':>9}  sends"]
        for r in self.rows:
            head = f"{r.stage:>5} {r.nodes:>5} {r.cost:>16.4g} {r.share:>6.1%} {r.params:>9,}  "
            lines.append(head + _sends_cell(r, None if full else width - len(head)))
        p, m = len(self.rows), self.num_microbatches
        lines.append(f"bubble with {m} microbatches: (p-1)/(m+p-1) = {p - 1}/{m + p - 1} = {self.bubble:.3f}")
        if self.step_time is not None and self.lower_bound is not None:
            lines.append(f"planned for {self.schedule}: {_certificate(self.step_time, self.lower_bound, self.optimal)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        """The report as an HTML table for a notebook, the bubble and certificate as its caption."""
        header = ["stage", "nodes · params", f"cost ({self.cost})", "share", "sends"]
        lines = [
            [str(r.stage), f"{r.nodes} · {r.params:,}", f"{r.cost:.4g}", f"{r.share:.1%}", _sends_cell(r, None)]
            for r in self.rows
        ]
        return html_table(header, lines, "\n".join(self.table().splitlines()[len(self.rows) + 1 :]))


def _sends_cell(row: StageRow, room: int | None) -> str:
    """What ``row`` sends, in ``room`` characters when it can: the largest tensors first, the rest counted."""
    if not row.sends:
        return "-"
    total = f" ({row.bytes_out:,} B)"
    named = [f"{name}{list(shape)}" for name, shape, _ in row.sends]
    if room is None or len(", ".join(named) + total) <= room:
        return ", ".join(named) + total
    largest = [named[i] for i in sorted(range(len(named)), key=lambda i: -row.sends[i][2])]
    for keep in range(len(largest) - 1, 0, -1):
        cell = ", ".join(largest[:keep]) + f" +{len(largest) - keep} more" + total
        if len(cell) <= room:
            return cell
    return f"{len(named)} tensor{'' if len(named) == 1 else 's'}" + total


def _certificate(step_time: float, lower_bound: float, optimal: bool | None) -> str:
    """The simulated step and how far from optimal it can be, in words."""
    if optimal:
        return f"simulated step {step_time:.4g} s, proven optimal (lower bound {lower_bound:.4g} s)"
    gap = step_time / lower_bound - 1 if lower_bound > 0 else math.inf
    return f"simulated step {step_time:.4g} s, within {gap:.2%} of optimal (lower bound {lower_bound:.4g} s)"


class StagePlan:
    """A contiguous split of a traced model into stages, made by :func:`partition`.

    Attributes:
        cost: the cost model's name (``"callable"`` for a function).
        node_costs: ``(node name, cost)`` for every compute node, in execution order.
        assignment: node name -> stage index (contiguous, starting at 0).
        bounds: node-index bounds, stage ``s`` holds ``node_costs[bounds[s]:bounds[s + 1]]``.
        pieces: node-index bounds of the places a cut is allowed; ``bounds`` is a subsequence of it.
        route: how the graph was had: ``"graph"`` (a GraphModule given), ``"fx"`` or ``"export"``.
        output_spec: the pytree structure of the model's output; the last stage returns its leaves.
        schedule: the schedule :func:`~unitscale.stages.plan_pipeline` planned for (``None`` for
            plans made by :func:`partition` or :meth:`with_bounds`; likewise the three below).
        step_time: the simulated step time in seconds of this split under ``schedule``.
        lower_bound: a proven lower bound on the simulated step time of every split that fits
            the memory limit.
        optimal: whether the planner's search finished, proving ``step_time`` the least
            (``False``: its budget ran out, and ``step_time / lower_bound - 1`` bounds the gap).

    >>> import torch
    >>> from unitscale import partition
    >>> from unitscale.examples import MLP
    >>> plan = partition(MLP(4, 8), 2, torch.randn(2, 4))
    >>> plan
    StagePlan(MLP, 2 stages by params: [40, 36])
    >>> [type(m).__name__ for m in plan.stage_modules()], plan.split().submod_1.fc2
    (['MLPStage0', 'MLPStage1'], Linear(in_features=8, out_features=4, bias=True))
    """

    def __init__(
        self,
        root: nn.Module,
        graph: fx.Graph,
        node_costs: list[tuple[str, float]],
        bounds: list[int],
        cost: str,
        example_inputs: tuple[Any, ...],
        pieces: list[int] | None = None,
        route: str = "fx",
        output_spec: TreeSpec | None = None,
        model_name: str | None = None,
        parameter_names: dict[str, str] | None = None,
        *,
        chain_costs: ChainCosts | None = None,
        schedule: str | None = None,
        step_time: float | None = None,
        lower_bound: float | None = None,
        optimal: bool | None = None,
    ) -> None:
        self._root = root
        # every name a parameter of the user's model answers to -> its name in model.named_parameters()
        self._parameter_names = parameter_names or {}
        self.model_name = model_name or type(root).__name__
        self.route = route
        self.output_spec = output_spec
        self.graph = graph
        self.pieces = pieces if pieces is not None else list(range(len(node_costs) + 1))
        self.node_costs = node_costs
        self.bounds = bounds
        self.cost = cost
        self.num_stages = len(bounds) - 1
        self.assignment = {
            name: s for s, (a, b) in enumerate(itertools.pairwise(bounds)) for name, _ in node_costs[a:b]
        }
        self.stage_costs = search.stage_sums([c for _, c in node_costs], bounds)
        self._example_inputs = example_inputs
        #: per-node schedule costs (forward, backward, memory, traffic), given by ``plan_pipeline``
        self.chain_costs = chain_costs
        self.schedule = schedule
        self.step_time = step_time
        self.lower_bound = lower_bound
        self.optimal = optimal

    def with_bounds(
        self,
        bounds: list[int],
        *,
        chain_costs: ChainCosts | None = None,
        schedule: str | None = None,
        step_time: float | None = None,
        lower_bound: float | None = None,
        optimal: bool | None = None,
    ) -> StagePlan:
        """The same model and node costs split at other node-index ``bounds`` (a subsequence of ``pieces``).

        The new plan keeps this one's ``chain_costs`` unless others are given, but not its
        ``schedule``, ``step_time``, ``lower_bound`` or ``optimal``: those belong to this split.

        >>> import torch
        >>> from torch import nn
        >>> from unitscale import partition
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
        >>> plan = partition(model, 2, torch.randn(1, 2))
        >>> plan.with_bounds([0, 1, 3]).stage_costs
        [6.0, 6.0]
        """
        pieces = set(self.pieces)
        if bounds[0] != 0 or bounds[-1] != len(self.node_costs) or any(b not in pieces for b in bounds):
            raise StageCountError(
                f"bounds {bounds} must run from 0 to {len(self.node_costs)} through allowed cuts (plan.pieces)"
            )
        if any(b <= a for a, b in itertools.pairwise(bounds)):
            raise StageCountError(f"bounds {bounds} hold an empty stage; every stage needs at least one node")
        return StagePlan(
            self._root,
            self.graph,
            self.node_costs,
            list(bounds),
            self.cost,
            self._example_inputs,
            self.pieces,
            self.route,
            self.output_spec,
            self.model_name,
            self._parameter_names,
            chain_costs=chain_costs if chain_costs is not None else self.chain_costs,
            schedule=schedule,
            step_time=step_time,
            lower_bound=lower_bound,
            optimal=optimal,
        )

    @functools.cached_property
    def module(self) -> fx.GraphModule:
        """The traced copy of the model, made on first use (its code generation costs as much as the trace)."""
        return fx.GraphModule(self._root, self.graph, self.model_name)

    def __repr__(self) -> str:
        costs = ", ".join(f"{c:.4g}" for c in self.stage_costs)
        planned = ""
        if self.step_time is not None and self.lower_bound is not None:
            proof = "optimal" if self.optimal else f"gap <= {self.step_time / self.lower_bound - 1:.2%}"
            planned = f"; {self.schedule} step {self.step_time:.4g} s, {proof}"
        return f"StagePlan({self.model_name}, {self.num_stages} stages by {self.cost}: [{costs}]{planned})"

    def _repr_html_(self) -> str:
        """The plan in a notebook: its :meth:`report` as a table (8 microbatches), under its ``repr``."""
        from html import escape  # here, not at the top: only a notebook's display needs it

        return f"<p><code>{escape(repr(self))}</code></p>" + self.report()._repr_html_()

    @property
    def bottleneck(self) -> float:
        """Cost of the most expensive stage."""
        return max(self.stage_costs)

    @property
    def imbalance(self) -> float:
        """Bottleneck over the ideal ``total / num_stages`` (1.0 is perfect balance)."""
        total = sum(self.stage_costs)
        return self.bottleneck / (total / self.num_stages) if total else 1.0

    def costs_under(self, other: StagePlan) -> list[float]:
        """This plan's stage costs measured with ``other``'s node costs (same model).

        Raises:
            InputError: ``other`` is not a :class:`StagePlan`.
            PlanMismatchError: ``other`` has no cost for some of this plan's nodes (a plan of another
                model or graph).

        >>> import torch
        >>> from torch import nn
        >>> from unitscale import partition
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        >>> x = torch.randn(2, 4)
        >>> partition(model, 2, x).costs_under(partition(model, 1, x, cost="flops"))
        [64.0, 64.0]
        """
        if not isinstance(other, StagePlan):
            raise InputError(
                f"costs_under(other=...) got {type(other).__name__}; pass a StagePlan of the same model "
                "(partition(model, 1, example_inputs, cost=...))"
            )
        lookup = dict(other.node_costs)
        missing = [name for name, _ in self.node_costs if name not in lookup]
        if missing:
            raise PlanMismatchError(
                f"costs_under(other={other!r}): other has no cost for {len(missing)} of this plan's "
                f"{len(self.node_costs)} nodes (first {missing[:3]}); it is a plan of another model or "
                f"graph. Pass a plan of the same {self.model_name} captured from the same example inputs"
            )
        sums = [0.0] * self.num_stages
        for name, _ in self.node_costs:
            sums[self.assignment[name]] += lookup[name]
        return sums

    def split(self) -> fx.GraphModule:
        """The :func:`~torch.fx.passes.split_module.split_module` result, ``submod_0`` ... ``submod_{N-1}``.

        A weight shared by several stages lives in each submodule that uses it.
        """
        return split_graph(self.module, self.assignment)

    def stage_modules(self) -> list[fx.GraphModule]:
        """One module per stage, chained: stage ``s + 1`` takes what stage ``s`` returns.

        Stage 0 takes the model's inputs (flattened, for an exported model); the last stage returns
        the leaves of the model's output, which :meth:`output_from_leaves` rebuilds.
        """
        return chain_stages(self.module, self.assignment, self.num_stages)

    def verify(self, *inputs: Any) -> bool:
        """Whether :meth:`split` and the chained :meth:`stage_modules` reproduce the model exactly.

        Args:
            *inputs: model inputs (default: the example inputs given to :func:`partition`).

        Raises:
            InputError: the inputs do not fit the model, or (an exported graph) a size the
                graph was captured with differs.
        """
        args = inputs or self._example_inputs
        check_input_shapes(self.graph, flat_inputs(self.graph, args), "verify()")
        stages = self.stage_modules()

        def chained(*xs: Any) -> Any:
            return self.output_from_leaves(run_chained(stages, flat_inputs(self.graph, xs)))

        outputs = []
        for fn in (self.module, self.split(), chained):
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(0)
                try:
                    outputs.append(tree_flatten(fn(*args))[0])
                except Exception as exc:
                    raise InputError(
                        f"verify() could not run {type(self.module).__name__} on the given inputs: "
                        f"{type(exc).__name__}: {exc}; pass inputs like the example inputs"
                    ) from exc
        reference = outputs[0]
        return all(
            len(out) == len(reference)
            and all(
                torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(out, reference, strict=True)
            )
            for out in outputs[1:]
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the stage modules (graphs and weights) and the output structure to ``path``, as data.

        :meth:`load` reads it back without the model's class. A failed or killed save leaves the
        old file as it was.

        Raises:
            PlanSaveError: the directory is missing, ``path`` is a directory, or a stage holds
                something that is not data (a user's leaf module, a hook, a function on a layer).

        >>> import tempfile, torch
        >>> from unitscale import StagePlan, partition
        >>> from unitscale.examples import MLP
        >>> path = tempfile.mkdtemp() + "/plan.pt"
        >>> partition(MLP(4, 8), 2, torch.randn(2, 4)).save(path)
        >>> StagePlan.load(path).num_stages
        2
        """
        save_plan(self, path)

    @staticmethod
    def load(path: str | os.PathLike[str], *, functions: Sequence[Callable[..., Any]] = ()) -> SavedPlan:
        """Read what :meth:`save` wrote: a :class:`~unitscale.stages.SavedPlan` (stage modules, output structure).

        Nothing in the file runs: it is read with ``torch.load(weights_only=True)``, every field checked.

        Args:
            functions: functions the plan's graphs may call beyond the allow-list (``torch``,
                ``operator``, ``math``, ``einops``, ``unitscale.functional``), such as
                ``[torchvision.ops.stochastic_depth]``; the error for a plan that needs one names it.

        Raises:
            PlanFileError: not a path, no file, a file that is not a plan (an older pickled plan,
                a crafted file), or a field that fails its check; the message says which.
        """
        return load_plan(path, functions)

    def output_from_leaves(self, out: Any) -> Any:
        """The model's output rebuilt from what the last stage returns (one tensor or a tuple of leaves).

        >>> import torch
        >>> from unitscale import partition
        >>> from unitscale.examples import MLP
        >>> plan = partition(MLP(4, 8), 2, torch.randn(2, 4))
        >>> plan.output_from_leaves(torch.ones(1)).shape  # MLP returns one tensor
        torch.Size([1])
        """
        return output_from_leaves(out, self.output_spec)

    def stage_parameter_names(self) -> list[list[str]]:
        """Per stage, the qualified names (as in the model) of the parameters its nodes use, in first-use order.

        >>> import torch
        >>> from unitscale import partition
        >>> from unitscale.examples import MLP
        >>> partition(MLP(4, 8), 2, torch.randn(2, 4)).stage_parameter_names()
        [['fc1.weight', 'fc1.bias'], ['fc2.weight', 'fc2.bias']]
        """
        names: list[list[str]] = [[] for _ in range(self.num_stages)]
        for node in self.compute_nodes():
            stage = names[self.assignment[node.name]]
            stage += [n for n, _ in node_parameters(self._root, node) if n not in stage]
        return names

    @functools.cached_property
    def _gradient_keys(self) -> dict[str, str]:
        """Each name a stage may give a parameter -> the model's name for it; tied weights' gradients sum
        under one key, though stages in different processes read them under different names."""
        aliases: dict[int, list[str]] = {}
        for name, p in self._root.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        keys: dict[str, str] = {}
        for names in aliases.values():
            key = next((self._parameter_names[n] for n in names if n in self._parameter_names), names[0])
            keys.update(dict.fromkeys(names, key))
        return keys

    def gradient_key(self, name: str) -> str:
        """The model's name (as ``model.named_parameters()`` gives it) for a stage's parameter ``name``.

        >>> import torch
        >>> from torch import nn
        >>> from unitscale import partition
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        >>> model[2].weight = model[0].weight
        >>> plan = partition(model, 2, torch.randn(2, 4))
        >>> plan.gradient_key("2.weight"), plan.gradient_key("2.bias")
        ('0.weight', '2.bias')
        """
        return self._gradient_keys.get(name, name)

    def split_spec(self) -> dict[str, Any]:
        """The ``split_spec`` for :func:`torch.distributed.pipelining.pipeline` that makes the same stages.

        Each cut must fall right before the first node of a submodule that runs once per forward
        pass: torch splits before *every* call of a module named in the spec.

        Returns:
            ``{qualified module name: SplitPoint.BEGINNING}``, one entry per cut.

        Raises:
            SplitSpecError: a cut falls inside a module (or between ops of the root module),
                or only before a module that runs more than once; partition with
                ``boundary_depth=`` so that cuts land between modules that run once.

        >>> import torch
        >>> from unitscale import partition
        >>> from unitscale.examples import TinyGPT
        >>> model = TinyGPT(vocab_size=16, d_model=16, n_layers=4, n_heads=2, seq_len=8)
        >>> idx = torch.randint(0, 16, (2, 8))
        >>> partition(model, 2, idx, boundary_depth=2).split_spec()
        {'blocks.2': <SplitPoint.BEGINNING: 1>}
        """
        # lazy: torch.distributed.pipelining adds 4.6 s to `import unitscale` (python -X importtime)
        from torch.distributed.pipelining import SplitPoint

        nodes = self.compute_nodes()
        paths = [str(n.meta.get(MODULE_PATH_KEY, "")) for n in nodes]
        called = _called_modules(self._root, self.graph)
        calls = _call_counts(self.graph)
        spec: dict[str, Any] = {}
        for b in self.bounds[1:-1]:
            starting = _modules_starting_at(paths, b, called)
            module = next((q for q in starting if calls is None or calls.get(q, 1) == 1), None)
            if module is None:
                node = nodes[b]
                where = (
                    f"the cut before node {node.name!r} (module {paths[b] or '<root>'!r}, after a node of "
                    f"{paths[b - 1] or '<root>'!r})"
                )
                if starting and calls is not None:
                    inner = f", as do the {len(starting) - 1} inside it that start there" if len(starting) > 1 else ""
                    raise SplitSpecError(
                        f"{where} falls only before modules that run more than once in a forward pass "
                        f"({starting[0]!r} runs {calls.get(starting[0], 1)} times{inner}), and torch's pipeline() "
                        "splits before every call of a module named in a split_spec; partition with another "
                        "boundary_depth= or num_stages so that every cut lands before a module that runs once, "
                        "or run this plan with run_pipeline"
                    )
                raise SplitSpecError(
                    f"{where} does not fall on a module boundary, so no split_spec can "
                    "express it; partition with boundary_depth= (e.g. boundary_depth=3 for model.layers.N) "
                    "so that every cut lands right before a submodule"
                )
            spec[module] = SplitPoint.BEGINNING
        return spec

    @property
    def root(self) -> nn.Module:
        """The traced copy of the model whose parameters and submodules the graph reads (not the user's module)."""
        return self._root

    def compute_nodes(self) -> list[fx.Node]:
        """The graph's compute nodes in execution order, one per :attr:`node_costs` entry.

        >>> import torch
        >>> from unitscale import partition
        >>> plan = partition(torch.nn.Linear(2, 2), 1, torch.randn(1, 2))
        >>> [n.name for n in plan.compute_nodes()]
        ['linear']
        """
        by_name = {n.name: n for n in self.graph.nodes}
        return [by_name[name] for name, _ in self.node_costs]

    def report(self, num_microbatches: int = 8) -> StageReport:
        """Per stage: cost, share of the total, parameters and the tensors sent on (a :class:`StageReport`)."""
        total = sum(self.stage_costs) or 1.0
        live = live_values(self.graph, self.assignment, self.num_stages)[:-1] + [[]]  # the last stage sends nothing
        names = [name for name, _ in self.node_costs]
        rows = []
        for s, (stage, (a, b)) in enumerate(zip(self.stage_modules(), itertools.pairwise(self.bounds), strict=True)):
            metas = [(v.name, v.meta.get("tensor_meta")) for v in live[s]]
            sends = [(name, tuple(getattr(meta, "shape", ())), output_bytes(meta)) for name, meta in metas]
            params = sum(p.numel() for p in stage.parameters())
            cost = self.stage_costs[s]
            rows.append(StageRow(s, b - a, names[a], names[b - 1], cost, cost / total, params, sends))
        bubble = bubble_fraction(self.num_stages, num_microbatches)
        return StageReport(
            rows, self.cost, num_microbatches, bubble, self.schedule, self.step_time, self.lower_bound, self.optimal
        )

    def plot(self, ax: Axes | None = None, compare: dict[str, StagePlan] | None = None) -> Axes:
        """Bar chart of stage costs against the ideal ``total / num_stages``.

        Args:
            compare: other plans of the same model, drawn next to this one and
                measured with this plan's node costs.
        """
        # lazy: matplotlib.pyplot adds 1.9 s to `import unitscale` (python -X importtime); only plots need it
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        plans = {f"{self.cost} (optimal)" if compare else self.cost: self.stage_costs}
        plans |= {label: other.costs_under(self) for label, other in (compare or {}).items()}
        width = 0.8 / len(plans)
        for i, (label, costs) in enumerate(plans.items()):
            xs = [s + (i - (len(plans) - 1) / 2) * width for s in range(len(costs))]
            ax.bar(xs, costs, width=width, label=label)
        ideal = sum(self.stage_costs) / self.num_stages
        ax.axhline(ideal, color="k", linestyle="--", linewidth=1, label="ideal")
        ax.set(xticks=range(self.num_stages), xlabel="stage", ylabel=f"cost ({self.cost})")
        # The legend goes in a band of headroom above the tallest bar, never over a bar.
        ncols = min(len(plans) + 1, 3)
        rows = math.ceil((len(plans) + 1) / ncols)
        top = max([ideal, *(c for costs in plans.values() for c in costs)])
        ax.set_ylim(0, top * (1.08 + 0.16 * rows))
        ax.legend(fontsize=9, loc="upper center", ncols=ncols, frameon=False)
        return ax


def _called_modules(root: nn.Module, graph: fx.Graph) -> set[str] | None:
    """Qualified names of the modules whose ``forward`` ran (torch's pipeline cannot split at a ``ModuleList``)."""
    stacks = [(node.meta.get("nn_module_stack") or {}).values() for node in graph.nodes]
    called = {normalise_path(str(path)) for stack in stacks for path, *_ in stack}
    if called:
        return called
    containers = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
    return {name for name, m in root.named_modules() if name and not isinstance(m, containers)} or None


def _modules_starting_at(paths: list[str], b: int, called: set[str] | None) -> list[str]:
    """The called submodules whose nodes all lie at or after ``b`` and which hold node ``b``, outermost first."""
    parts = paths[b].split(".") if paths[b] else []
    holding = [".".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    return [
        q
        for q in holding
        if (called is None or q in called) and not any(p == q or p.startswith(q + ".") for p in paths[:b])
    ]


def _call_counts(graph: fx.Graph) -> dict[str, int] | None:
    """How many times each module's ``forward`` ran while the graph was captured (``nn_module_stack`` keys)."""
    keys: dict[str, set[str]] = {}
    for node in graph.nodes:
        for key, path, _ in stack_entries(node) or ():
            keys.setdefault(path, set()).add(key)
    return {path: len(k) for path, k in keys.items()} or None


def _output_spec(graph: fx.Graph, output: Any) -> TreeSpec | None:
    """The structure of the model's ``output``, when its leaves are the output node's."""
    spec = tree_structure(output)
    return spec if spec.num_leaves == len(tree_leaves(graph.output_node().args[0])) else None


def partition(
    module: nn.Module,
    num_stages: int,
    example_inputs: Any,
    cost: str | Callable[[fx.Node], float] = "params",
    *,
    boundary_depth: int | None = None,
    method: str = "optimal",
    repeats: int = 5,
) -> StagePlan:
    """Split ``module`` into ``num_stages`` contiguous stages with the smallest possible largest stage cost.

    The model is copied (``module`` is not changed) and run once on ``example_inputs``: a
    :class:`torch.fx.GraphModule` is used as it is, other modules are traced with ``torch.fx`` or,
    where that fails, exported with ``torch.export`` (batch dimension dynamic). Cuts fall only where
    nothing but tensors crosses; a constant input (``attn_mask=None``) never stops one.

    Args:
        example_inputs: a tensor or a tuple of the model's inputs.
        cost: ``"params"`` (parameter elements each node uses, counted once),
            ``"flops"`` (:class:`~torch.utils.flop_counter.FlopCounterMode` per node, with grad
            enabled: the forward training runs, not an inference fast path the counter misses),
            ``"time"`` (median of ``repeats`` timings per node), ``"memory"``
            (bytes of each node's output), or a callable ``node -> float``.
        boundary_depth: cut only where the module path truncated to this many
            parts changes (``2`` cuts ``TinyGPT`` only between ``blocks.N``).
        method: ``"optimal"`` (exact min-max, the most even such split when that search is cheap), or a
            baseline: ``"equal_count"`` (the same number of pieces per stage), ``"greedy_threshold"``
            (close a stage once it reaches ``total / num_stages``).
        repeats: timings per node for ``cost="time"``, an int >= 1 (other costs ignore it).

    Raises:
        StageCountError: ``num_stages`` below 1 or above the number of places to cut.
        CostError: unknown ``cost`` or ``method``, ``repeats`` not an int >= 1, a callable
            returned a negative, NaN or non-number, or torch's FLOP counter failed on a node
            that runs without it (``cost="flops"``).
        InputError: ``example_inputs`` do not fit the model.
        NoRouteError: neither ``torch.fx`` nor ``torch.export`` can capture the model (a
            :class:`~unitscale.errors.TraceError`); the message gives each route's reason.
        NotAModuleError: ``module`` is not a ``torch.nn.Module``.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> model = nn.Sequential(
    ...     nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)
    ... )
    >>> plan = partition(model, 2, torch.randn(3, 4))
    >>> plan.stage_costs, plan.assignment
    ([40.0, 90.0], {'_0': 0, '_1': 0, '_2': 1, '_3': 1, '_4': 1})
    """
    if _not_int_from(1, num_stages):
        raise StageCountError(f"num_stages={num_stages!r} must be an int >= 1")
    if not callable(cost) and cost not in COST_MODELS:
        raise CostError(
            f"unknown cost model {cost!r}; use one of {', '.join(map(repr, COST_MODELS))} or a callable node -> float"
        )
    if method not in METHODS:
        raise CostError(f"unknown method {method!r}; use one of {', '.join(map(repr, METHODS))}")
    if _not_int_from(1, repeats):
        raise CostError(
            f"partition: repeats={repeats!r} must be an int >= 1 (how many times cost='time' times each node)"
        )
    if boundary_depth is not None and _not_int_from(1, boundary_depth):
        raise StageCountError(
            f"boundary_depth={boundary_depth!r} must be None or an int >= 1 (module path depth to cut at)"
        )
    inputs = as_tuple(example_inputs)
    root, graph, route = _graph_for_stages(module, inputs)
    profiler = run_profiler(root, graph, inputs, count_flops=cost == "flops", repeats=repeats if cost == "time" else 0)
    nodes = [n for n in graph.nodes if n.op in COMPUTE_OPS]
    name = type(module).__name__
    if not nodes:
        raise StageCountError(f"{name} has no compute nodes to split into num_stages={num_stages}")
    costs = node_costs(root, nodes, profiler, cost)
    allowed = allowed_cuts(nodes, boundary_depth)
    unit_bounds = [0, *[i for i in range(1, len(nodes)) if allowed[i]], len(nodes)]
    units = len(unit_bounds) - 1
    if num_stages > units:
        where = f" at module depth {boundary_depth}" if boundary_depth is not None else ""
        raise StageCountError(
            f"num_stages={num_stages} is more than the {units} pieces {name} can be cut into{where}; "
            f"use num_stages <= {units}" + (" or a larger boundary_depth" if boundary_depth is not None else "")
        )
    unit_costs = search.stage_sums(costs, unit_bounds)
    if method == "optimal":
        chosen = search.optimal_bounds(unit_costs, num_stages)
        # same bottleneck, most even elsewhere (a stage of cost 0 beside the heaviest helps nobody)
        balanced = search.balanced_bounds(unit_costs, num_stages, limit=search.bottleneck(unit_costs, chosen))
        candidates = [option for option in (chosen, balanced) if option is not None]
        chosen = min(candidates, key=functools.partial(search.sum_of_squares, unit_costs))
    elif method == "equal_count":
        chosen = search.equal_count_bounds(units, num_stages)
    else:
        chosen = search.greedy_threshold_bounds(unit_costs, num_stages)
    bounds = [unit_bounds[i] for i in chosen]
    cost_name = cost if isinstance(cost, str) else "callable"
    if method == "optimal":
        stage_costs = search.stage_sums(costs, bounds)
        check_no_idle_stage(name, num_stages, nodes, costs, stage_costs, allowed, boundary_depth, cost_name)
    return StagePlan(
        root,
        graph,
        [(n.name, c) for n, c in zip(nodes, costs, strict=True)],
        bounds,
        cost_name,
        inputs,
        unit_bounds,
        route=route,
        output_spec=_output_spec(graph, profiler.result),
        model_name=name,
        parameter_names=_parameter_names(module),
    )


def _parameter_names(module: nn.Module) -> dict[str, str]:
    """Every name a parameter of ``module`` answers to -> the first (``module.named_parameters()``'s)."""
    first: dict[int, str] = {}
    return {name: first.setdefault(id(p), name) for name, p in module.named_parameters(remove_duplicate=False)}
