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
should count it. Each store and removal names its tier as SGLang's HiCache does (`medium`:
"GPU", or "CPU_PINNED" for host memory). A demotion moves the span from the device slot to the
host id its copy went to (`demoted`): its blocks are stored on the host tier, then those no
device span still covers are removed from the device tier. A load-back moves it back the same
way (`loaded_back`), and the host copy's going (`host_freed`: host eviction, or the tier
dropping it) removes it from the host tier. A block is held on a tier while a span of that
tier covers it. smg 1.13 keeps a block routable while either tier holds a copy, so it predicts
host hits; a router that ignores `medium` would drop the block at its device removal. Only the
keyed page type's moves count (`keyed`: the state type where hits end at states, else the full
KV type).

Namespaces (LoRA adapters, cache salts) seed the chain, so their blocks never meet, and each
store names its namespace as SGLang's own cache does: `cache_salt`, and `lora_name` where the
scheduler knows the adapter's public name (`labels`, binding/cache/namespaces.py).
A block is held, per tier, with a count of the spans that cover it (published at 0 -> 1,
removed at 1 -> 0), so a shared head stays published while any checkpoint below it remains.
Chained hashes make equal paths equal blocks. The cost is one hash per block of a new
checkpoint's path, paid only when events are on (with a host tier, also each block's parent
and ids, kept for its store on the other tier). The tree itself calls nothing here: SlotTree
reports adoptions and SglangSlots the slots the tree gives back (binding/slots/tree.py,
slots/sglang_slots.py).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jenga_sglang.radix.pages import PageType

_MASK, _SIGN = (1 << 64) - 1, 1 << 63
#: SGLang's `StorageMedium` values for the device and the host tier (its enum names no
#: pageable host memory; CPU_PINNED is its host tier's, and routers read it as "host").
DEVICE, HOST = "GPU", "CPU_PINNED"

#: A namespace (None: the default one) to the (cache_salt, lora_name) its stores carry.
Labels = Callable[[str | None], tuple[str | None, str | None]]
#: A block to publish: its hash, its parent's (None at the root) and its token ids.
Block = tuple[int, int | None, Sequence[int]]


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


class _Tier:
    """The spans one tier's ids name, and per block how many of them cover it."""

    __slots__ = ("count", "medium", "spans")

    def __init__(self, medium: str) -> None:
        self.medium = medium  # SGLang's StorageMedium value its events carry
        self.spans: dict[int, list[int]] = {}  # slot or host id -> block hashes of its span
        self.count: dict[int, int] = {}  # block hash -> spans of this tier covering it

    def cover(self, key: int, blocks: list[int]) -> list[int]:
        """Name `blocks` by `key`; the blocks this tier holds now and did not before."""
        self.spans[key] = blocks
        new = []
        for h in blocks:
            self.count[h] = self.count.get(h, 0) + 1
            if self.count[h] == 1:
                new.append(h)
        return new

    def uncover(self, keys: Iterable[int]) -> list[int]:
        """Drop the spans `keys` name; the blocks this tier no longer holds."""
        gone = []
        for key in keys:
            for h in self.spans.pop(int(key), ()):
                left = self.count[h] - 1
                if left:
                    self.count[h] = left
                else:
                    del self.count[h]
                    gone.append(h)
        return gone


class HitSpanEvents:
    """The recorder `BasePrefixCache.take_events()` reads (`kv_events.take()`), fed by the
    binding with the checkpoints (or KV pages) the tree adopts and the slots it frees."""

    def __init__(
        self,
        page_size: int,
        whole_paths: bool,
        labels: Labels | None = None,
        keyed: PageType | None = None,
        host_tier: bool = False,
    ) -> None:
        self.page = page_size
        # Mamba or a window: a span is the path [0, end) to where a hit can end; else a page
        self.whole_paths = whole_paths
        self._labels = labels  # namespace -> (cache_salt, lora_name) of its stores
        self.keyed = keyed  # the page type whose slots name spans (host moves of others: no-op)
        self._device, self._host = _Tier(DEVICE), _Tier(HOST)
        # With a host tier, what a block's store on the other tier needs: parent, ids, namespace
        self._blocks: dict[int, tuple[int | None, list[int], str | None]] | None = (
            {} if host_tier else None
        )
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
        todo = [(end, slot) for end, slot in spans if slot not in self._device.spans]
        todo = [(end, slot) for end, slot in todo if end % self.page == 0]  # whole pages only
        if not todo:
            return
        chain = chain_hashes(tokens[: max(end for end, _ in todo)], self.page, namespace)
        page = self.page

        def block(b: int) -> Block:
            return chain[b], None if b == 0 else chain[b - 1], tokens[b * page : (b + 1) * page]

        for end, slot in todo:
            blocks = end // page
            # The whole path to a checkpoint or node end; or the page alone (its parents are
            # pages the tree adopted before, or in this same insert).
            first = 0 if self.whole_paths else blocks - 1
            if self._blocks is not None:
                for b in range(first, blocks):
                    if chain[b] not in self._blocks:
                        h, parent, ids = block(b)
                        self._blocks[h] = (parent, [int(t) for t in ids], namespace)
            new = set(self._device.cover(slot, chain[first:blocks]))
            self._publish(
                [block(b) for b in range(first, blocks) if chain[b] in new], namespace, DEVICE
            )

    def freed(self, slots: Iterable[int]) -> None:
        """The tree gave these slots back (evicted, or a state dropped): their spans go."""
        self._drop(self._device, slots)

    def demoted(self, ptype: PageType, device: Iterable[int], host: Iterable[int]) -> None:
        """The tier copied `device` slots to `host` ids (same order) before freeing them: their
        spans stay published, now on the host tier (a hit on them is a load-back away)."""
        if ptype == self.keyed:
            self._move(self._device, self._host, device, host)

    def loaded_back(self, ptype: PageType, host: Iterable[int], device: Iterable[int]) -> None:
        """The tier copied `host` ids into fresh `device` slots: the spans follow them."""
        if ptype == self.keyed:
            self._move(self._host, self._device, host, device)

    def host_freed(self, ptype: PageType, host: Iterable[int]) -> None:
        """Host memory freed these ids (evicted, dropped, or loaded back): spans still named
        by them go."""
        if ptype == self.keyed:
            self._drop(self._host, host)

    def _move(self, source: _Tier, target: _Tier, old: Iterable[int], new: Iterable[int]) -> None:
        """Spans named by `old[i]` on `source` are named by `new[i]` on `target`: the blocks
        `target` did not hold are stored there first, then those `source` no longer holds are
        removed from it, so a block never leaves a router's index in between."""
        moved = [(int(a), int(b)) for a, b in zip(old, new, strict=True) if int(a) in source.spans]
        if not moved:
            return
        assert self._blocks is not None, "a tier move without a host tier"
        known = self._blocks
        for a, b in moved:
            fresh = target.cover(b, source.spans[a])
            if fresh:  # a span's blocks are of one namespace: its chain is seeded by it
                blocks: list[Block] = [(h, *known[h][:2]) for h in fresh]
                self._publish(blocks, known[fresh[0]][2], target.medium)
        self._drop(source, [a for a, _ in moved])

    def _drop(self, tier: _Tier, keys: Iterable[int]) -> None:
        """Drop the spans `keys` name on `tier`; publish the blocks it no longer holds as
        removed from it (and forget those no tier holds)."""
        gone = tier.uncover(keys)
        if not gone:
            return
        from sglang.srt.disaggregation.kv_events import BlockRemoved

        if self._blocks is not None:
            other = self._host if tier is self._device else self._device
            for h in gone:
                if h not in other.count:
                    del self._blocks[h]
        self._queue.append(BlockRemoved(block_hashes=gone, medium=tier.medium))
        self.removed_blocks += len(gone)

    def _publish(self, blocks: list[Block], namespace: str | None, medium: str) -> None:
        """Publish `blocks` (each after its parent, in path order) on `medium`: a block that
        continues the last record (it ends at the block's parent) joins it, so a run of a path
        is one BlockStored."""
        from sglang.srt.disaggregation.kv_events import BlockStored

        salt, lora = (None, None) if self._labels is None else self._labels(namespace)
        self.published_blocks += len(blocks)
        runs: list[tuple[int | None, list[int], list[int]]] = []  # (parent, hashes, ids)
        for h, parent, ids in blocks:
            if runs and runs[-1][1][-1] == parent:
                runs[-1][1].append(h)
                runs[-1][2].extend(int(t) for t in ids)
            else:
                runs.append((parent, [h], [int(t) for t in ids]))
        for parent, hashes, ids in runs:
            tail = self._queue[-1] if self._queue else None
            if (
                isinstance(tail, BlockStored)
                and tail.block_hashes[-1] == parent
                and (tail.medium, tail.cache_salt, tail.lora_name) == (medium, salt, lora)
            ):
                tail.block_hashes.extend(hashes)  # continues the last store: one record
                tail.token_ids.extend(ids)
                continue
            self._queue.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=ids,
                    block_size=self.page,
                    lora_id=None,
                    cache_salt=salt,
                    lora_name=lora,
                    medium=medium,
                )
            )

    # ------------------------------------------------------------------ SGLang's side

    def take(self) -> list[Any]:
        """Everything recorded since the last call, oldest first (SGLang's recorder contract)."""
        events, self._queue = self._queue, []
        return events

    def published(self) -> int:
        """Blocks a router following these events holds now, on either tier."""
        return len(self._device.count.keys() | self._host.count.keys())

    def check_integrity(self) -> None:
        """Each tier's block counts are the spans of that tier counted block by block, and
        with a host tier every block held on either tier (and no other) has what a store on
        the other tier needs."""
        for tier in (self._device, self._host):
            counted: dict[int, int] = {}
            for blocks in tier.spans.values():
                for h in blocks:
                    counted[h] = counted.get(h, 0) + 1
            assert counted == tier.count, f"{tier.medium}: block counts differ from its spans"
        if self._blocks is not None:
            held = self._device.count.keys() | self._host.count.keys()
            assert self._blocks.keys() == held, "blocks kept for tier moves differ from those held"


def attach(cache: Any, enabled: bool, labels: Labels | None = None) -> HitSpanEvents | None:
    """Give `cache` (a JengaRadixCache) a recorder when SGLang asked for KV events; `labels`
    names a namespace's stores (`HitSpanEvents`)."""
    if not enabled or cache.disable:
        return None
    # hits end at states, unless a PD decode worker's peer sends them: then every page is one
    at_states = cache.slot_tree.hits_at_states
    whole_paths = at_states or cache.slots.window is not None
    keyed = cache.state_type if at_states else cache.slots.kv_type
    events = HitSpanEvents(cache.page_size, whole_paths, labels, keyed, cache.host is not None)
    cache.kv_events = events
    cache.slot_tree.events = events
    cache.slots.events = events
    if cache.host is not None:  # spans follow their pages to host and back (module doc)
        cache.host.memory.events = events
        cache.host.copies.events = events
    return events
