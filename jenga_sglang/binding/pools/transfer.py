"""What SGLang's prefill-decode transfer engines register for the Jenga pool: one region per
page type, a whole small page per row.

SGLang's engines (Mooncake's, and jenga_sglang/cpu_transfer.py's CPU stand-in) take each buffer
as (pointer, length, item length) and move row i as the bytes [pointer + i x item, + item),
merging runs of consecutive rows. A per-layer view of the pool is a whole page apart from row
to row, so per-layer registration would move the wrong bytes. A page type's rows, though, are
uniformly strided over the one buffer (pool/layout.py), and a small page holds every layer's K
and V (or every layer's conv and temporal state) of its tokens: registered as one region whose
item is the page (`PoolLayout.region`), row i of it is page i, and one run moves all layers.

Entries are paired between the two peers by layer id (SGLang's `build_transfer_entry_pairs`).
Ours carry an id above any model's layer range that also encodes the page type and its bytes
(`entry_id`): a peer on SGLang's per-layer buffers, or on a Jenga pool of another geometry, has
no entry of that id, and SGLang stops the transfer ("Decode peer is missing a transfer entry")
instead of moving bytes to the wrong place. Re-slicing KV heads or state between peers of
different attention TP sizes cuts a per-layer row, which a page is not: `around_resliced` fails
those transfers with the reason.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jenga_sglang.pool.layout import PageRegion, PoolLayout
from jenga_sglang.radix.pages import PageType

#: Ids at or above this are Jenga page regions; a model's layer ids stay far below it, and
#: SGLang sends ids as unsigned 32-bit integers.
ENTRY_ID_BASE = 3 << 30
CONN = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager"
logger = logging.getLogger(__name__)

BufInfos = tuple[list[int], list[int], list[int]]


def entry_id(ptype: PageType, item_len: int) -> int:
    """The layer id a page type's region carries: equal on two peers iff the type and its
    page bytes are."""
    digest = zlib.crc32(f"jenga:{ptype.kind.name}:{ptype.group}:{item_len}".encode())
    return ENTRY_ID_BASE + digest % (1 << 30)


@dataclass(frozen=True)
class TransferEntry:
    """A page type's one registered region and the layer id it is paired by."""

    region: PageRegion
    layer_id: int

    @classmethod
    def of(cls, layout: PoolLayout, ptype: PageType) -> TransferEntry:
        region = layout.region(ptype)
        return cls(region, entry_id(ptype, region.item_len))

    def buf_infos(self) -> BufInfos:
        """SGLang's (pointers, lengths, item lengths) for the region."""
        return [self.region.ptr], [self.region.length], [self.region.item_len]


def is_jenga_entries(layer_ids: Sequence[int]) -> bool:
    """Whether a registration's layer ids are Jenga page regions."""
    return any(int(i) >= ENTRY_ID_BASE for i in layer_ids)


def around_resliced(original: Callable[..., Any], manager: Any, *a: Any, **k: Any) -> Any:
    """Fail a re-sliced transfer of Jenga page regions (module doc): return SGLang's failure
    code, which fails the request with its transfer error, after logging why."""
    if is_jenga_entries(getattr(manager.kv_args, "kv_layer_ids", None) or []):
        logger.error(
            "PD over the Jenga pool moves whole pages, which cannot be re-sliced between "
            "peers of different attention TP sizes: run prefill and decode with equal --tp "
            "(or --no-jenga-pool on both sides)"
        )
        return -1
    return original(manager, *a, **k)


def register(registry: Any, hook_type: Any) -> None:
    for method in ("send_kvcache_slice", "_send_mamba_state_slice"):
        registry.register(f"{CONN}.{method}", around_resliced, hook_type.AROUND)
