"""The radix tree's invariants, checked node by node (tests and `--check` runs call this).

The invariants themselves are stated in tree.py's docstring; this module only verifies them,
so the tree's own module stays about what it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import IdPages, PageType
from jenga_sglang.radix.spaces import check_spaces

if TYPE_CHECKING:
    from jenga_sglang.radix.tree import RadixTree


def check_tree(tree: RadixTree) -> None:
    """Assert links, locks, pages and conservation (see tree.py) over the whole tree, every
    namespace's subtree included (spaces.py)."""
    check_spaces(tree)
    memory = tree.memory
    evictable = dict.fromkeys(memory.page_types, 0)
    owned: dict[PageType, set[int]] = {t: set() for t in memory.page_types}
    for node in tree.nodes():
        _check_node(tree, node)
        held = list(zip(tree.kv_types, node.kv, strict=True))
        if tree.state_type is not None:
            states = [state for _, state in node.inner]
            if node.state is not None:
                states.append(node.state)
            held += [(tree.state_type, state) for state in states]
        for ptype, pages in held:
            if node.lock_ref == 0:
                evictable[ptype] += len(pages)
            if isinstance(pages, IdPages):
                ids = pages.ids()
                clash = owned[ptype].intersection(ids)
                assert not clash, f"{ptype} pages {sorted(clash)[:5]} owned twice"
                owned[ptype].update(ids)
    for ptype, count in evictable.items():
        usage = memory.usage(ptype)
        assert usage.evictable == count, (
            f"{ptype}: memory has {usage.evictable} evictable pages, tree's unlocked nodes "
            f"hold {count}"
        )
    memory.check_integrity()


def _check_node(tree: RadixTree, node: Node) -> None:
    parent = node.parent
    assert parent is not None, f"{node!r} is detached"
    assert len(node.key) > 0, f"{node!r} has an empty key"
    assert parent.children.get(node.key.head(0, tree.page)) is node, f"{node!r} not linked"
    assert len(node.key) % tree.page == 0, f"{node!r}: not whole pages of {tree.page} tokens"
    assert node.start == parent.end, f"{node!r} start is stale"
    assert node.end == parent.end + len(node.key), f"{node!r} end is stale"
    own = node.lock_ref - sum(c.lock_ref for c in node.children.values())
    assert own >= 0, f"{node!r}: lock_ref below the sum of its children's"
    for slot, group in enumerate(tree.attention):
        tomb = node.tombstones[slot]
        assert len(node.kv[slot]) + tomb == len(node.key), f"{node!r} group {slot} pages"
        assert group.window is not None or tomb == 0, f"{node!r}: tombstone in full group"
    assert node.state is None or len(node.state) == 1, f"{node!r}: state is not one page"
    inner = [at for at, _ in node.inner]
    assert inner == sorted(set(inner)), f"{node!r}: inner checkpoints out of order"
    assert all(node.start < at < node.end for at in inner), f"{node!r}: inner outside the edge"
    assert all(at % tree.page == 0 for at in inner), f"{node!r}: inner off a page boundary"
    assert all(len(state) == 1 for _, state in node.inner), f"{node!r}: inner state not one page"
    assert tree.keeps_runs or not inner, f"{node!r}: a run, but the policy does not evict runs"
