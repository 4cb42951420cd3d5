"""SGLang's cache namespaces on our tree: LoRA adapters and cache salts.

SGLang keys its trees by `RadixKey(token_ids, extra_key, cache_salt)` and shares a prefix only
between keys of equal `extra_key` (the request's own, with the LoRA adapter's id appended:
`Req.__init__`) and equal `cache_salt`. That pair is our tree's namespace (radix/spaces.py):
one string per pair, None for a request with neither, so a request without one costs two
attribute reads.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tree import RadixTree


def namespace_of(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The tree's namespace for SGLang's pair: None when both are None (the default namespace),
    else one string per pair. `repr` of the pair tells apart what SGLang tells apart, such as
    a missing `extra_key` and an empty one, or ("a", "b") and ("ab", None)."""
    if extra_key is None and cache_salt is None:
        return None
    return repr((extra_key, cache_salt))


def namespace_pair(namespace: str | None) -> tuple[str | None, str | None]:
    """SGLang's `(extra_key, cache_salt)` back from the tree's namespace (`namespace_of`)."""
    if namespace is None:
        return None, None
    pair = ast.literal_eval(namespace)  # a repr of two str-or-None: literals only
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"not a namespace of SGLang's pair: {namespace!r}")
    extra_key, cache_salt = pair
    return extra_key, cache_salt


def event_labels(lora_names: Any) -> Callable[[str | None], tuple[str | None, str | None]]:
    """What a KV event says of its namespace, as SGLang's own cache says it: the cache salt
    and the LoRA adapter's public name (`lora_names`: SGLang's `KvEventLoraNames`, which its
    scheduler fills as requests with an adapter arrive; None: no names)."""

    def labels(namespace: str | None) -> tuple[str | None, str | None]:
        extra_key, cache_salt = namespace_pair(namespace)
        if lora_names is None or not extra_key:
            return cache_salt, None
        name = lora_names.resolve(extra_key)
        return cache_salt, None if name is None else str(name)

    return labels


def key_namespace(key: Any) -> str | None:
    """The namespace of an SGLang `RadixKey`."""
    return namespace_of(getattr(key, "extra_key", None), getattr(key, "cache_salt", None))


def request_namespace(req: Any) -> str | None:
    """The namespace of an SGLang `Req`: the pair its keys carry (`_req_radix_key`)."""
    return namespace_of(getattr(req, "extra_key", None), getattr(req, "cache_salt", None))


class _Forest:
    """A stand-in parent of every namespace's root (hashable, as SGLang's walk needs)."""

    __slots__ = ("children",)

    def __init__(self, roots: Iterable[Node]) -> None:
        self.children = dict(enumerate(roots))


class _ForestView:
    """What `BasePrefixCache.dfs_weight_order` reads of a cache: its root and node handles."""

    def __init__(self, tree: RadixTree) -> None:
        self.root_node = _Forest([tree.root, *tree.spaces.values()])

    @staticmethod
    def resolve_node_handle(handle: Any) -> Any:
        return handle


def dfs_weight_order(tree: RadixTree, node_handles: Sequence[Any]) -> list[int]:
    """SGLang's depth-first order of waiting requests (`--schedule-policy dfs-weight`) over
    every namespace. SGLang walks down from `root_node`, under which a named namespace's nodes
    do not hang: its order would leave their requests out of the waiting queue."""
    order: list[int] = BasePrefixCache.dfs_weight_order(_ForestView(tree), node_handles)
    return order
