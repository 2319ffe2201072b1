"""Custom ``torch.fx`` tracers that extend :class:`torch.fx.Tracer` through its hooks.

Each overrides a few hooks and calls ``super()``, so they compose by multiple inheritance
(``class MyTracer(TaggingTracer, ModulePathTracer, LeafTracer)``), keyword arguments passed
along the chain. Put :class:`TaggingTracer` first: its tag function then sees what the others
recorded.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import Argument

from unitscale.errors import InputError, NotAModuleError, PredicateError, UnitscaleError
from unitscale.fx._unpack_proxy import UnpackProxy
from unitscale.fx.autowrap import default_autowrap_modules
from unitscale.fx.global_state import GLOBAL_STATE_LOCK, this_thread_only
from unitscale.fx.module_state import module_state_kept
from unitscale.fx.nodes import MODULE_PATH_KEY, TAG_KEY
from unitscale.fx.trace_errors import trace_error

__all__ = [
    "DeepTracer",
    "ModulePathTracer",
    "LeafTracer",
    "TaggingTracer",
    "check_autowrap",
]

DEFAULT_TAG = "untagged"


@contextmanager
def _skip_input_checks(module: Any) -> Iterator[None]:
    """Shadow a norm layer's ``_check_input_dim`` (``input.dim()`` in Python) while it is traced through."""
    if not hasattr(type(module), "_check_input_dim") or "_check_input_dim" in module.__dict__:
        yield
        return
    object.__setattr__(module, "_check_input_dim", lambda input: None)
    try:
        yield
    finally:
        del module.__dict__["_check_input_dim"]


_PLAIN_ARGS = frozenset(
    {int, float, bool, complex, str, type(None), type(...), torch.dtype, torch.device, torch.layout}
    | {torch.memory_format}
)


class _Tracer(fx.Tracer):
    """Checks the root and turns ``torch.fx`` trace failures into :class:`TraceError`."""

    # Buffers become graph inputs (``get_attr``) instead of constants, so slicing a
    # buffer by an input's shape (TinyGPT's positions) traces, and tracing never
    # runs a buffer update (BatchNorm's ``num_batches_tracked += 1``) eagerly.
    proxy_buffer_attributes = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # What reaches here is meant for fx.Tracer; checked here, a wrong argument names the
        # tracer the user built (``LeafTracer(42)``), not fx's patcher deep inside a trace.
        name = type(self).__name__
        try:
            bound = _FX_TRACER_INIT.bind(self, *args, **kwargs)
        except TypeError as e:
            raise InputError(
                f"{name}() got arguments it does not take ({e}); pass its options by keyword, "
                f"as in {name}.__init__'s signature"
            ) from e
        given = bound.arguments
        check_autowrap(given.get("autowrap_modules", ()), given.get("autowrap_functions", ()), name)
        for arg_name in ("autowrap_modules", "autowrap_functions"):
            if arg_name in given:
                given[arg_name] = tuple(given[arg_name])
        super().__init__(*bound.args[1:], **bound.kwargs)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return UnpackProxy(node, self)

    _names_of: dict[int, str] | None = None

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, fx.Proxy]) -> Any:
        # fx finds a parameter's name by scanning named_parameters() on every access,
        # quadratic in the parameter count; one dict per trace does the same lookup.
        if isinstance(attr_val, torch.Tensor) and not self.param_shapes_constant:
            if self._names_of is None:
                buffers = self.root.named_buffers() if self.proxy_buffer_attributes else ()
                # the later name wins: a parameter's over a buffer's
                self._names_of = {id(t): name for name, t in [*buffers, *self.root.named_parameters()]}
            name = self._names_of.get(id(attr_val))
            if name is not None:
                if name not in parameter_proxy_cache:
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_arg(self, a: Any) -> Argument:
        # Proxies, numbers and the like are most arguments; fx would first test each for
        # a parameter, tensor, module or opaque object, a third of the tracing time.
        kind = type(a)
        if kind in _PLAIN_ARGS:
            return a
        if kind is UnpackProxy:
            return a.node
        if kind is tuple:
            return tuple(self.create_arg(item) for item in a)
        return super().create_arg(a)

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        if not isinstance(root, nn.Module) and not isinstance(root, types.FunctionType):
            raise NotAModuleError(
                f"{type(self).__name__}.trace got {type(root).__name__} {root!r:.60}; "
                "pass an nn.Module or a Python function"
            )
        if concrete_args is not None and not isinstance(concrete_args, dict):
            raise InputError(
                f"{type(self).__name__}.trace(concrete_args=...) got {type(concrete_args).__name__} "
                f"{concrete_args!r:.60}; pass a dict of argument name -> value, or None"
            )
        # fx patches nn.Module and the autowrapped functions for the whole process while it
        # traces: one trace at a time, and other threads' models run untraced meanwhile.
        with GLOBAL_STATE_LOCK, this_thread_only(self):
            return self._trace(root, concrete_args)

    def _trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None) -> fx.Graph:
        self._names_of = None
        # A forward that assigns to its module (self.steps += 1, self.last = y) would leave
        # proxies there: every submodule is put back as it was, whether tracing succeeds or not.
        with module_state_kept(root) as kept:
            try:
                with _skip_input_checks(root):  # a function has no input checks: nothing to skip
                    graph = super().trace(root, concrete_args)
                kept.update(str(n.target) for n in graph.nodes if n.op == "get_attr")
                return graph
            except UnitscaleError:
                raise
            except Exception as e:
                if isinstance(e, fx.proxy.TraceError):
                    advice = "Make the control flow static, pass concrete_args, or make the module that does it a leaf."
                elif "co_varnames" in str(e):
                    # fx rebuilds forward's code to make **kwargs placeholders, and cannot when a
                    # decorator wraps it (every transformers model's forward)
                    advice = (
                        "torch.fx cannot trace a forward that a decorator wraps with **kwargs (as transformers "
                        "models are); capture it with torch.export instead: unitscale.capture.capture(model, inputs)."
                    )
                else:
                    # A proxy used as a Python value (int(x.shape[0].item()), a numpy call) fails with
                    # a plain TypeError or the like deep inside the model: name the user's line.
                    advice = (
                        "A symbolic trace cannot use a tensor as a Python value (int(), len(), .item(), numpy); "
                        "make that line independent of tensor values, or make the module that does it a leaf."
                    )
                raise trace_error(getattr(root, "__name__", None) or type(root).__name__, e, advice) from e

    def call_module(self, m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with _skip_input_checks(m):
            return super().call_module(m, *args, **kwargs)


class ModulePathTracer(_Tracer):
    """Records, for every node but the output, the qualified name of the module it came from (root ``""``).

    The name is kept in ``node.meta["module_path"]`` and, for the latest trace, in
    ``tracer.node_to_originating_module[node]``. Overrides ``trace``, ``call_module`` and
    ``create_node``, which calls ``record_origin``.

    >>> from torch import nn
    >>> from unitscale.fx import ModulePathTracer
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> tracer = ModulePathTracer()
    >>> graph = tracer.trace(model)
    >>> {n.name: tracer.node_to_originating_module.get(n) for n in graph.nodes}
    {'input_1': '', '_0': '0', '_1': '1', 'output': None}
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current_module_path = ""
        self.node_to_originating_module: dict[fx.Node, str] = {}

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self.current_module_path = ""
        self.node_to_originating_module = {}
        return super().trace(root, concrete_args)

    def call_module(self, m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        outer = self.current_module_path
        self.current_module_path = self.path_of_module(m)
        try:
            return super().call_module(m, *args, **kwargs)
        finally:
            self.current_module_path = outer

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        # create_node (not create_proxy) also sees the get_attr nodes that create_arg
        # makes for constants, so every node is recorded.
        node = super().create_node(*args, **kwargs)
        self.record_origin(node)
        return node

    def record_origin(self, node: fx.Node) -> None:
        """Record where a new node came from (the output node: nowhere); a subclass may record more."""
        if node.op != "output":
            self.node_to_originating_module[node] = self.current_module_path
            node.meta[MODULE_PATH_KEY] = self.current_module_path


class DeepTracer(_Tracer):
    """A tracer that recurses into every submodule, down to torch functions.

    A callable argument (a function passed to ``forward``, or to an op) becomes a placeholder;
    ``tracer.callable_args`` maps its name to the callable, to pass after the inputs when
    running. Overrides ``trace``, ``is_leaf_module`` and ``create_arg``.

    Args:
        recurse_modules: ``False``: every submodule is a leaf.
        autowrap_modules: modules whose functions stay single nodes (``None``: ``math``, ``einops``,
            ``unitscale.functional`` and any given to :func:`~unitscale.fx.register_autowrap_module`).
        autowrap_functions: extra functions kept as single nodes.

    Raises:
        InputError: ``recurse_modules`` is not a bool, or an argument that no tracer in the
            chain takes was passed.
        PredicateError: ``autowrap_modules`` or ``autowrap_functions`` is not a tuple of
            Python modules or functions.

    >>> from torch import nn
    >>> from unitscale.fx import DeepTracer
    >>> graph = DeepTracer().trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> print(*(n.op for n in graph.nodes))
    placeholder get_attr get_attr call_function call_function output
    """

    def __init__(
        self,
        recurse_modules: bool = True,
        autowrap_modules: tuple[types.ModuleType, ...] | None = None,
        autowrap_functions: tuple[Callable[..., Any], ...] = (),
        **kwargs: Any,
    ) -> None:
        if not isinstance(recurse_modules, bool):
            raise InputError(
                f"{type(self).__name__}(recurse_modules=...) got {type(recurse_modules).__name__} "
                f"{recurse_modules!r:.60}; pass True (trace into submodules) or False (keep them as leaves)"
            )
        if autowrap_modules is None:
            autowrap_modules = default_autowrap_modules()
        super().__init__(autowrap_modules=autowrap_modules, autowrap_functions=autowrap_functions, **kwargs)
        self.recurse_modules = recurse_modules
        self.callable_args: dict[str, Callable[..., Any]] = {}
        self._callable_nodes: dict[int, fx.Node] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return not self.recurse_modules

    def create_arg(self, a: Any) -> Argument:
        # fx cannot put a Python function into generated code; a placeholder keeps
        # the graph runnable and visible.
        if not isinstance(a, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            return super().create_arg(a)
        node = self._callable_nodes.get(id(a))  # callable_args keeps ``a`` alive: its id is its own
        if node is None:
            placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
            with self.graph.inserting_after(placeholders[-1]) if placeholders else self.graph.inserting_before():
                node = self.create_node("placeholder", getattr(a, "__name__", "fn"), (), {})
            self.callable_args[node.name], self._callable_nodes[id(a)] = a, node
        return node

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self.callable_args = {}
        self._callable_nodes = {}
        return super().trace(root, concrete_args)


_FX_TRACER_INIT = inspect.signature(fx.Tracer.__init__)


def check_autowrap(modules: Any, functions: Any, caller: str = "DeepTracer") -> None:
    """Refuse autowrap arguments that are not tuples of Python modules and functions (``None`` modules: the defaults).

    fx would fail on anything else deep in its patcher, or a tool that falls back to another
    capture route would hide the failure.

    Raises:
        PredicateError: naming ``caller`` (the function the user called) and the argument.

    >>> from unitscale.fx.tracers import check_autowrap
    >>> check_autowrap(None, ())
    >>> try:
    ...     check_autowrap("math", (), caller="track_scales")
    ... except Exception as e:
    ...     print(e)  # doctest: +ELLIPSIS
    track_scales(autowrap_modules=...) got str 'math'; pass a tuple, e.g. ...
    """
    for arg_name, values, kind, what, example in (
        ("autowrap_modules", modules, types.ModuleType, "imported Python modules", "(math, einops)"),
        ("autowrap_functions", functions, types.FunctionType, "Python functions (def, not builtins)", "(my_function,)"),
    ):
        if values is None and kind is types.ModuleType:
            continue  # the registered defaults
        if not isinstance(values, (tuple, list)):
            raise PredicateError(
                f"{caller}({arg_name}=...) got {type(values).__name__} {values!r:.60}; pass a tuple, e.g. {example}"
            )
        for v in values:
            if not isinstance(v, kind):
                raise PredicateError(
                    f"{caller}({arg_name}=...) holds {type(v).__name__} {v!r:.60}; it takes {what}, e.g. {example}"
                )


def ask_module_predicate(
    predicate: Callable[[nn.Module, str], Any],
    role: str,
    module: nn.Module,
    qualname: str,
    *,
    allow_none: bool,
    make_it: str,
    must: str,
) -> bool | None:
    """Call a user's ``predicate(module, qualname)``; a raise or a non-bool answer is a ``PredicateError``."""
    where = f"module '{qualname}' ({type(module).__name__})"
    try:
        decision = predicate(module, qualname)
    except Exception as e:
        raise PredicateError(
            f"the {role} predicate raised {type(e).__name__}: {e} on {where}; make it return {make_it} for every module"
        ) from e
    if not (isinstance(decision, bool) or (allow_none and decision is None)):
        raise PredicateError(f"the {role} predicate returned {decision!r:.60} for {where}; it must return {must}")
    return decision


class LeafTracer(_Tracer):
    """A tracer where the caller chooses which modules stay one ``call_module`` node (leaves).

    For each module the first rule that decides wins: ``is_leaf(module, qualified_name)``
    (``None``: no opinion), then ``leaf_types``, then ``trace_types`` (traced through), then
    ``torch.fx``'s default (``torch.nn`` modules are leaves). A subclass may override
    ``is_leaf_module`` for a rule that needs state, calling ``super()`` to keep these.

    Args:
        **kwargs: passed to the next tracer in the method resolution order.

    Raises:
        NotAModuleError: ``leaf_types`` or ``trace_types`` holds something that is
            not an ``nn.Module`` subclass.
        PredicateError: ``is_leaf`` is not callable; when tracing, it raised or
            returned something other than ``True``, ``False`` or ``None``.

    >>> from torch import nn
    >>> from unitscale.fx import LeafTracer
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> graph = LeafTracer(trace_types=(nn.ReLU,)).trace(model)
    >>> [(n.op, n.name) for n in graph.nodes][1:3]
    [('call_module', '_0'), ('call_function', 'relu')]
    """

    def __init__(
        self,
        *args: Any,
        leaf_types: tuple[type[nn.Module], ...] = (),
        trace_types: tuple[type[nn.Module], ...] = (),
        is_leaf: Callable[[nn.Module, str], bool | None] | None = None,
        **kwargs: Any,
    ) -> None:
        for arg_name, types_ in (("leaf_types", leaf_types), ("trace_types", trace_types)):
            if not isinstance(types_, (tuple, list)):
                raise NotAModuleError(
                    f"LeafTracer({arg_name}=...) got {type(types_).__name__} {types_!r:.60}; "
                    f"pass a tuple of module classes, e.g. {arg_name}=(nn.ReLU,)"
                )
            for t in types_:
                if not (isinstance(t, type) and issubclass(t, nn.Module)):
                    raise NotAModuleError(
                        f"LeafTracer({arg_name}=...) holds {t!r}, which is not an nn.Module subclass; "
                        "pass module classes such as nn.ReLU"
                    )
        if is_leaf is not None and not callable(is_leaf):
            raise PredicateError(
                f"LeafTracer(is_leaf=...) got {type(is_leaf).__name__} {is_leaf!r:.60}; "
                "pass a function (module, qualified_name) -> bool | None"
            )
        super().__init__(*args, **kwargs)
        self.leaf_types = tuple(leaf_types)
        self.trace_types = tuple(trace_types)
        self.is_leaf = is_leaf

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.is_leaf is not None:
            decision = ask_module_predicate(
                self.is_leaf,
                "is_leaf",
                m,
                module_qualified_name,
                allow_none=True,
                make_it="True, False or None",
                must="True (leaf), False (trace through) or None (default)",
            )
            if decision is not None:
                return decision
        if isinstance(m, self.leaf_types):
            return True
        if isinstance(m, self.trace_types):
            return False
        return super().is_leaf_module(m, module_qualified_name)


class TaggingTracer(_Tracer):
    """Tags every node, the output included, with ``tag_fn(node)`` in ``node.meta[key]``, for later passes.

    Overrides ``create_node``, writing the tag after ``super().create_node``: it sees what the
    tracers after this one in the MRO wrote.

    Args:
        default_tag: the tag used when ``tag_fn`` is ``None``.
        **kwargs: passed to the next tracer in the method resolution order.

    Raises:
        InputError: ``key`` is not a str.
        PredicateError: ``tag_fn`` is not callable, or (when tracing) it raised.

    >>> from torch import nn
    >>> from unitscale.fx import TaggingTracer
    >>> tracer = TaggingTracer(tag_fn=lambda node: node.op.upper())
    >>> graph = tracer.trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> [n.meta["tag"] for n in graph.nodes]
    ['PLACEHOLDER', 'CALL_MODULE', 'CALL_MODULE', 'OUTPUT']
    """

    def __init__(
        self,
        *args: Any,
        tag_fn: Callable[[fx.Node], Any] | None = None,
        default_tag: Any = DEFAULT_TAG,
        key: str = TAG_KEY,
        **kwargs: Any,
    ) -> None:
        if not isinstance(key, str):
            raise InputError(
                f"TaggingTracer(key=...) got {type(key).__name__} {key!r:.60}; pass the str that "
                "node.meta stores the tag under (the default is 'tag')"
            )
        if tag_fn is not None and not callable(tag_fn):
            raise PredicateError(
                f"TaggingTracer(tag_fn=...) got {type(tag_fn).__name__} {tag_fn!r:.60}; pass a function node -> tag"
            )
        super().__init__(*args, **kwargs)
        self.tag_fn = (lambda node: default_tag) if tag_fn is None else tag_fn
        self.key = key

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        try:
            node.meta[self.key] = self.tag_fn(node)
        except Exception as e:
            raise PredicateError(
                f"the tag_fn raised {type(e).__name__}: {e} on node '{node.name}' ({node.op} {node.target}); "
                "make it return a tag for every node"
            ) from e
        return node
