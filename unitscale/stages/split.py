"""Turning a node -> stage assignment into modules: one split module, or a chain of stages.

:func:`split_graph` uses :func:`torch.fx.passes.split_module.split_module` and then
moves every parameter, buffer or constant reached through ``get_attr`` from the
root into the submodules that use it (a pipeline stage must own its weights).
:func:`chain_stages` builds stages that only talk to their neighbours: stage ``s``
takes exactly the values crossing into it and returns those crossing out,
passing through values a later stage still needs, as a pipeline requires.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from unitscale.fx.nodes import COMPUTE_OPS

__all__ = ["live_values", "split_graph", "chain_stages"]



class StageTracer(fx.Tracer):
    """Tracer that unpickling a stage uses to rebuild it: buffers stay ``get_attr`` nodes."""

    proxy_buffer_attributes = True


def _stage_of(node: fx.Node, assignment: Mapping[str, int], num_stages: int) -> int:
    if node.op == "placeholder":
        return -1
    if node.op == "output":
        return num_stages
    return assignment[node.name]


def live_values(graph: fx.Graph, assignment: Mapping[str, int], num_stages: int) -> list[list[fx.Node]]:
    """``live[s]``: values (placeholders or computed nodes) made at or before stage ``s`` and used after it.

    ``live[num_stages - 1]`` holds the values the output needs. ``get_attr`` nodes
    never cross: each stage gets its own reference.
    """
    live: list[list[fx.Node]] = [[] for _ in range(num_stages)]
    for node in graph.nodes:
        if node.op not in ("placeholder", *COMPUTE_OPS) or not node.users:
            continue
        made = _stage_of(node, assignment, num_stages)
        last = max(_stage_of(u, assignment, num_stages) for u in node.users)
        for s in range(max(made, 0), min(last, num_stages)):
            live[s].append(node)
    return live


def _owner_and_name(root: nn.Module, target: str) -> tuple[nn.Module, str]:
    *path, name = target.split(".")
    owner = root
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _move_get_attrs(split: fx.GraphModule) -> None:
    """Move each root ``get_attr`` into every submodule that uses it (shared ones into each)."""
    for attr_node in [n for n in split.graph.nodes if n.op == "get_attr"]:
        owner, name = _owner_and_name(split, attr_node.target)
        value = getattr(owner, name)
        for user in list(attr_node.users):
            sub = split.get_submodule(user.target)
            assert isinstance(sub, fx.GraphModule)
            position = user.args.index(attr_node)
            placeholder = [n for n in sub.graph.nodes if n.op == "placeholder"][position]
            local = attr_node.target.replace(".", "_")
            while hasattr(sub, local):
                local += "_"
            if isinstance(value, nn.Parameter):
                sub.register_parameter(local, value)
            elif isinstance(value, torch.Tensor):
                sub.register_buffer(local, value)
            else:
                setattr(sub, local, value)
            first_compute = next(n for n in sub.graph.nodes if n.op != "placeholder")
            with sub.graph.inserting_before(first_compute):
                got = sub.graph.get_attr(local)
            got.meta = dict(placeholder.meta)
            placeholder.replace_all_uses_with(got)
            sub.graph.erase_node(placeholder)
            sub.recompile()
            user.args = tuple(a for a in user.args if a is not attr_node)
        split.graph.erase_node(attr_node)
        if hasattr(owner, name):
            delattr(owner, name)
    split.delete_all_unused_submodules()
    split.recompile()


def split_graph(module: fx.GraphModule, assignment: Mapping[str, int]) -> fx.GraphModule:
    """``split_module`` with a pure-lookup callback, then weights moved into their stages."""
    split = split_module(module, module, lambda node: assignment[node.name])
    _move_get_attrs(split)
    return split


def chain_stages(module: fx.GraphModule, assignment: Mapping[str, int], num_stages: int) -> list[fx.GraphModule]:
    """One module per stage; stage ``s + 1`` takes stage ``s``'s outputs as its positional inputs.

    Stage 0 takes the model's inputs. A stage with one value crossing out returns
    it as is, several as a tuple. The last stage returns what the model returns.
    """
    graph = module.graph
    live = live_values(graph, assignment, num_stages)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    stages = []
    for s in range(num_stages):
        g = fx.Graph(tracer_cls=StageTracer)
        env: dict[fx.Node, fx.Node] = {}
        if s == 0:
            for p in placeholders:
                env[p] = g.node_copy(p)
        else:
            for v in live[s - 1]:
                env[v] = g.placeholder(v.name)
                env[v].meta = dict(v.meta)
        for node in graph.nodes:
            if node.op not in COMPUTE_OPS or assignment[node.name] != s:
                continue
            for arg in node.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = g.node_copy(arg)
            env[node] = g.node_copy(node, env.__getitem__)
        if s == num_stages - 1:
            for arg in output.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = g.node_copy(arg)
            g.output(fx.graph.map_arg(output.args[0], env.__getitem__))
        else:
            outs = [env[v] for v in live[s]]
            g.output(outs[0] if len(outs) == 1 else tuple(outs))
        stages.append(fx.GraphModule(module, g, f"{type(module).__name__}Stage{s}"))
    return stages
