"""Trace a repeated block once: later identical blocks copy its nodes instead of re-running it.

A transformer is the same block many times over, and ``torch.fx`` traces each one by running
its Python ``forward`` with proxies, about 30 µs per node. :class:`BlockReplay`, a mixin for
a tracer that records module paths, keeps what the first call of a block added to the graph
(a *template*). A later call of a module with the same structure and the same kind of
arguments gets copies of those nodes, their targets and module paths moved to the new
module, in a third of the time. The graph is the one tracing would give: the same nodes,
names, targets, arguments and metadata (``module_path``, ``nn_module_stack``, scopes). A
module is only replayed when that is certain:

- every module under it is of plain make: no hooks, no ``forward`` of its own instance, and
  attributes that are numbers, strings, ``None``, tuples of them, or functions (compared by
  identity), so the same structure means the same Python control flow; and tracing it did
  not change them;
- it owns its parameters, buffers and submodules (none shared with another module), and
  none of them has been called yet (calls within the block, a ReLU used twice, are fine);
- its arguments are proxies or plain constants, its template reads nothing from outside
  but its arguments and its own parameters, and returns proxies or plain constants.

Anything else is traced as usual.
"""

from __future__ import annotations

import functools
import types
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn
from torch.fx import traceback as fx_traceback
from torch.nn.modules import module as module_globals

from unitscale.fx._unpack_proxy import UnpackProxy

__all__ = ["BlockReplay"]

_PLAIN = (bool, int, float, str, type(None), torch.dtype)
# What nn.Module.__init__ puts in every module's __dict__: its own bookkeeping, not the
# module's configuration (``training`` excepted: it is compared like any attribute).
_INTERNALS = frozenset(vars(nn.Module())) - {"training"}


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _comparable(value: Any) -> Any:
    """``value`` as part of a key: plain values as they are, functions by identity; else ``None``."""
    if _plain(value):
        return (type(value), value)
    if isinstance(value, types.FunctionType):
        return ("function", id(value))  # the same function object: the same code and closure
    return None


def _structure(m: nn.Module, memo: dict[int, Any]) -> Any:
    """What tracing ``m`` can depend on, relative to ``m``; ``None`` if that cannot be told.

    ``memo`` holds the answer per module (by id) for the length of one trace.
    """
    key = id(m)
    if key in memo:
        return memo[key]
    memo[key] = None  # a module inside itself is no plain module
    result: Any = None
    if not (m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m)):
        attrs = []
        for name, value in vars(m).items():
            if name in _INTERNALS:
                continue
            comparable = _comparable(value)
            if comparable is None:
                break
            attrs.append((name, comparable))
        else:
            children = tuple(
                (name, None if child is None else _structure(child, memo)) for name, child in m._modules.items()
            )
            if all(child is not None for _, child in children):
                params = tuple((k, v is None) for k, v in m._parameters.items())
                buffers = tuple((k, v is None) for k, v in m._buffers.items())
                result = (type(m), tuple(attrs), params, buffers, children)
    memo[key] = result
    return result


class _NoReplay(Exception):
    """This call cannot be replayed: trace it."""


@dataclass
class _Template:
    prefix: str
    inputs: list[fx.Node]
    nodes: list[fx.Node]
    scopes: list[tuple[str, Any]]
    stacks: list[list[tuple[str, tuple[str, Any]]]]
    calls: list[str]
    out_spec: pytree.TreeSpec
    out_leaves: list[Any]


def _proxy_nodes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[fx.Node]:
    """The nodes of the proxies among a call's arguments, in argument order."""
    return [leaf.node for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, fx.Proxy)]


def _move(path: str, old: str, new: str) -> str:
    if path == old:
        return new
    if path.startswith(old + "."):
        return new + path[len(old) :]
    raise _NoReplay(path)


class BlockReplay:
    """Mixin for a tracer (with ``ModulePathTracer``'s metadata) that replays repeated blocks.

    Place it before ``ModulePathTracer`` and ``DeepTracer`` in the bases.

    >>> from unitscale.examples.models import TinyGPT
    >>> from unitscale.fx.tracers import DeepTracer, ModulePathTracer
    >>> class Tracer(BlockReplay, ModulePathTracer, DeepTracer):
    ...     pass
    >>> tracer = Tracer()
    >>> graph = tracer.trace(TinyGPT(11, 16, 3, 2, 8))
    >>> tracer.replayed
    ['blocks.1', 'blocks.2']
    """

    replay_blocks = True
    """Set to ``False`` to trace every module call (the graph is the same, only slower)."""

    replayed: list[str]
    """Paths of the modules the latest trace replayed."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self._templates: dict[Any, _Template | functools.partial[_Template] | None] = {}
        self._structures: dict[int, Any] = {}
        self._by_path: dict[str, nn.Module] | None = None
        self._proxy_cache: dict[str, fx.Proxy] = {}
        self._recording: list[list[str]] = []
        self.replayed = []
        return super().trace(root, concrete_args)  # type: ignore[misc]

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, fx.Proxy]) -> Any:
        # fx keeps one proxy per parameter for the whole trace; replayed parameters join it
        self._proxy_cache = parameter_proxy_cache
        return super().getattr(attr, attr_val, parameter_proxy_cache)  # type: ignore[misc]

    def call_module(
        self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        tracer: Any = self
        path = tracer.path_of_module(m)
        for calls in self._recording:
            calls.append(path)
        key = self._key(m, path, args, kwargs) if self.replay_blocks else None
        if key is None:
            return super().call_module(m, forward, args, kwargs)  # type: ignore[misc]
        if key not in self._templates:
            return self._record(key, m, path, forward, args, kwargs)
        template = self._templates[key]
        if isinstance(template, functools.partial):
            try:
                template = self._templates[key] = template()
            except _NoReplay:
                template = self._templates[key] = None
        plan = None
        if template is not None:
            try:
                plan = self._plan(template, path, args, kwargs)
            except _NoReplay:
                plan = None
        if template is None or plan is None:
            return super().call_module(m, forward, args, kwargs)  # type: ignore[misc]
        self.replayed.append(path)
        return self._replay(template, path, plan)

    def _key(self, m: nn.Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tracer: Any = self
        if not m._modules or tracer.is_leaf_module(m, path) or module_globals._global_forward_hooks:
            return None  # a module without submodules is a few nodes: as quick to trace
        if module_globals._global_forward_pre_hooks:
            return None
        if tracer.record_stack_traces or fx_traceback.has_preserved_node_meta():
            return None  # tracing would copy more metadata onto each node
        leaves, spec = pytree.tree_flatten((args, kwargs))
        kinds: list[Any] = []
        first: dict[fx.Node, int] = {}
        for i, leaf in enumerate(leaves):
            if type(leaf) is UnpackProxy:
                kinds.append(("proxy", first.setdefault(leaf.node, i)))  # the same proxy twice stays so
            elif _plain(leaf):
                kinds.append((type(leaf), leaf))
            else:
                return None
        structure = _structure(m, self._structures)
        if structure is None:
            return None
        return (structure, spec, tuple(kinds))

    def _record(
        self,
        key: Any,
        m: nn.Module,
        path: str,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        tracer: Any = self
        graph: fx.Graph = tracer.graph
        before = graph._root.prev  # the last node so far
        outer = len(tracer.module_stack)
        calls: list[str] = [path]
        self._recording.append(calls)
        try:
            out = super().call_module(m, forward, args, kwargs)  # type: ignore[misc]
        finally:
            self._recording.pop()
        last = graph._root.prev
        if any(tracer.num_calls.get(p) != n for p, n in Counter(calls).items()):
            self._templates[key] = None  # a module called before (or elsewhere meanwhile): never replayed
        else:
            # The template is built when a second such module comes: most never do.
            build = functools.partial(self._template, key, m, path, before, last, outer, calls, args, kwargs, out)
            self._templates[key] = build
        return out

    def _template(
        self,
        key: Any,
        m: nn.Module,
        path: str,
        before: fx.Node,
        last: fx.Node,
        outer: int,
        calls: list[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> _Template:
        tracer: Any = self
        if _structure(m, {}) != key[0]:
            raise _NoReplay(path)  # its forward changed the module: a copy would not
        nodes = []
        node = before
        while node is not last:
            node = node.next
            nodes.append(node)
        inputs = _proxy_nodes(args, kwargs)
        known = set(inputs)
        scopes, stacks = [], []
        for node in nodes:
            if node.op not in ("call_function", "call_method", "call_module", "get_attr"):
                raise _NoReplay(node.name)
            if node.op in ("get_attr", "call_module"):
                _move(str(node.target), path, path)  # under the module, or not replayable
            for used in node.all_input_nodes:
                if used not in known:
                    raise _NoReplay(node.name)
            known.add(node)
            stacks.append(list(node.meta.get("nn_module_stack", {}).items())[outer:])
            scopes.append(tracer.node_name_to_scope[node.name])
            _move(node.meta.get("module_path", ""), path, path)
        out_leaves, out_spec = pytree.tree_flatten(out)
        kept: list[Any] = []
        for leaf in out_leaves:
            if type(leaf) is UnpackProxy and leaf.node in known:
                kept.append(leaf.node)
            elif _plain(leaf):
                kept.append(leaf)
            else:
                raise _NoReplay(path)
        return _Template(path, inputs, nodes, scopes, stacks, calls, out_spec, kept)

    def _plan(
        self, template: _Template, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[fx.Node, fx.Node] | None:
        """The input mapping for a replay, once every target and module has been checked."""
        tracer: Any = self
        old = template.prefix
        if self._by_path is None:
            # each module under its own name only: a module shared by two paths has one entry
            self._by_path = {name: module for module, name in tracer.submodule_paths.items()}
        by_path = self._by_path
        for p in set(template.calls):
            new = _move(p, old, path)
            if tracer.num_calls.get(new, 0) or new not in by_path:
                return None  # called before, or shared with another module
        names_of = tracer._names_of or {}
        for node in template.nodes:
            if node.op == "get_attr":
                target = _move(str(node.target), old, path)
                owner_path, _, name = target.rpartition(".")
                owner = by_path.get(owner_path)
                if owner is None:
                    return None
                # from the dicts: a getattr would make tracing add a node
                value = owner._parameters.get(name, owner._buffers.get(name))
                if names_of.get(id(value), ("",))[0] != target:
                    return None  # shared with another module, or not a parameter or buffer
                if target in self._proxy_cache:
                    return None  # read before: tracing would reuse that node
        inputs = _proxy_nodes(args, kwargs)
        return dict(zip(template.inputs, inputs, strict=True))

    def _replay(self, template: _Template, path: str, env: dict[fx.Node, fx.Node]) -> Any:
        tracer: Any = self
        old = template.prefix
        moves: dict[str, str] = {}

        def move(name: str) -> str:
            moved = moves.get(name)
            if moved is None:
                moved = moves[name] = _move(name, old, path)
            return moved

        def move_key(key: str) -> str:  # "path" or "path@n" (the module's n-th call)
            module, at, n = key.partition("@")
            return move(module) + at + n

        outer = list(tracer.module_stack.items())
        for node, (scope_path, scope_type), stack in zip(template.nodes, template.scopes, template.stacks, strict=True):
            target = node.target
            if node.op in ("get_attr", "call_module"):
                target = move(str(target))
            new = tracer.graph.create_node(
                node.op,
                target,
                fx.node.map_arg(node.args, env.__getitem__),
                fx.node.map_arg(node.kwargs, env.__getitem__),
                None,
                node.type,
            )
            if node.op == "get_attr":
                self._proxy_cache[str(target)] = tracer.proxy(new)
            moved = [(move_key(k), (move(v[0]), v[1])) for k, v in stack]
            new.meta["nn_module_stack"] = OrderedDict(outer + moved)
            tracer.node_name_to_scope[new.name] = (move(scope_path), scope_type)
            module_path = move(node.meta.get("module_path", ""))
            new.meta["module_path"] = module_path
            tracer.node_to_originating_module[new] = module_path
            env[node] = new
        moved_calls = [move(p) for p in template.calls]
        for p, n in Counter(moved_calls).items():
            tracer.num_calls[p] = n
        for calls in self._recording:  # an enclosing module being recorded made these calls too
            calls.extend(moved_calls[1:])
        leaves = [tracer.proxy(env[leaf]) if isinstance(leaf, fx.Node) else leaf for leaf in template.out_leaves]
        return pytree.tree_unflatten(leaves, template.out_spec)
