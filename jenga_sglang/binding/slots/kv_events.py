"""KV events for a cache-aware router (`--kv-events-config`): only spans a hit can use.

SGLang's scheduler publishes, each step, what its cache's `take_events()` returns: SGLang's
`BlockStored` / `BlockRemoved` records, one block per page, each block named by a hash chained
from its parent's. A router (smg's event-driven `cache_aware`, Dynamo's KV router) rebuilds
every worker's cache from them and predicts a request's hit as the run of its leading blocks
the worker holds. SGLang's own cache publishes every KV page it inserts and nothing when a
Mamba state goes, so on a hybrid model the router counts tokens a hit cannot end in.

Here a span is published only where a hit is usable under every layer type's rule:

* with a Mamba group, the blocks of the path [0, p) of each checkpoint the tree holds at p (a
  hit ends exactly at a checkpoint, and needs the full KV before it); the state's slot id names
  its span. When the state goes (evicted, or dropped while its KV stays), the blocks no other
  checkpoint covers are published as removed;
* with a sliding-window group and no Mamba group (gpt-oss), the blocks of the path
  [0, e) of each node end e an insert leaves from its branch point down, where the tree holds
  the window's last w tokens [e - w, e) (a hit's rule, radix/rules.py); the full KV slot of
  e's last page names the span, so the span goes when that page does. It cannot go stale
  while the page stays: the tree drops window pages only out of every node end's window
  (radix/evict.py `trim_window` keeps each node's last w tokens), and nodes merge only when
  a Mamba state goes. A hit that ends inside an edge whose window was trimmed is shorter
  than the router predicts, by less than the distance back to the previous node end; and a
  node end a match's split made is published only once an insert passes through it (under,
  never over);
* with full attention only, every KV page (a hit may end after any page); the page's first
  KV slot names it, and its eviction removes it. So too on a PD decode worker's own radix
  cache, whose hits need the KV alone (the prefill side sends the state: `states_from_peer`).

With the host tier (`--jenga-host-gb`, binding/host/) a span stays published while what names
it is in host memory: a hit on it is served (the load-back, reported as cached), so a router
should count it. A demotion moves the span from the device slot to the host id its copy went
to (`demoted`), a load-back moves it to the fresh device slot (`loaded_back`), and it is
removed only when the host copy goes (`host_freed`: host eviction, or the tier dropping it).
Only the keyed page type's moves count (`keyed`: the state type where hits end at states,
else the full KV type).

Namespaces (LoRA adapters, cache salts) seed the chain, so their blocks never meet, and each
store names its namespace as SGLang's own cache does: `cache_salt`, and `lora_name` where the
scheduler knows the adapter's public name (`labels`, binding/cache/namespaces.py).
A block is held with a count of the spans that cover it (published at 0 -> 1, removed at
1 -> 0), so a shared head stays published while any checkpoint below it remains. Chained hashes
make equal paths equal blocks. The cost is one hash per block of a new checkpoint's path, paid
only when events are on. The tree itself calls nothing here: SlotTree reports adoptions and
SglangSlots the slots the tree gives back (binding/slots/tree.py, slots/sglang_slots.py).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jenga_sglang.radix.pages import PageType

_MASK, _SIGN = (1 << 64) - 1, 1 << 63

#: A namespace (None: the default one) to the (cache_salt, lora_name) its stores carry.
Labels = Callable[[str | None], tuple[str | None, str | None]]


def _int64(digest: bytes) -> int:
    value = int.from_bytes(digest, "big") & _MASK
    return value - (1 << 64) if value & _SIGN else value


def chain_hashes(tokens: Sequence[int], page: int, namespace: str | None = None) -> list[int]:
    """One signed 64-bit hash per whole page of `tokens`, each over its parent's and its ids;
    the first over the tree's `namespace` (binding/cache/namespaces.py), so equal token paths of two
    namespaces are two blocks."""
    packed, width = array("q", tokens).tobytes(), 8 * page
    hashes, parent = [], b"" if namespace is None else namespace.encode()
    for start in range(0, len(packed) - len(packed) % width, width):
        parent = hashlib.blake2b(parent + packed[start : start + width], digest_size=8).digest()
        hashes.append(_int64(parent))
    return hashes


class HitSpanEvents:
    """The recorder `BasePrefixCache.take_events()` reads (`kv_events.take()`), fed by the
    binding with the checkpoints (or KV pages) the tree adopts and the slots it frees."""

    def __init__(
        self,
        page_size: int,
        whole_paths: bool,
        labels: Labels | None = None,
        keyed: PageType | None = None,
    ) -> None:
        self.page = page_size
        # Mamba or a window: a span is the path [0, end) to where a hit can end; else a page
        self.whole_paths = whole_paths
        self._labels = labels  # namespace -> (cache_salt, lora_name) of its stores
        self.keyed = keyed  # the page type whose slots name spans (host moves of others: no-op)
        self._covers: dict[int, list[int]] = {}  # slot id -> block hashes of its span
        self._host: dict[int, list[int]] = {}  # host id -> the span its demoted slot named
        self._count: dict[int, int] = {}  # block hash -> spans covering it
        self._queue: list[Any] = []
        self.published_blocks = 0
        self.removed_blocks = 0

    # ------------------------------------------------------------------ what the tree did

    def adopted(
        self,
        tokens: Sequence[int],
        spans: Iterable[tuple[int, int]],
        namespace: str | None = None,
    ) -> None:
        """The tree took `slot` valid after tokens[:end] in `namespace`, for each (end, slot)
        of `spans`."""
        todo = [(end, slot) for end, slot in spans if slot not in self._covers]
        todo = [(end, slot) for end, slot in todo if end % self.page == 0]  # whole pages only
        if not todo:
            return
        chain = chain_hashes(tokens[: max(end for end, _ in todo)], self.page, namespace)
        for end, slot in todo:
            blocks = end // self.page
            # The whole path to a checkpoint or node end; or the page alone (its parents are
            # pages the tree adopted before, or in this same insert).
            first = 0 if self.whole_paths else blocks - 1
            self._covers[slot] = chain[first:blocks]
            self._store(tokens, first, chain[first:blocks], chain, namespace)

    def freed(self, slots: Iterable[int]) -> None:
        """The tree gave these slots back (evicted, or a state dropped): their spans go."""
        self._drop(self._covers, slots)

    def demoted(self, ptype: PageType, device: Iterable[int], host: Iterable[int]) -> None:
        """The tier copied `device` slots to `host` ids (same order) before freeing them: their
        spans stay published, named by the host ids (a hit on them is a load-back away)."""
        if ptype == self.keyed:
            _move(self._covers, self._host, device, host)

    def loaded_back(self, ptype: PageType, host: Iterable[int], device: Iterable[int]) -> None:
        """The tier copied `host` ids into fresh `device` slots: the spans follow them."""
        if ptype == self.keyed:
            _move(self._host, self._covers, host, device)

    def host_freed(self, ptype: PageType, host: Iterable[int]) -> None:
        """Host memory freed these ids (evicted, dropped, or loaded back): spans still named
        by them go."""
        if ptype == self.keyed:
            self._drop(self._host, host)

    def _drop(self, covers: dict[int, list[int]], keys: Iterable[int]) -> None:
        """Uncount the spans `keys` name in `covers`; publish the blocks no span covers now."""
        gone: list[int] = []
        for key in keys:
            for h in covers.pop(int(key), ()):
                left = self._count[h] - 1
                if left:
                    self._count[h] = left
                else:
                    del self._count[h]
                    gone.append(h)
        if gone:
            from sglang.srt.disaggregation.kv_events import BlockRemoved

            self._queue.append(BlockRemoved(block_hashes=gone))
            self.removed_blocks += len(gone)

    def _store(
        self,
        tokens: Sequence[int],
        first: int,
        hashes: list[int],
        chain: list[int],
        namespace: str | None,
    ) -> None:
        """Count `hashes` (blocks first, first + 1, ...); publish those now covered once."""
        new = []
        for i, h in enumerate(hashes):
            self._count[h] = self._count.get(h, 0) + 1
            if self._count[h] == 1:
                new.append(first + i)
        if new:
            self._publish(tokens, new, chain, namespace)

    def _publish(
        self, tokens: Sequence[int], blocks: list[int], chain: list[int], namespace: str | None
    ) -> None:
        """One BlockStored per run of consecutive new blocks (parent: the block before)."""
        from sglang.srt.disaggregation.kv_events import BlockStored

        salt, lora = (None, None) if self._labels is None else self._labels(namespace)

        runs: list[list[int]] = []
        for b in blocks:
            if runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        page = self.page
        for run in runs:
            hashes = [chain[b] for b in run]
            ids = [int(t) for t in tokens[run[0] * page : (run[-1] + 1) * page]]
            parent = None if run[0] == 0 else chain[run[0] - 1]
            self.published_blocks += len(run)
            tail = self._queue[-1] if self._queue else None
            if isinstance(tail, BlockStored) and tail.block_hashes[-1] == parent:
                tail.block_hashes.extend(hashes)  # continues the last store: one record
                tail.token_ids.extend(ids)
                continue
            self._queue.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=ids,
                    block_size=page,
                    lora_id=None,
                    cache_salt=salt,
                    lora_name=lora,
                )
            )

    # ------------------------------------------------------------------ SGLang's side

    def take(self) -> list[Any]:
        """Everything recorded since the last call, oldest first (SGLang's recorder contract)."""
        events, self._queue = self._queue, []
        return events

    def published(self) -> int:
        """Blocks a router following these events holds now."""
        return len(self._count)


def _move(
    source: dict[int, list[int]],
    target: dict[int, list[int]],
    old: Iterable[int],
    new: Iterable[int],
) -> None:
    """Spans named by `old[i]` in `source` are named by `new[i]` in `target` (a tier move)."""
    for a, b in zip(old, new, strict=True):
        blocks = source.pop(int(a), None)
        if blocks is not None:
            target[int(b)] = blocks


def attach(cache: Any, enabled: bool, labels: Labels | None = None) -> HitSpanEvents | None:
    """Give `cache` (a JengaRadixCache) a recorder when SGLang asked for KV events; `labels`
    names a namespace's stores (`HitSpanEvents`)."""
    if not enabled or cache.disable:
        return None
    # hits end at states, unless a PD decode worker's peer sends them: then every page is one
    at_states = cache.slot_tree.hits_at_states
    whole_paths = at_states or cache.slots.window is not None
    keyed = cache.state_type if at_states else cache.slots.kv_type
    events = HitSpanEvents(cache.page_size, whole_paths, labels, keyed)
    cache.kv_events = events
    cache.slot_tree.events = events
    cache.slots.events = events
    if cache.host is not None:  # spans follow their pages to host and back (module doc)
        cache.host.memory.events = events
        cache.host.copies.events = events
    return events
