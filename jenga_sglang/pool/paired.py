"""A JengaPool behind the full and the window KV allocators of a sliding-window model.

SGLang gives every token of a hybrid-SWA model (gpt-oss) a full-attention slot and a
sliding-window slot (`SWATokenToKVPoolAllocator`), from two pools of a fixed ratio
(`--swa-full-tokens-ratio`, 0.8). Here both come from one Jenga pool: each large page is carved
into full or window KV pages as tokens need them, and a window slot a running request frees
once it falls out of its window (or the tree trims) gives its bytes back to full KV.

Tokens arrive in pairs (a prefill or decode step allocates one slot of each), so what either
allocator reports as available to SGLang's admission is the number of *pairs* that fit
(`pairs`): reporting each type's own room would count the same free large pages twice, and the
scheduler would admit requests whose allocation then fails. `room` (each type alone) is what an
allocation checks: after the full half of n pairs is taken, the window half still fits.
"""

from __future__ import annotations

from jenga_sglang.pool.engine import EnginePool
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.pages import PageType


class PairedJengaPool(EnginePool):
    """`pool` shared by a full-attention KV type and a sliding-window KV type."""

    def __init__(self, pool: JengaPool, full_type: PageType, window_type: PageType) -> None:
        super().__init__(pool, (full_type, window_type))
        self.full_type, self.window_type = full_type, window_type

    def pairs(self) -> int:
        """The most tokens that can each get a full and a window page now.

        n pairs need ceil(max(0, n - empty_t) / per_t) free large pages for each type t; the
        sum grows with n, so the largest n within the free large pages is found by bisection
        between the empty pages alone and everything free given to one type."""
        pool = self.pool
        free_large = pool.free_large_pages
        geo = pool.geometry
        types = (self.full_type, self.window_type)
        empty = [pool.empty_pages(t) for t in types]
        per = [geo.of(t).per_large for t in types]

        def fits(n: int) -> bool:
            need = sum(-(-max(0, n - e) // k) for e, k in zip(empty, per, strict=True))
            return need <= free_large

        lo, hi = 0, min(e + free_large * k for e, k in zip(empty, per, strict=True))
        while lo < hi:  # fits(lo) holds, fits(hi + 1) does not
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def available(self, ptype: PageType) -> int:
        return self.pairs()

    def most_full(self, window_pages: int) -> int:
        """The most full pages (not tokens) one request could hold if the window type kept
        `window_pages` (the binding asks for a request's window and one page more) and full
        took the rest."""
        pool, geo = self.pool, self.pool.geometry
        spare = max(0, window_pages - pool.empty_pages(self.window_type))
        free_large = pool.free_large_pages - -(-spare // geo.of(self.window_type).per_large)
        full_per = geo.of(self.full_type).per_large
        return max(0, pool.empty_pages(self.full_type) + free_large * full_per)
