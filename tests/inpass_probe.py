"""Drive SGLang's real model forward on CPU with our cache and measure in-pass captures.

Run as a subprocess by tests/test_inpass_capture.py (SGLang's runtime context, process groups
and hooks are process-global): ``python -m tests.inpass_probe --model DIR --strategy S``.
It builds SGLang's ModelRunner for a tiny model in-process (NemotronH: Mamba2 layers; Qwen3.5:
Gated DeltaNet layers; as SGLang's own one-batch benchmark does), our `JengaRadixCache` over its
pools with in-pass capture on, and serves real
`Req`s the way the scheduler does: `init_next_round_input` (match), `ScheduleBatch.init_new` +
`prepare_for_extend` (our hook allocates the capture slots), `ForwardBatch.init_new` +
`ModelRunner.forward` (our hooks write the captures), `checkpoint_kv_cache` /
`release_kv_cache`. Planned positions are injected into the cache's plan store to place
captures at chosen positions; "natural" uses the admission's own plan.

Each captured state is compared with the state after prefilling [0, p) alone, from scratch,
through the same forward without our cache. One JSON object per scenario on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from array import array
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"


def build_runner(model: str, strategy: str) -> Any:
    from sglang.benchmark.one_batch import _set_envs_and_config, load_model
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    load_plugins()  # our hooks, as in every scheduler process
    flags = [
        "--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
        "--disable-cuda-graph", "--dtype", "float32", "--mamba-radix-cache-strategy", strategy,
        "--mem-fraction-static", "0.05", "--max-total-tokens", "4096", "--enable-jenga",
    ]  # fmt: skip
    if strategy == "no_buffer":
        flags.append("--disable-overlap-schedule")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(flags))
    server_args.resolve_once()
    _set_envs_and_config(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    runner, _ = load_model(server_args, PortArgs.init_new(server_args), 0, 0)
    return runner.torch_runner, server_args


def _stored(values: Any, dtype: Any) -> list[Any]:
    """The ways a kernel may store fp32 ``values`` as ``dtype``: rounded to nearest even (torch,
    Triton on a GPU) or, for bf16 under the Triton interpreter, truncated (its numpy cast drops
    the low 16 bits; SGLang's own conv kernel stores its states the same way there)."""
    import torch

    ways = [values.to(dtype)]
    if dtype == torch.bfloat16 and values.dtype == torch.float32:
        ways.append((values.view(torch.int32) & -65536).view(torch.float32).to(dtype))
    return ways


def _beyond_one_step(a: Any, b: Any) -> float:
    """Largest amount by which |a - b| exceeds one step of the storage dtype's spacing at the
    larger magnitude of the two (0.0 when every element is equal or one rounding step apart)."""
    import torch

    x, y = a.float(), b.float()
    _, exp = torch.frexp(torch.maximum(x.abs(), y.abs()))
    step = torch.ldexp(torch.full_like(x, torch.finfo(a.dtype).eps), exp - 1)  # [2^(e-1), 2^e)
    excess = ((x - y).abs() - step).clamp(min=0)
    return float(excess.max()) if excess.numel() else 0.0


class GatherCheck:
    """Wraps the conv gather the capture hooks launch and checks, bit for bit, that every
    captured conv state is the K-1 conv inputs before its position that this very forward
    used (from the packed inputs, and the row's live slot for inputs before the chunk)."""

    def __init__(self) -> None:
        import jenga_sglang.binding.capture.forward as hooks

        self.calls = 0
        self.mismatches = 0
        original = hooks.gather_conv_states

        def checked(xbc: Any, out: Any, dst: Any, start: Any, count: Any, init: Any,
                    init_idx: Any, **k: Any) -> None:  # fmt: skip
            import torch

            km1 = out.shape[2]
            older = [None if i < 0 else init[i].clone() for i in init_idx.tolist()]
            original(xbc, out, dst, start, count, init, init_idx, **k)
            self.calls += 1
            for j, (d, s0, n) in enumerate(
                zip(dst.tolist(), start.tolist(), count.tolist(), strict=True)
            ):
                cols = []
                for t in range(n - km1, n):
                    if t >= 0:
                        cols.append(xbc[s0 + t])
                    elif older[j] is not None:
                        cols.append(older[j][:, km1 + t].to(xbc.dtype))
                    else:
                        cols.append(torch.zeros_like(xbc[0]))
                want = torch.stack(cols, dim=1)
                self.mismatches += int(
                    not any(torch.equal(out[d], w) for w in _stored(want, out.dtype))
                )

        hooks.gather_conv_states = checked


class Probe:
    def __init__(self, runner: Any, strategy: str) -> None:
        from sglang.benchmark.one_batch import TreeCacheNamespace
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        from jenga_sglang.binding.cache.backend import JengaRadixCache
        from jenga_sglang.binding.cache.factory import captures_in_pass, spec_from_model_config
        from jenga_sglang.binding.options import JengaOptions

        self.mr = runner
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            page_size=1,
            enable_mamba_extra_buffer=strategy != "no_buffer",
        )
        spec = spec_from_model_config(runner.model_config, 1)
        assert captures_in_pass(runner.model_config)
        self.cache = JengaRadixCache(
            params,
            spec,
            JengaOptions(enabled=True),
            inpass=True,  # the server's prompt-end state
        )
        self.plain = TreeCacheNamespace(
            page_size=1,
            device=runner.device,
            token_to_kv_pool_allocator=params.token_to_kv_pool_allocator,
        )
        self.rid = 0

    # ------------------------------------------------------------------ serving

    def req(self, ids: list[int], max_new: int = 4) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.rid += 1
        r = Req(
            rid=f"r{self.rid}",
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new),
        )
        r.full_untruncated_fill_ids = r.origin_input_ids
        r.logprob_start_len = -1
        return r

    def admit(self, ids: list[int], positions: tuple[int, ...] | None = None) -> Any:
        """Match (our cache), lock the hit as PrefillAdder does; `positions` replaces the plan."""
        from jenga_sglang.binding.cache.plans import Planned

        r = self.req(ids)
        r.init_next_round_input(self.cache)
        r.lock = self.cache.lock(r.last_node)
        if positions is not None:
            self.cache.plans.remember(r.rid, Planned(positions))
        return r

    def forward(self, reqs: list[Any], tree: Any) -> Any:
        """One extend batch of `reqs` (each with its `extend_end` set); returns the logits."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        mr = self.mr
        batch = ScheduleBatch.init_new(
            reqs=reqs,
            req_to_token_pool=mr.req_to_token_pool,
            token_to_kv_pool_allocator=mr.token_to_kv_pool_allocator,
            tree_cache=tree,
            model_config=mr.model_config,
            enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        if batch.input_ids is None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
            batch.prefill_input_ids_cpu = None
        fb = ForwardBatch.init_new(batch, mr, return_hidden_states_before_norm=False)
        return mr.forward(fb).logits_output.next_token_logits.clone()

    def prefill(self, reqs: list[Any], chunk: int | None = None) -> None:
        """Prefill `reqs` together, `chunk` tokens per request per forward, checkpointing after
        each forward as the scheduler does; then finish them after one output token."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        while True:
            live = [r for r in reqs if r.prefix_len < len(r.origin_input_ids)]
            if not live:
                break
            for r in live:
                total = len(r.origin_input_ids)
                r.extend_end = total if chunk is None else min(r.prefix_len + chunk, total)
            self.forward(live, self.cache)
            for r in live:
                if r.extend_end == len(r.origin_input_ids):
                    r.output_ids.append(1)
                checkpoint_kv_cache(r, self.cache)
        for r in reqs:
            r.finished_reason = FINISH_LENGTH(length=1)
            release_kv_cache(r, self.cache, checkpoint=True)

    # ------------------------------------------------------------------ states

    def state(self, slot: int) -> tuple[Any, Any]:
        mc = self.mr.req_to_token_pool.mamba_pool.mamba_cache
        return [c[:, slot].clone() for c in mc.conv], mc.temporal[:, slot].clone()

    def reference(self, ids: list[int], chunk: int | None = None, resume: bool = False) -> Any:
        """The state after prefilling `ids` alone, the same way the captured request did:
        from scratch without our cache, in chunks of `chunk` tokens, or (`resume`) from the
        checkpoint our cache hits for it; then the request leaves without a checkpoint."""
        from sglang.srt.mem_cache.common import release_kv_cache

        if resume:
            r = self.admit(ids, ())
            assert r.prefix_len > 0, "the reference must resume from a cached state"
        else:
            r = self.req(ids)
        tree = self.cache if resume else self.plain
        while r.prefix_len < len(ids):
            r.extend_end = len(ids) if chunk is None else min(r.prefix_len + chunk, len(ids))
            self.forward([r], tree)
            r.prefix_len = r.extend_end
        out = self.state(int(r.kv.mamba_pool_idx))
        if resume:
            r.kv.kv_committed_len = len(ids)
            release_kv_cache(r, self.cache, checkpoint=False)
        else:
            self.mr.req_to_token_pool.free(r)
        return out

    def tree_states(self, ids: list[int]) -> dict[int, int]:
        from jenga_sglang.radix.tokens import TokenSeq

        path = self.cache.cache.tree.walk(TokenSeq.of(ids)).path
        return {n.end: int(n.state.ids()[0]) for n in path if n.state is not None}

    def compare(
        self, ids: list[int], positions: list[int], refs: dict[int, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Captured states along `ids` against `refs` (position -> reference state; by default
        prefilling [0, p) alone from scratch in one forward)."""
        held = self.tree_states(ids)
        rows = []
        for p in positions:
            if p not in held:
                rows.append({"p": p, "captured": False})
                continue
            ref_conv, ref_t = refs[p] if refs is not None else self.reference(ids[:p])
            conv, temporal = self.state(held[p])
            conv_err = max(float((a - b).abs().max()) for a, b in zip(conv, ref_conv, strict=True))
            rows.append(
                {
                    "p": p,
                    "captured": True,
                    "temporal_err": float((temporal - ref_t).abs().max()),
                    "conv_err": conv_err,
                    "conv_exact": all(
                        bool((a == b).all()) for a, b in zip(conv, ref_conv, strict=True)
                    ),
                    "conv_beyond_step": max(
                        _beyond_one_step(a, b) for a, b in zip(conv, ref_conv, strict=True)
                    ),
                }
            )
        return rows

    def slots_settled(self) -> bool:
        """No capture slot pending; the tree's integrity holds."""
        self.cache.sanity_check()
        return self.cache.captures is not None and self.cache.captures.held() == 0


def tokens(n: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(10, 500, (n,), generator=g)]


#: Captured positions per scenario: p below the conv width (4), around chunk boundaries (64,
#: Mamba2's packed and Gated DeltaNet's per row), row ends. LEAN keeps one of each kind.
FULL: dict[str, list[list[int]]] = {
    "single": [[1, 2, 3, 4, 63, 64, 65, 127, 128, 129, 200]],
    "batch": [[2, 49], [10, 14, 78, 90], [3, 60, 116, 130]],
    "resumed": [[101, 102, 103, 104, 150, 164, 190]],
    "chunked": [[60, 128, 130, 200, 256, 290]],
}
LEAN: dict[str, list[list[int]]] = {
    "single": [[1, 3, 63, 64, 65, 200]],
    "batch": [[49], [14, 90], [3, 130]],
    "resumed": [[101, 164, 190]],
    "chunked": [[60, 128, 200]],
}


def scenarios(probe: Probe, positions: dict[str, list[list[int]]]) -> list[dict[str, Any]]:
    """Each scenario's captures against prefix-alone references (module doc)."""
    out: list[dict[str, Any]] = []

    def record(name: str, ids: list[int], positions: list[int], **extra: Any) -> None:
        refs = extra.pop("refs", None)
        out.append({"scenario": name, "rows": probe.compare(ids, positions, refs), **extra})

    # One request from scratch.
    single = tokens(200, 1)
    ps = positions["single"][0]
    probe.prefill([probe.admit(single, tuple(ps))])
    record("single", single, ps)

    # Three requests in one forward: rows start mid-chunk (packed at 0, 50, 140).
    rows = [tokens(50, 2), tokens(90, 3), tokens(130, 4)]
    plans = positions["batch"]
    reqs = [probe.admit(ids, tuple(ps)) for ids, ps in zip(rows, plans, strict=True)]
    probe.prefill(reqs)
    for i, (ids, ps) in enumerate(zip(rows, plans, strict=True)):
        record(f"batch-row{i}", ids, ps)

    # Resumed from a cached state: the prompt end of `base` is a checkpoint (prompt_end).
    base = tokens(100, 5)
    probe.prefill([probe.admit(base)])
    resumed = base + tokens(90, 6)
    ps = positions["resumed"][0]
    refs = {p: probe.reference(resumed[:p], resume=True) for p in ps}
    req = probe.admit(resumed, tuple(ps))
    hit = int(req.prefix_len)
    probe.prefill([req])
    record("resumed", resumed, ps, hit=hit, refs=refs)

    # Chunked prefill: 128 tokens per forward; captures in the first, second, third chunk.
    chunked = tokens(300, 7)
    ps = positions["chunked"][0]
    refs = {p: probe.reference(chunked[:p], chunk=128) for p in ps}
    probe.prefill([probe.admit(chunked, tuple(ps))], chunk=128)
    record("chunked", chunked, ps, refs=refs)

    # The admission's own plan: a request leaving a cached sequence at 70.
    first = tokens(150, 8)
    probe.prefill([probe.admit(first)])
    branch = first[:70] + tokens(50, 9)
    req = probe.admit(branch)
    planned = list(probe.cache.plans.get(req.rid).positions)
    probe.prefill([req])
    record("natural", branch, planned, planned=planned)
    return out


def tails_only(probe: Probe, gathers: GatherCheck) -> list[dict[str, Any]]:
    """A forward whose captures are all at their rows' ends (a chat turn's prompt end): the
    live states copied, no capture kernel launched (binding/capture/forward.py)."""
    rows = [tokens(40, 13), tokens(70, 14)]
    before = gathers.calls
    probe.prefill([probe.admit(ids, (len(ids),)) for ids in rows])
    out = [
        {"scenario": f"tail-row{i}", "rows": probe.compare(ids, [len(ids)])}
        for i, ids in enumerate(rows)
    ]
    return [*out, {"scenario": "tails", "launches": gathers.calls - before}]


def logits_unchanged(probe: Probe) -> bool:
    """The forward's outputs with captures equal those of the same batch without them."""
    ids = [tokens(70, 11), tokens(40, 12)]
    with_capture = [probe.admit(x, (5, 33, 64)) for x in ids]
    for r in with_capture:
        r.extend_end = len(r.origin_input_ids)
    ours = probe.forward(with_capture, probe.cache)
    plain = [probe.req(x) for x in ids]
    for r in plain:
        r.extend_end = len(r.origin_input_ids)
    theirs = probe.forward(plain, probe.plain)
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

    for r in with_capture:
        r.output_ids.append(1)
        checkpoint_kv_cache(r, probe.cache)
        r.finished_reason = FINISH_LENGTH(length=1)
        release_kv_cache(r, probe.cache, checkpoint=True)
    for r in plain:
        probe.mr.req_to_token_pool.free(r)
    return bool((ours == theirs).all())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--strategy", default="no_buffer")
    parser.add_argument(
        "--lean", action="store_true", help="fewer positions (a Gated DeltaNet prefill under the "
        "interpreter costs several times a Mamba2 one)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    runner, _ = build_runner(args.model, args.strategy)
    probe = Probe(runner, args.strategy)
    gathers = GatherCheck()
    for row in [*scenarios(probe, LEAN if args.lean else FULL), *tails_only(probe, gathers)]:
        print(json.dumps(row), flush=True)
    print(json.dumps({"scenario": "logits", "unchanged": logits_unchanged(probe)}), flush=True)
    snap = probe.cache.snapshot()
    row = {"scenario": "slots", "settled": probe.slots_settled(), "captures": snap.captures}
    row |= {"lost": snap.captures_lost, "cuts": snap.prefill_cuts}
    print(json.dumps(row), flush=True)
    row = {"scenario": "gather", "calls": gathers.calls, "mismatches": gathers.mismatches}
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
