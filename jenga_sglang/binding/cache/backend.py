"""`JengaRadixCache`: our tree and policies behind SGLang's `BasePrefixCache` contract.

Seam: a `BasePrefixCache` registered with `register_radix_cache_backend("jenga", ...)`, not a
`UnifiedRadixCache` subclass. The scheduler's `isinstance(tree_cache, UnifiedRadixCache)`
checks guard only HiCache, storage prefetch, the buffer pipeline and external linkers, which
`--enable-jenga` rejects at start-up; every call on the normal path (match_prefix, checkpoint,
lock/unlock, evict, size queries) goes through `BasePrefixCache`. A subclass would inherit a
second tree (the TreeCore and its components) that would have to be kept empty and in step.

The tree's KV pages *are* SGLang's KV slot indices and its SSM states are Mamba pool slots
(`SlotMemory` adopts them); evicting gives them back to SGLang's allocators. Hits follow our
per-layer-type rules: with a Mamba group a hit ends at a node that holds a checkpoint.

The backend drives the tree only through `PrefixCache` (radix/cache.py). Beside it:
slots/sglang_slots.py builds the memory from SGLang's pools (capacities, give-back, room,
evictions), slots/tree.py moves slots in and out of the tree (adoption, row repointing, path
ids), cache/request_path.py holds the request path (`checkpoint`, `on_release`) and
cache/memory_calls.py SGLang's calls on the memory (locks, eviction, sizes).

Build it without a scheduler from the same `CacheInitParams` SGLang's `UnifiedRadixCache` takes
(pools on device="cpu" work once `set_global_server_args_for_scheduler` was called):

    cache = JengaRadixCache(params, spec, JengaOptions(enabled=True))

Insert follows SGLang's convention: `InsertResult.prefix_len` tokens were already cached and
the caller frees its duplicate slots for them; `mamba_exist=True` means the state given was not
taken (one already exists there) and the caller frees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    InitLoadBackParams,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

from jenga_sglang.binding.cache.captures import BatchCaptures, PendingCaptures, batch_rows
from jenga_sglang.binding.cache.mamba_state import StateHandOver
from jenga_sglang.binding.cache.memory_calls import MemoryCalls
from jenga_sglang.binding.cache.metrics import JengaMetrics, Snapshot
from jenga_sglang.binding.cache.namespaces import dfs_weight_order, key_namespace
from jenga_sglang.binding.cache.plans import Planned, RequestPlans, key_tokens, will_decode
from jenga_sglang.binding.cache.policy import build_admission, build_eviction, build_tuner
from jenga_sglang.binding.cache.request_path import RequestPath
from jenga_sglang.binding.cache.sessions import SessionLocks
from jenga_sglang.binding.cache.tp_share import share_channel
from jenga_sglang.binding.host.tier import (
    HostHit,
    Offer,
    attach_live_tier,
    device_only,
    host_counters,
    load_hit,
    offered,
)
from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.binding.slots.tree import SlotTree
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.match import MatchResult as TreeMatch
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.binding.pools.budget import SharedPoolBudget


class JengaRadixCache(RequestPath, MemoryCalls, BasePrefixCache):  # type: ignore[misc]  # sglang: no types
    """SGLang prefix cache backed by jenga-sglang's heterogeneous radix tree.

    Deterministic given the same call sequence (logical clock, no wall time), so every tensor-
    parallel rank makes the same decisions. With --page-size P > 1 the tree shares whole pages
    only, as SGLang's own cache does: hits, inserts and checkpoints end on page boundaries, and
    a request keeps its last, partial page. One attention group (full attention, optionally
    beside Mamba layers); see docs/sglang.md for what remains.
    """

    def __init__(
        self,
        params: CacheInitParams,
        spec: ModelSpec,
        options: JengaOptions,
        *,
        inpass: bool = False,
    ) -> None:
        self.spec, self.options = spec, options
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = int(params.page_size)
        self.disable = params.disable
        self.slots = SglangSlots(params, spec)
        self.device, self.memory = self.slots.device, self.slots.memory
        # What SGLang's scheduler reads of a sliding-window cache (hybrid-SWA models): the
        # window its running requests keep (it frees their SWA slots behind it).
        self.sliding_window_size = params.sliding_window_size if self.slots.window else None
        self.draft_swa_window = int(getattr(params, "draft_swa_window", 0) or 0)
        self.kv_type, self.state_type = self.slots.kv_type, self.slots.state_type
        self.cache = PrefixCache(
            spec,
            self.memory,
            build_eviction(options),
            build_admission(options, spec),
            page=self.page_size,
        )
        self.slot_tree = SlotTree(self.cache, self.slots)
        self.host = attach_live_tier(self.cache, self.slots, spec, options)  # --jenga-host-gb
        self.host_hit_tokens = 0  # of `hit_tokens`, loaded from host memory
        self.host_loads_declined = 0  # load-backs refused for the state's room (init_load_back)
        self.admission_budget: SharedPoolBudget | None = None  # this pass's (pools/budget.py)
        self.tuner = build_tuner(options, share_channel(params.tp_cache_group))
        self.handover = (
            StateHandOver(
                self.req_to_token_pool, params.enable_mamba_extra_buffer, self._evict_states
            )
            if self.state_type is not None
            else None
        )
        # In-pass capture (binding/cache/captures.py): the forward writes planned states into slots
        # allocated when the batch is built; without it the prefill is cut at each position.
        self.captures = (
            PendingCaptures(self._try_alloc_state, self.slots.free_states)
            if inpass and self.handover is not None
            else None
        )
        # --enable-session-radix-cache: an open session keeps its paths locked (sessions.py);
        # SGLang's cache registry reads the attribute to accept the flag
        self.enable_session_radix_cache = bool(params.enable_session_radix_cache)
        self.sessions = (
            SessionLocks(self.lock, self.unlock) if self.enable_session_radix_cache else None
        )
        self.prefill_cuts = 0  # chunks cut at a planned position (prefill_cut), cumulative
        self.held_back = 0  # admissions deferred for a shared checkpoint (shared_prefill)
        self.shared_branches = 0  # in-batch branch points added to a plan (shared_prefill)
        self.hit_tokens = 0
        self.unseeded = 0  # hits not used: no Mamba slot could be freed to copy their state
        self.states_admitted = 0
        self.owed_kv = 0  # KV tokens a stalled admission is short of (owe_kv)
        self.plans = RequestPlans()
        self.metrics: JengaMetrics | None = None
        if params.enable_metrics:
            self.init_metrics_collector()
            self.metrics = JengaMetrics(self.metrics_collector.labels)
            self.sync_metrics()

    def snapshot(self) -> Snapshot:
        """Cumulative hit tokens and states admitted/evicted, current alpha and pool bytes."""
        return Snapshot(
            hit_tokens=self.hit_tokens,
            states_admitted=self.states_admitted,
            states_evicted=self.cache.evicted_states,
            alpha=float(getattr(self.cache.eviction, "alpha", 0.0)),
            pool_bytes=self.slots.pool_bytes(),
            rewriting=bool(getattr(self.cache.admission, "rewriting", False)),
            ghost_branches=int(getattr(self.cache.admission, "ghost_branches", 0)),
            captures=0 if self.captures is None else self.captures.taken,
            captures_lost=0 if self.captures is None else self.captures.lost(),
            prefill_cuts=self.prefill_cuts,
            held_back=self.held_back,
            shared_branches=self.shared_branches,
            unseeded=self.unseeded,
            **host_counters(self.host, self.host_hit_tokens, self.host_loads_declined),
        )

    def sync_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.sync(self.snapshot())

    # ------------------------------------------------------------------ tree wrappers

    @property
    def root_node(self) -> Node:
        return self.cache.root

    def reset(self) -> None:
        """SGLang's `/flush_cache` (its weight updates run one too), on an idle scheduler
        that then clears the pools: every cached page and state goes, on device and on host,
        and open radix sessions lose their locks (a next turn matches an empty tree). Device
        pages leave by eviction, so the slots' give-back frees them and KV events publish
        their removal; the host tier is detached meanwhile so nothing is demoted. Each
        eviction frees a victim, so the loop ends; a node it cannot free is a lock SGLang
        still holds, which an idle scheduler cannot, and is raised."""
        if self.sessions is not None:
            self.sessions.release_all()
        tree = self.cache.tree
        host = tree.host
        if host is not None:
            for node in [tree.root, *tree.spaces.values(), *self.cache.nodes()]:
                host.drop_below(node)
            tree.host = None
        try:
            while next(self.cache.nodes(), None) is not None:
                if not self.cache.evict(self.kv_type):
                    raise RuntimeError("flush_cache: the jenga tree holds locked pages")
        finally:
            tree.host = host
        self.owed_kv = 0
        self.cache.check_integrity()
        self.sync_metrics()

    # ------------------------------------------------------------------ radix sessions

    def open_radix_session(self, session_id: str | None) -> int | None:
        return None if self.sessions is None else self.sessions.open(session_id)

    def ensure_session_generation(self, session_id: str) -> int:
        return 0 if self.sessions is None else self.sessions.generation(session_id)

    def release_radix_session(self, session_id: str | None) -> int:
        if self.sessions is None:
            return 0
        released = self.sessions.release(session_id)
        self.sync_metrics()  # the session's paths turned evictable
        return released

    def dfs_weight_order(self, node_handles: Any) -> list[int]:
        """SGLang's `dfs-weight` schedule order, over every namespace (namespaces.py)."""
        if not self.cache.tree.spaces:
            return list(super().dfs_weight_order(node_handles))
        return dfs_weight_order(self.cache.tree, node_handles)

    def _empty(self) -> MatchResult:
        root = self.root_node
        return MatchResult(
            device_prefix_len=0,
            last_device_node=root,
            last_host_node=root,
            best_match_node=root,
        )

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        return self._match(params, load=False)

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        """SGLang reads an admitted request's prefix off the tree here, once per admission,
        as it writes the request's row: the request is taken."""
        self._taken(req)
        return super().prefix_device_indices(req)  # type: ignore[no-any-return]

    def maybe_hand_to_session(self, req: Any) -> None:
        """SGLang calls this for every request of an extend batch once its row is written,
        and for a PD decode worker's request once its prefix is bound: the first call after
        a match is the request's admission (a request without a hit reaches no
        `prefix_device_indices`, a PD decode worker's none at all)."""
        self._taken(req)
        super().maybe_hand_to_session(req)

    def _taken(self, req: Any) -> None:
        """Count the request's hit in the tree once, as it is taken: its matches while it
        waited only kept the hit warm (`PrefixCache.warm`). Counted at every match, a waiting
        turn's hit marked its own resume point superseded (one child, hit), and eviction
        dropped that state before the turn ran (bench/RESULTS.md, "A waiting request's hit,
        counted once")."""
        planned = self.plans.get(req.rid)
        if planned.found is not None:
            assert planned.tokens is not None
            self.cache.admit(planned.tokens, planned.found, namespace=planned.namespace)
            self.plans.remember(req.rid, planned._replace(found=None))
            self.hit_tokens += int(req.prefix_len)  # what SGLang bound: once per admission
            self.sync_metrics()

    def init_load_back(self, params: InitLoadBackParams) -> tuple[int, Any] | None:
        """SGLang admitted a request whose match offered a host hit (`host_hit_length`,
        binding/host/tier.py): load it, matching again, and say how many tokens that added
        and which node the hit now ends at. All of the promised tokens or none, as SGLang
        requires (none: the tier recomputes them, and the request resumes from its device
        hit, re-seeded); None, retried next round, if the tree moved since the match. It
        also loads none where the checkpoint the load brings would take KV room the
        admission counted on (binding/pools/budget.py `fits_loaded_state`): SGLang then
        admits the request again without its host hit, or leaves it waiting."""
        handle, req = params.best_match_node, params.req
        if not isinstance(handle, HostHit) or req is None:
            return None
        budget = self.admission_budget
        if req.mamba_host_hit_length and budget is not None and not budget.fits_loaded_state():
            self.host_loads_declined += 1
            return 0, req.last_node
        device = int(req.prefix_len)
        result = self._match(handle.params, load=True)
        loaded = result.device_prefix_len - device
        if loaded not in (0, params.host_hit_length):
            return None
        req.mamba_branching_seqlen = result.mamba_branching_seqlen  # planned past the hit
        return loaded, result.last_device_node

    def _match(self, params: MatchPrefixParams, *, load: bool) -> MatchResult:
        """The match: device hit (reporting what the host tier offers past it), or with
        `load` the hit once the tier loaded its host part (`init_load_back`)."""
        # Packed once: the match key may be capped short of the input the plan reads.
        whole = None if self.disable else TokenSeq.of(params.key.token_ids)
        tokens = None if whole is None else key_tokens(params.key, whole)
        if whole is None or tokens is None:
            return self._empty()
        namespace = key_namespace(params.key)  # LoRA adapter / cache salt (plans.py)
        if self.owed_kv:
            self._pay_owed_kv()
        found = self.cache.lookup(tokens, namespace)
        offer, loaded = Offer(0, False), 0
        if self.host is not None and load:
            found, loaded = load_hit(self.cache, self.host, tokens, found, namespace)
            self.host_hit_tokens += loaded
            if loaded:
                self.slot_tree.loaded(tokens, found.walk.path, namespace)
        elif self.host is not None:  # report what a load would add; SGLang's budget decides
            offer = offered(self.cache, self.host, tokens, found) if params.req else offer
            found = device_only(self.cache, found)
        self.cache.warm(found)  # counted once the request is taken (`_taken`)
        planned = self._plan(params, found, whole, namespace)
        if params.req is not None:
            self.plans.remember(
                params.req.rid, planned._replace(tokens=whole, namespace=namespace, found=found)
            )
        seeds = params.cow_mamba and params.req is not None and found.state is not None
        if seeds and not self._seed(params.req, found):
            self.unseeded += 1  # prefilled from scratch; its plan's positions still hold
            self.sync_metrics()
            return self._empty()
        # SGLang locks the node it gets back: one ending where the hit does (window pages of
        # the path before its last window may then be trimmed while it runs, radix/evict.py).
        anchor = self.cache.anchor(found)
        node = anchor if anchor is not None else self.root_node
        self.sync_metrics()
        return MatchResult(
            device_prefix_len=found.length,
            last_device_node=node,
            last_host_node=node,
            best_match_node=HostHit(params) if offer.tokens else node,
            host_hit_length=offer.tokens,
            mamba_host_hit_length=int(offer.state),
            swa_host_hit_length=offer.window,
            mamba_branching_seqlen=self._branch_for_sglang(planned),
            full_kv_hit_length=found.walk.length,
        )

    def _branch_for_sglang(self, planned: Planned) -> int | None:
        """The position SGLang ends a prefill chunk at (prefill_cut): none with in-pass capture."""
        if self.captures is not None or not planned.positions:
            return None
        return planned.positions[0]

    def plan_captures(self, reqs: list[Any]) -> BatchCaptures | None:
        """Destination slots for the planned positions this extend batch computes."""
        if self.captures is None or self.disable:
            return None
        return self.captures.plan(batch_rows(reqs, lambda rid: self.plans.get(rid).positions))

    def _plan(
        self,
        params: MatchPrefixParams,
        found: TreeMatch,
        whole: TokenSeq,
        namespace: str | None,
    ) -> Planned:
        """Our admission's plan for the match (SGLang takes the lock itself, `inc_lock_ref`):
        the exact positions it checkpoints during this prefill, and what of the finished
        sequence is expendable.

        The match key may be capped short of the input (SGLang recomputes the last token), so
        positions are planned against the whole input `params.key.token_ids`:

            0 ...... hit ...... branch ...... len(input)
                      |-- prefill: states captured at the planned positions --|
        """
        if not self.spec.keeps_states:  # no Mamba layers, or their states come from a peer
            return Planned()  # plans nothing: SGLang decides what it inserts
        input_len = len(whole)
        # A prompt-end state is planned when decoding follows, and, captured in-pass, also when
        # it does not under extra_buffer: that finish hands over SGLang's last tracked state
        # (its 64-token grid), not the state at the end.
        tracked_finish = self.captures is not None and bool(
            self.handover and self.handover.extra_buffer
        )
        ends = will_decode(params.req) or (params.req is not None and tracked_finish)
        plan = self.cache.plan(whole, found, input_len + int(ends), namespace=namespace)
        return Planned.of(plan, found.length, input_len)

    def _seed(self, req: Any, found: TreeMatch) -> bool:
        """Copy-on-write of the hit's checkpoint into the request's live slot (mamba_state);
        False when no live slot can be freed for it."""
        assert self.handover is not None and found.state is not None and found.node is not None
        self.cache.pin(found.node)  # allocating a live slot may evict: keep the source
        try:
            return self.handover.seed(req, found.state.ids()[0])
        finally:
            self.cache.unpin(found.node)

    def insert(self, params: InsertParams) -> InsertResult:
        tokens = None if self.disable or params.key is None else key_tokens(params.key)
        if tokens is None:
            return InsertResult(prefix_len=0)
        whole = len(tokens) - len(tokens) % self.page_size  # whole pages only
        state = params.mamba_value
        # A state after a partial page is not kept: no node can end there.
        states = {}
        if state is not None and whole == len(tokens):
            states = {whole: int(state.reshape(-1)[0].item())}
        if whole == 0:
            result = InsertResult(prefix_len=0)
            result.mamba_exist = state is not None
            return result
        namespace = key_namespace(params.key)
        done = self._adopt(tokens.truncated(whole), params.value, states, namespace=namespace)
        result = InsertResult(prefix_len=done.present, total_len=whole, last_device_node=done.node)
        result.mamba_exist = state is not None and (not states or bool(done.refused))
        return result

    def pretty_print(self) -> None:
        for node in self.cache.nodes():
            indent = "  " * len(node.path_from_root())
            state = node.state is not None
            print(f"{indent}[{node.start},{node.end}) lock={node.lock_ref} state={state}")

    def sanity_check(self) -> None:
        self.cache.check_integrity()
