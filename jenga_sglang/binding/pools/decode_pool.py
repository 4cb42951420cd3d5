"""The prefill-decode decode side's request pool over the Jenga pool.

SGLang's decode worker builds `HybridMambaDecodeReqToTokenPool`: rows for the running requests
plus `--disaggregation-decode-extra-slots` rows for requests pre-allocated while their KV and
Mamba state arrive from prefill, and a Mamba pool sized for all of them. Over the Jenga pool a
state is one more page of the shared buffer, so this class keeps SGLang's rows and takes our
Mamba pool and slot allocator (`JengaMambaRows`); the pool's state reserve counts the
pre-allocated requests as well (binding/pools/hook.py). Imported only by a decode worker.
"""

from __future__ import annotations

from sglang.srt.disaggregation.decode import HybridMambaDecodeReqToTokenPool

from jenga_sglang.binding.pools.sglang_pool import JengaMambaRows


class JengaHybridMambaDecodeReqToTokenPool(
    JengaMambaRows,
    HybridMambaDecodeReqToTokenPool,  # type: ignore[misc]  # sglang has no types
):
    """SGLang's decode request pool (pre-allocation rows included) with our Mamba pool."""
