"""Serve real SGLang `Req`s through the scheduler's cache calls, with an emulated forward.

A `Session` is one engine: SGLang's CPU pools (tests/test_binding_backend.py `_params`) and
our `JengaRadixCache`. A request goes the way the scheduler drives it: `init_next_round_input`
(match_prefix, copy-on-write of the hit's state), the tree lock PrefillAdder takes,
`alloc_req_slots`, per chunk `alloc_token_slots` + the deferred COW / clear of `ScheduleBatch`
+ the model runner + a forward + `checkpoint_kv_cache`, decode steps, and
`release_kv_cache(checkpoint=True)`.

The "forward" writes a deterministic recurrence of the tokens (h <- h / 2 + t, exact in float32
for small ints) into every conv and temporal tensor of a Mamba slot, so a slot's content names
exactly which prefix it is the state of. It writes what the model runner writes:

* the live slot (`req.kv.mamba_pool_idx`) gets the state after the whole chunk / decode step;
* with `--mamba-radix-cache-strategy extra_buffer`, a prefill chunk first goes through SGLang's
  own `ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend` (it picks the track entry
  and sets `mamba_last_track_seqlen`, the branch point included), and the forward then writes
  the state after `prefix_len + (track_seqlen - prefix_len) // chunk * chunk` tokens (the
  hybrid linear-attention backend's `mamba_track_aligned_lens`: the +1 of a forced `h` read
  cancels under the floor) into the ping-pong slot the pool's row mapping names
  (`mamba_track_indices`). A decode step at a track boundary (`seq_len % mamba_track_grid ==
  0`, `ScheduleBatch.prepare_for_decode`) writes the state after the step into the
  `mamba_next_track_idx` slot, and the result processor's bookkeeping follows
  (`_handle_finish_state_updated_req` and `_mamba_prefix_cache_update` without overlap
  lookahead: last/prev track seqlen, last/next track index).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from tests.admission import lock_and_load_back
from tests.test_binding_backend import _params

CHUNK = 64  # default prefill chunk of a session
MAMBA_CHUNK = 64  # the model's mamba_chunk_size = SGLang's mamba_cache_chunk_size (page 1)


def load_sg() -> Any:
    import torch
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
    from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
    from sglang.srt.runtime_context import mamba_cache_chunk_size, mamba_track_grid
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SimpleNamespace(
        torch=torch,
        FINISH_LENGTH=FINISH_LENGTH,
        InitLoadBackParams=InitLoadBackParams,
        Req=Req,
        ScheduleBatch=ScheduleBatch,
        alloc_req_slots=alloc_req_slots,
        alloc_token_slots=alloc_token_slots,
        checkpoint_kv_cache=checkpoint_kv_cache,
        release_kv_cache=release_kv_cache,
        mamba_cache_chunk_size=mamba_cache_chunk_size,
        mamba_track_grid=mamba_track_grid,
        SamplingParams=SamplingParams,
    )


def recur(state: Any, tokens: Sequence[int]) -> Any:
    """The emulated SSM: h <- h / 2 + t per token."""
    for t in tokens:
        state = state * 0.5 + float(t)
    return state


def expected(sg: Any, tokens: Sequence[int]) -> float:
    return float(recur(sg.torch.zeros((), dtype=sg.torch.float32), tokens))


def tokens(start: int, n: int, base: int = 1) -> list[int]:
    """`n` small token ids; different `base`s never share a token."""
    return [base + (start + 7 * i) % 13 for i in range(n)]


class Session:
    """One engine: SGLang pools + our cache, serving requests as the scheduler does."""

    def __init__(
        self,
        sg: Any,
        admission: str = "speculative",
        prompt_end: bool = False,
        extra_buffer: bool = False,
        int8_slots: int = 0,
        radix_sessions: bool = False,
        host_gb: float = 0.0,
        host_bw: float = 25.0,
        kv_size: int = 1024,
        host_ratio: float = 0.0,
        from_peer: bool = False,
    ) -> None:
        """`int8_slots` > 0: `--enable-int8-mamba-checkpoint`, SGLang's int8 checkpoint pool
        of that many slots beside the Mamba pool (the tree's states live there);
        `radix_sessions`: `--enable-session-radix-cache`; `host_gb` > 0: `--jenga-host-gb`
        (`host_bw`: `--jenga-host-bw`), `host_ratio` > 0: `--enable-hierarchical-cache` with
        that `--hicache-ratio`; `kv_size`: KV slots of the pool; `from_peer`: a PD decode
        worker's tree (`--disaggregation-decode-enable-radix-cache`, models/spec.py
        `states_from_peer`)."""
        from jenga_sglang.binding.cache.backend import JengaRadixCache
        from jenga_sglang.binding.options import SERVER_POLICY, JengaOptions
        from jenga_sglang.models import get_spec
        from jenga_sglang.models.spec import states_from_peer

        self.sg = sg
        self.extra_buffer = extra_buffer
        params = _params(True, kv_size, extra_buffer=extra_buffer)
        params.enable_session_radix_cache = radix_sessions
        self.cache_params = params
        self.pool = params.req_to_token_pool
        self.alloc = params.token_to_kv_pool_allocator
        self.checkpoints = self._checkpoint_pool(int8_slots) if int8_slots else None
        self.pool.mamba_ckpt_pool = self.checkpoints  # what SGLang's pool sets with the flag
        spec = get_spec("nemotron-h-8b")
        self.cache = JengaRadixCache(
            params,
            states_from_peer(spec) if from_peer else spec,
            JengaOptions(
                enabled=True,
                policy=replace(SERVER_POLICY, admission=admission, prompt_end=prompt_end),
                host_gb=host_gb,
                host_ratio=host_ratio,
                host_bw=host_bw,
            ),
        )
        # ScheduleBatch fields `_mamba_radix_cache_v2_req_prepare_for_extend` reads.
        self.batch = SimpleNamespace(
            model_config=SimpleNamespace(
                hf_text_config=SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK)
            ),
            tree_cache=self.cache,
            req_to_token_pool=self.pool,
        )
        self.rid = 0
        self.chunk = CHUNK  # the scheduler's prefill chunk (token budget per round)

    def _checkpoint_pool(self, slots: int) -> Any:
        from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

        mc = self.pool.mamba_pool.mamba_cache
        layers, _, heads, d_v, d_k = mc.temporal.shape
        return MambaCheckpointPool(
            num_layers=layers,
            num_slots=slots,
            num_heads=heads,
            head_v_dim=d_v,
            head_k_dim=d_k,
            conv_shapes=[tuple(c.shape[2:]) for c in mc.conv],
            conv_dtype=mc.conv[0].dtype,
            device="cpu",
            temporal_dtype=mc.temporal.dtype,
        )

    # ------------------------------------------------------------------ pool contents

    def read(self, slot: int) -> float:
        """The state in `slot` (float32 temporal); every conv tensor must hold the same."""
        mc = self.pool.mamba_pool.mamba_cache
        value = mc.temporal[:, slot]
        assert bool((value == value.flatten()[0]).all()), f"slot {slot}: mixed temporal"
        for conv in mc.conv:
            assert bool((conv[:, slot] == value.flatten()[0].to(conv.dtype)).all())
        return float(value.flatten()[0])

    def _write(self, slot: int, state: Any) -> None:
        mc = self.pool.mamba_pool.mamba_cache
        mc.temporal[:, slot] = state.to(mc.temporal.dtype)
        for conv in mc.conv:
            conv[:, slot] = state.to(conv.dtype)

    def _state(self, slot: int) -> Any:
        return self.pool.mamba_pool.mamba_cache.temporal[:, slot].flatten()[0].float()

    def _forward(self, slot: int, toks: Sequence[int]) -> None:
        self._write(slot, recur(self._state(slot), toks))

    def _deferred_cow_and_clear(self, req: Any) -> None:
        """ScheduleBatch collects the COW / clear, the model runner applies it."""
        batch = SimpleNamespace()
        self.sg.ScheduleBatch._collect_deferred_mamba_cow_and_clear(batch, [req])
        if batch.mamba_clear_indices is not None:
            self.pool.mamba_pool.clear_slots(batch.mamba_clear_indices)
        src, dst = batch.mamba_cow_src_indices, batch.mamba_cow_dst_indices
        if src is not None and self.checkpoints is not None:  # dequantized (ModelRunner)
            self.checkpoints.load_to_active(self.pool.mamba_pool, src, dst)
        elif src is not None:
            self.pool.copy_mamba_state(src, dst)

    def track_slot(self, req: Any, position: int) -> int:
        """The slot the forward writes a tracked state into (`mamba_track_indices`)."""
        mapping = self.pool.req_index_to_mamba_ping_pong_track_buffer_mapping
        slot = int(mapping[req.kv.req_pool_idx, position])
        assert slot == int(req.kv.mamba_ping_pong_track_buffer[position]), "mapping out of step"
        return slot

    def _extend(self, req: Any, start: int, end: int) -> None:
        """One prefill chunk [start, end): scheduler preparation, then the forward."""
        req.extend_end = end
        self._alloc_kv(req, start, end)
        self._deferred_cow_and_clear(req)
        live = int(req.kv.mamba_pool_idx)
        chunk = req.origin_input_ids[start:end]
        if self.extra_buffer:
            entry = self.sg.ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(
                self.batch, req
            )
            if entry.track_mask:
                size = self.sg.mamba_cache_chunk_size()
                tracked = start + (entry.track_seqlen - start) // size * size
                state = recur(self._state(live), chunk[: tracked - start])
                self._write(self.track_slot(req, entry.track_position), state)
        self._forward(live, chunk)

    def _decode_step(self, req: Any, token: int, seq_len: int) -> None:
        """One decode step whose input `token` makes the sequence `seq_len` long."""
        self._forward(int(req.kv.mamba_pool_idx), [token])
        req.kv.kv_committed_len = seq_len
        if not self.extra_buffer or seq_len % self.sg.mamba_track_grid(1) != 0:
            return
        position = req.kv.mamba_next_track_idx
        self._write(self.track_slot(req, position), self._state(int(req.kv.mamba_pool_idx)))
        req.kv.mamba_last_track_idx = position
        req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
        req.kv.mamba_last_track_seqlen = seq_len
        req.kv.mamba_next_track_idx = self.pool.get_mamba_ping_pong_other_idx(position)

    # ------------------------------------------------------------------ serving

    def admit(self, inp: Sequence[int], max_new: int, **fields: Any) -> Any:
        """A new `Req` (`fields`: as `request`'s), matched, locked and given its slots."""
        req = self.request(inp, max_new, **fields)
        self.take(req)
        return req

    def request(self, inp: Sequence[int], max_new: int, **fields: Any) -> Any:
        """A new `Req`, not matched yet (`fields`: more of its constructor's arguments, e.g.
        `cache_salt`, `lora_id`, `extra_key`)."""
        self.rid += 1
        return self.sg.Req(
            rid=str(self.rid),
            origin_input_text="",
            origin_input_ids=array("q", inp),
            sampling_params=self.sg.SamplingParams(temperature=0, max_new_tokens=max(1, max_new)),
            **fields,
        )

    def take(self, req: Any) -> None:
        """The scheduling round that admits `req`: matched, locked and given its slots."""
        req.init_next_round_input(self.cache)  # match_prefix(cow_mamba=True, req=req)
        lock_and_load_back(self.cache, req)
        self.sg.alloc_req_slots(self.pool, [req], self.cache)
        if req.prefix_len:  # alloc_for_extend: the prefix off the tree into the row
            prefix = self.cache.prefix_device_indices(req)
            self.pool.write((req.kv.req_pool_idx, slice(0, int(req.prefix_len))), prefix)
        self.cache.maybe_hand_to_session(req)  # alloc_for_extend's, once the row is written

    def prefill(
        self,
        req: Any,
        first_output: int,
        cut_at: int | None = None,
        follow_plan: bool = False,
        cut: Any = None,
    ) -> None:
        """Chunks of `self.chunk` tokens; `cut_at` ends a chunk exactly there (the branch cut),
        `follow_plan` ends one at each `req.mamba_branching_seqlen` (what prefill_cut does
        for no_buffer), and `cut(req)` (prefill_cut's rule) may shorten each chunk."""
        total = len(req.origin_input_ids)
        while req.prefix_len < total:
            start = req.prefix_len
            end = min(start + self.chunk, total)
            if follow_plan:
                cut_at = req.mamba_branching_seqlen
            if cut_at is not None and start < cut_at < end:
                end = cut_at
            req.extend_end = end
            if cut is not None:
                end = cut(req) or end
            self._extend(req, start, end)
            if end == total:
                req.output_ids.append(first_output)
            self.sg.checkpoint_kv_cache(req, self.cache)

    def decode_and_finish(self, req: Any, inp: Sequence[int], out: Sequence[int]) -> None:
        base = len(inp)
        if len(out) > 1:
            self._alloc_kv(req, base, base + len(out) - 1)
        for k in range(1, len(out)):
            self._decode_step(req, out[k - 1], base + k)
            req.output_ids.append(out[k])
        req.finished_reason = self.sg.FINISH_LENGTH(length=len(out))
        self.sg.release_kv_cache(req, self.cache, checkpoint=True)

    def serve(
        self, inp: Sequence[int], out: Sequence[int], cut_at: int | None = None, **fields: Any
    ) -> tuple[int, float | None]:
        """Serve one request (`fields`: as `admit`'s); returns its hit and the state its
        prefill started from."""
        req = self.admit(inp, len(out), **fields)
        hit = int(req.prefix_len)
        src = req.kv.mamba_cow_src_index
        seeded = None if src is None or self.checkpoints else self.read(int(src[0]))
        self.prefill(req, out[0], cut_at)
        self.decode_and_finish(req, inp, out)
        return hit, seeded

    def _alloc_kv(self, req: Any, start: int, end: int) -> None:
        loc = self.sg.alloc_token_slots(self.cache, end - start)
        self.pool.write((req.kv.req_pool_idx, slice(start, end)), loc)
        req.kv.kv_committed_len = end
        req.kv.kv_allocated_len = end

    def state_node(self, toks: Sequence[int], pos: int, namespace: str | None = None) -> Any:
        """The node ending at `pos` along `toks` (in `namespace`: binding/cache/namespaces.py)."""
        from jenga_sglang.radix.tokens import TokenSeq

        walk = self.cache.cache.tree.walk(TokenSeq.of(list(toks)), namespace=namespace)
        for node in walk.path:
            if node.end == pos:
                return node
        raise AssertionError(f"no node ends at {pos}")

    def state_positions(self, toks: Sequence[int], namespace: str | None = None) -> list[int]:
        """Where the tree holds a state along `toks` (in `namespace`)."""
        from jenga_sglang.radix.tokens import TokenSeq

        path = self.cache.cache.tree.walk(TokenSeq.of(list(toks)), namespace=namespace).path
        return [node.end for node in path if node.state is not None]

    def cached_length(self, toks: Sequence[int], namespace: str | None = None) -> int:
        """How many tokens of `toks` the tree holds KV for (in `namespace`)."""
        from jenga_sglang.radix.tokens import TokenSeq

        walk = self.cache.cache.tree.walk(TokenSeq.of(list(toks)), namespace=namespace)
        return int(walk.length)

    def slots_balance(self, *running: Any) -> None:
        """Every Mamba slot has exactly one owner: SGLang's free list, the tree, or a running
        request (its live slot and ping-pong entries); SGLang's free count and our SlotMemory
        counters agree with that partition."""
        tree = [i for n in self.cache.cache.tree.nodes() if n.state for i in n.state.ids()]
        usage = self.cache.memory.usage(self.cache.state_type)
        assert len(tree) == usage.used + usage.evictable
        assert len(tree) == self.cache.memory.held(self.cache.state_type)
        if self.checkpoints is not None:  # the tree's in the int8 pool, the rest live
            ckpt_free = self.checkpoints.allocator.free_slots.tolist()
            assert len(ckpt_free) == self.checkpoints.available_size()
            assert sorted(ckpt_free + tree) == list(range(1, self.checkpoints.num_slots + 1))
            tree = []
        free = self.pool.mamba_allocator.free_slots.tolist()
        assert len(free) == self.pool.mamba_allocator.available_size()
        owned = [int(r.kv.mamba_pool_idx) for r in running if r.kv.holds_mamba]
        for r in running:
            buf = r.kv.mamba_ping_pong_track_buffer
            if buf is not None:
                owned += [int(s) for s in buf.tolist() if s >= 0]
        everyone = free + tree + owned
        assert len(everyone) == len(set(everyone)), "a slot has two owners"
        assert set(everyone) == set(range(1, self.pool.mamba_pool.size + 1))
        self.cache.sanity_check()
