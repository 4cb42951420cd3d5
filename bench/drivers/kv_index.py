"""A worker's KV events, read as a cache-aware router reads them: a ZMQ feed and a block index.

smg's event-driven `cache_aware` policy keeps, per worker, the blocks the worker's
`BlockStored` / `BlockRemoved` events name (each a hash chained from its parent's, with the
tier it is on) and predicts a request's hit as the run of its leading blocks the worker holds
on the device or in host memory. `BlockIndex` is a model of
that index, `EventFeed` subscribes to a worker's ZMQ publisher (`--kv-events-config`). They
stand in for smg where smg cannot front a worker here: for gpt-oss it loads OpenAI's Harmony
vocabulary from the network at start-up, which this machine cannot reach.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

#: The tier a store or removal names (its `medium`, SGLang's `StorageMedium` values and the
#: names routers map alike), as smg 1.13 indexes it: device or host. Disk and external copies
#: are not indexed; an unknown medium is dropped.
TIERS: dict[str | None, str | None] = {
    None: "device", "GPU": "device", "DEVICE": "device",
    "CPU": "host", "CPU_PINNED": "host", "CPU_TIER1": "host",
    "CPU_TIER2": None, "DISK": None, "NVME": None, "STORAGE": None, "EXTERNAL": None,
}  # fmt: skip


class BlockIndex:
    """Block hash -> the token path it ends, as the router rebuilds it from events.

    Per block, the copies each tier holds: a store adds one on the tier its `medium` names, a
    removal takes one off that tier, and the block leaves the index when neither the device
    nor the host holds a copy (smg 1.13's gateway: a block moved to host memory stays
    routable, so a hit served from host is predicted).

    `strict` (tests): a store under a parent the index lacks, a block stored twice on one tier
    or a removal of a copy the tier lacks is an AssertionError, where a router would shrug."""

    def __init__(self, strict: bool = False) -> None:
        self.blocks: dict[int, tuple[int, ...]] = {}
        self.copies: dict[int, dict[str, int]] = {}  # block hash -> tier -> copies
        self.block_size = 1
        self.strict = strict

    def apply(self, events: Sequence[Any]) -> None:
        for event in events:
            name = type(event).__name__
            if name == "AllBlocksCleared":
                self.blocks.clear()
                self.copies.clear()
                continue
            medium = getattr(event, "medium", None)
            tier = TIERS.get(medium.upper() if isinstance(medium, str) else medium)
            if tier is None:
                continue
            if name == "BlockStored":
                self._store(event, tier)
            elif name == "BlockRemoved":
                for h in event.block_hashes:
                    self._remove(h, tier)

    def _store(self, event: Any, tier: str) -> None:
        self.block_size = size = int(event.block_size)
        parent = self.blocks.get(event.parent_block_hash, ())
        known = event.parent_block_hash is None or parent
        assert known or not self.strict, "store under an unknown parent"
        for i, h in enumerate(event.block_hashes):
            parent = parent + tuple(event.token_ids[i * size : (i + 1) * size])
            copies = self.copies.setdefault(h, {})
            assert not copies.get(tier) or not self.strict, f"block {h} stored twice on {tier}"
            copies[tier] = copies.get(tier, 0) + 1
            self.blocks[h] = parent

    def _remove(self, h: int, tier: str) -> None:
        copies = self.copies.get(h, {})
        assert copies.get(tier) or not self.strict, f"removed a {tier} copy of {h} it lacks"
        if copies.get(tier):
            copies[tier] -= 1
        if not any(copies.values()):
            self.copies.pop(h, None)
            self.blocks.pop(h, None)

    def on(self, tier: str) -> set[int]:
        """The blocks `tier` holds a copy of."""
        return {h for h, copies in self.copies.items() if copies.get(tier)}

    def paths(self) -> set[tuple[int, ...]]:
        """The token paths of the blocks held: every whole-block prefix a hit may count."""
        return set(self.blocks.values())

    def predicted_hit(self, tokens: Sequence[int]) -> int:
        """Tokens of the leading run of whole blocks of `tokens` the index holds."""
        paths, n, size = self.paths(), 0, self.block_size
        while n + size <= len(tokens) and tuple(tokens[: n + size]) in paths:
            n += size
        return n


class EventFeed:
    """A worker's ZMQ KV events, received in a thread of its own (it polls every 0.2 s and
    stops when the context ends). Loopback only: the feed binds 127.0.0.1:`port` and the
    worker's publisher connects to it (SGLang binds only for a wildcard host)."""

    def __init__(self, port: int, topic: str = "kv") -> None:
        self.port, self.topic = port, topic
        self._events: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.last_arrival = 0.0

    def config(self) -> str:
        """The worker's `--kv-events-config` value."""
        endpoint = f"tcp://127.0.0.1:{self.port}"
        return json.dumps({"publisher": "zmq", "endpoint": endpoint, "topic": self.topic})

    def __enter__(self) -> EventFeed:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import msgspec
        import zmq
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.setsockopt(zmq.RCVTIMEO, 200)
        sock.bind(f"tcp://127.0.0.1:{self.port}")
        try:
            while not self._stop.is_set():
                try:
                    parts = sock.recv_multipart()
                except zmq.Again:
                    continue
                batch = decoder.decode(parts[-1])
                with self._lock:
                    self._events.extend(batch.events)
                    self.last_arrival = time.monotonic()
        finally:
            sock.close(linger=0)
            ctx.term()

    def take(self, quiet_s: float = 1.0, max_s: float = 10.0) -> list[Any]:
        """Events received so far, once none has arrived for `quiet_s`, counted from this
        call at the earliest (what a worker publishes as it answers is still on its way);
        at most `max_s`."""
        start = time.monotonic()
        while time.monotonic() < start + max_s:
            with self._lock:
                if time.monotonic() - max(start, self.last_arrival) >= quiet_s:
                    break
            time.sleep(0.1)
        with self._lock:
            events, self._events = self._events, []
        return events
