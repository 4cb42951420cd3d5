"""Namespaces of the radix tree: requests that must never share a prefix (one LoRA adapter's
requests and another's, or two tenants' cache salts) share one tree, one memory and one
eviction policy, each in a subtree of its own.

A namespace is a root of its own in the same `RadixTree`. The default namespace (None) is
`tree.root`; a named one gets a root when its first key is inserted and loses it when its last
node leaves the tree, so a server that sees a salt per user does not keep a root per user.

    tree.root ──── [0, 40) ──┬── [40, 90)      the default namespace
    "a"  root ──── [0, 40) ──── [40, 70)       the same tokens, another subtree: never shared
    "b"  root ──── [0, 12)

A namespace root ends at position 0 like the tree's root, so below it every position, page
boundary, checkpoint and hit length is the one the default namespace would have: a namespace
cannot be an edge of tokens, which would shift every position past it (hit lengths are the
positions a request resumes at, and KV pages of several tokens must stay aligned). A root has
no parent, so whatever already stops at the tree's root stops at a namespace's root too:
locks, path ids, the policies' candidates (`node.parent is None`).

Eviction weighs every namespace together: the policy learns of each node through `update`
wherever it hangs and picks its victims from one order over all of them, under the one memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import IdPages
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.tree import RadixTree


def new_root(tree: RadixTree, node_id: int) -> Node:
    """An empty root: no tokens, no pages, locked once for good so that it is never evicted."""
    root = Node(
        node_id,
        TokenSeq(b""),
        None,
        [IdPages([]) for _ in tree.attention],
        [0] * len(tree.attention),
        now=0,
    )
    root.lock_ref = 1
    return root


def root_for(tree: RadixTree, namespace: str | None) -> Node:
    """The root of `namespace`, made when the namespace holds nothing yet (an insert's)."""
    if namespace is None:
        return tree.root
    root = tree.spaces.get(namespace)
    if root is None:
        root = new_root(tree, tree.new_id())
        tree.spaces[namespace] = root
        tree.space_names[root.id] = namespace
    return root


def forget_if_empty(tree: RadixTree, root: Node) -> None:
    """Drop a named namespace's root once its last node is gone, from the device and from host
    memory (radix/host.py); the default namespace's stays."""
    if root.children or root.host_children or root is tree.root:
        return
    name = tree.space_names.pop(root.id)
    del tree.spaces[name]


def every_node(tree: RadixTree) -> Iterator[Node]:
    """Every node of every namespace, the default one first (the roots excluded)."""
    for root in (tree.root, *tree.spaces.values()):
        it = root.subtree()
        next(it)
        yield from it


def check_spaces(tree: RadixTree) -> None:
    """Each named root is registered under its name, empty-keyed, parentless, locked once and
    holds at least one node."""
    assert len(tree.space_names) == len(tree.spaces), "namespace names out of step"
    for name, root in tree.spaces.items():
        assert tree.space_names.get(root.id) == name, f"namespace {name!r}: root not named"
        assert root.parent is None and len(root.key) == 0 and root.end == 0, f"{name!r} root"
        assert root.lock_ref == 1, f"namespace {name!r}: its root's lock_ref moved"
        assert root.children or root.host_children, f"namespace {name!r}: empty root kept"
        assert root.state is None and not root.inner, f"namespace {name!r}: root has a state"
