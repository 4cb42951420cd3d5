"""Why `--enable-jenga --jenga-pool` refuses prefill-decode disaggregation (binding/options.py
`check_disaggregation`): SGLang's transfer engines register each pool buffer as
(pointer, length, item length) and copy slot i from pointer + i x item length. On the Jenga
pool's strided views that address is not slot i's bytes: the Mamba state buffers register and
would move the wrong bytes without an error; the KV buffers do not register at all (SGLang's
registration reads descriptors our views do not have). The refusal and its fallback
(`--no-jenga-pool`) are tested in tests/test_binding_options.py."""

from __future__ import annotations

from typing import Any

import pytest
from test_sglang_jenga_pool import _pools, sg  # noqa: F401  # sg: the module's fixture

pytestmark = pytest.mark.sglang


def _misaddressed(ptrs: list[int], item_lens: list[int], rows: list[Any]) -> int:
    """Buffers whose slot 3, as a transfer engine computes it, is not the view's slot 3."""
    return sum(
        ptr + 3 * item != row[3].data_ptr()
        for ptr, item, row in zip(ptrs, item_lens, rows, strict=True)
    )


def test_sglang_registration_fails_or_misaddresses_the_pools_views(sg: Any) -> None:  # noqa: F811
    pools = _pools(sg)
    kv = pools.token_to_kv_pool.full_kv_pool
    with pytest.raises(AttributeError, match="_kv_buffer_descs"):
        kv.get_contiguous_buf_infos()  # KV: SGLang's registration stops on our views
    views = kv.k_buffer + kv.v_buffer
    row = views[0].shape[1] * views[0].shape[2] * views[0].element_size()
    assert views[0].stride(0) * views[0].element_size() > row  # a page apart, not a row

    mamba = pools.req_to_token_pool.mamba_pool
    ptrs, _, item_lens = mamba.get_contiguous_buf_infos()  # states: registered, and wrong
    states = [t for _, t, _, _ in mamba._iter_transfer_state_entries()]
    assert len(ptrs) == len(states) > 0
    assert _misaddressed(ptrs, item_lens, states) == len(states)  # every state tensor
