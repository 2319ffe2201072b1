"""Key/value caches: capture a decoder as users build it (``use_cache=True``), with the cache switched off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.utils import _pytree as pytree

from unitscale.errors import KVCacheError

__all__ = ["no_kv_cache", "refuse_kv_cache"]


@contextmanager
def no_kv_cache(module: nn.Module) -> Iterator[tuple[str, ...]]:
    """Within this block, every config in ``module``'s tree that asks for a KV cache says ``use_cache=False``.

    A ``config`` attribute with ``use_cache=True`` (a ``transformers`` ``PretrainedConfig``) is
    switched back on exit. Yields, for each config switched, the path of the outermost module
    that holds it (``""``: the root).

    >>> import types, torch
    >>> from unitscale.capture import no_kv_cache
    >>> decoder = torch.nn.Linear(2, 2)
    >>> decoder.config = types.SimpleNamespace(use_cache=True)
    >>> model = torch.nn.Sequential(decoder)
    >>> with no_kv_cache(model) as switched:
    ...     print(switched, decoder.config.use_cache)
    ('0',) False
    """
    found: dict[int, tuple[str, Any]] = {}  # one entry per config: a decoder's layers share its config
    for path, m in module.named_modules():
        config = vars(m).get("config")
        if config is not None and getattr(config, "use_cache", None) is True:
            found.setdefault(id(config), (path, config))
    for _, config in found.values():
        config.use_cache = False
    try:
        yield tuple(path for path, _ in found.values())
    finally:
        for _, config in found.values():
            config.use_cache = True


def refuse_kv_cache(module: nn.Module, output: Any) -> None:
    """Raise the one error for a model output that holds a KV cache object (the fix: ``use_cache=False``).

    >>> import torch
    >>> from unitscale.capture._kv_cache import refuse_kv_cache
    >>> class DynamicCache: ...
    >>> model = torch.nn.Linear(1, 1)
    >>> refuse_kv_cache(model, {"logits": 1.0})  # no cache: nothing raised
    >>> try:
    ...     refuse_kv_cache(model, {"past_key_values": DynamicCache()})
    ... except Exception as error:
    ...     print(type(error).__name__, str(error).split(" (a key")[0])
    KVCacheError Linear returns a DynamicCache at ['past_key_values']
    """
    for path, leaf in pytree.tree_flatten_with_path(output)[0]:
        if "cache" in type(leaf).__name__.lower():
            raise KVCacheError(
                f"{type(module).__name__} returns a {type(leaf).__name__} at {pytree.keystr(path) or 'its output'} "
                "(a key/value cache), which a captured graph cannot return: pass use_cache=False to the model, "
                "or build it with use_cache=False"
            )
