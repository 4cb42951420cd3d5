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
Ours carry an id above any model's layer range that also encodes the page type and where every
tensor of a page lies in it, with its shape, strides and dtype (`entry_id`): a peer on SGLang's
per-layer buffers, or on a Jenga pool that lays a page out otherwise, has no entry of that id,
and SGLang stops the transfer ("Decode peer is missing a transfer entry") instead of moving
bytes to the wrong place. Re-slicing KV heads or state between peers of different attention TP
sizes cuts a per-layer row, which a page is not: `around_resliced` fails those transfers with
the reason, hooked by a PD worker that builds the pool (`install`).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jenga_sglang.pool.layout import PageRegion, PoolLayout
from jenga_sglang.radix.pages import PageType

#: Ids at or above this are Jenga page regions; a model's layer ids stay far below it, and
#: SGLang sends ids as unsigned 32-bit integers.
ENTRY_ID_BASE = 3 << 30
CONN = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager"
_installed = False  # the re-slice guard is hooked in this process (`install`)
logger = logging.getLogger(__name__)

BufInfos = tuple[list[int], list[int], list[int]]


def entry_id(ptype: PageType, region: PageRegion, views: Sequence[torch.Tensor]) -> int:
    """The layer id a page type's region carries: equal on two peers when the type, its page
    bytes and the layout of every view inside a page are (a 30-bit digest of them)."""
    layout = [
        (view.data_ptr() - region.ptr, tuple(view.shape[1:]), view.stride(), str(view.dtype))
        for view in views
    ]
    text = f"jenga:{ptype.kind.name}:{ptype.group}:{region.item_len}:{layout}"
    return ENTRY_ID_BASE + zlib.crc32(text.encode()) % (1 << 30)


def _views(layout: PoolLayout, ptype: PageType) -> list[torch.Tensor]:
    """Every per-layer view of `ptype`'s pages, rows first (the layers' K and V, or their conv
    and temporal states)."""
    if ptype in layout.kv:
        return [view for layer in layout.kv[ptype] for view in (layer.k, layer.v)]
    state = layout.state[ptype]
    return [*state.conv, *state.temporal]


@dataclass(frozen=True)
class TransferEntry:
    """A page type's one registered region and the layer id it is paired by."""

    region: PageRegion
    layer_id: int

    @classmethod
    def of(cls, layout: PoolLayout, ptype: PageType) -> TransferEntry:
        region = layout.region(ptype)
        return cls(region, entry_id(ptype, region, _views(layout, ptype)))

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


def install() -> None:
    """Hook the two re-slicing methods (AROUND, `around_resliced`) in this process: a PD worker
    building the pool calls it. Not at plugin registration: that would import SGLang's Mooncake
    connector into every server, and a stock `--enable-hierarchical-cache` server then reported
    its host hits as device hits (tests/test_e2e_host_tier.py; the cause is not traced)."""
    global _installed
    if _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for method in ("send_kvcache_slice", "_send_mamba_state_slice"):
        HookRegistry.register(f"{CONN}.{method}", around_resliced, HookType.AROUND)
    HookRegistry.apply_hooks()  # patches targets not patched yet: these two
    _installed = True
