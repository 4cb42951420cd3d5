"""End to end on CPU: the live host tier (`--jenga-host-gb`) in SGLang's real scheduler, against
stock SGLang with the same flags (the tiny NemotronH of tests/test_e2e_server.py).

Both servers get a device budget too small for what they are sent (`--max-total-tokens 320
--max-mamba-cache-size 6`). One request at a time through /generate: a 200-token prompt, then
three other 200-token prompts that push it out of the device, then the first prompt's second
turn (its prompt, the reply, a new message), then one of the others' second turn. Stock has
dropped the first session by then; ours moved it to host memory and loads it back, so its
second turn is a hit that the server reports as cached tokens and our metrics count as loaded
from host. The greedy outputs must equal stock's (a loaded state or KV that differed from the
demoted one would change them), and SGLang's strict idle leak check runs after every request.
The tier's rates are this CPU's (bench/studies/sessions_cpu.py `jenga-host`). About 2-3 minutes
on 2 cores, most of it the two starts. The `--page-size 16` variant (extra_buffer: SGLang's only
strategy for a Mamba model at pages > 1), the `--enable-int8-mamba-checkpoint` one, the tiny
gpt-oss (full and window KV), STANDALONE speculative decoding (a draft model's KV rows back
from host) and stock HiCache through the CPU test shim run with `make test-full`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jenga_sglang.bench.drivers.faults import flush_cache
from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies import window_events
from jenga_sglang.bench.studies.sessions_cpu import VARIANTS, host_metrics
from tests.test_e2e_namespaces import MESSAGE, PROMPT, Reply, generate

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

BUDGET = ["--max-total-tokens", "320", "--max-mamba-cache-size", "6"]
OTHERS = [[30 + (13 * i + 5 * k) % 280 for i in range(200)] for k in range(1, 4)]


#: the tiny gpt-oss: SGLang's Triton attention (sinks), a full pool of 384 slots and a
#: smaller window pool, windows freed every decode step (as window_events.SERVER_ENV)
WINDOW_BUDGET = ["--attention-backend", "triton", "--max-total-tokens", "384"]


def serve(
    model: Path,
    flags: list[str],
    log: Path,
    strategy: str = "no_buffer",
    budget: list[str] = BUDGET,
    env: dict[str, str] | None = None,
) -> tuple[list[Reply], dict[str, float]]:
    with LocalServer(
        str(model), [*budget, *flags], log=log, ready_timeout_s=600, strategy=strategy, env=env
    ) as server:
        first = generate(server.url, PROMPT, None)
        others = [generate(server.url, ids, None) for ids in OTHERS]
        again = generate(server.url, PROMPT + first.output + MESSAGE, None)
        other_again = generate(server.url, OTHERS[0] + others[0].output + MESSAGE[:8], None)
        tier = host_metrics(server.url) if "--enable-metrics" in flags else {}
        # /flush_cache (SGLang's weight updates run one too) on a tree holding device and
        # host pages: the server lives on, and the first request is cold again
        flush_cache(server.url)
        flushed = generate(server.url, PROMPT, None)
    return [first, *others, again, other_again, flushed], tier


@pytest.mark.parametrize(
    ("layout", "strategy", "least"),
    [
        pytest.param([], "no_buffer", 200, id="page1"),
        # SGLang serves a Mamba model at --page-size > 1 only with extra_buffer; a load-back
        # then takes whole pages (binding/pools/allocator.py `alloc`), and the hit ends at
        # the last state it tracked: 192, a whole page and a multiple of its 64-token grid
        pytest.param(
            ["--page-size", "16"], "extra_buffer", 192, id="page16", marks=pytest.mark.full
        ),
        # the tree's states in SGLang's int8 checkpoint pool go to host quantized
        pytest.param(
            ["--enable-int8-mamba-checkpoint"], "no_buffer", 200, id="int8", marks=pytest.mark.full
        ),
    ],
)
def test_host_tier_serves_an_evicted_session_as_stock_would(
    tiny_model: Path, tmp_path: Path, layout: list[str], strategy: str, least: int
) -> None:
    stock, _ = serve(tiny_model, layout, tmp_path / "stock.log", strategy)
    jenga, tier = serve(
        tiny_model, [*layout, *VARIANTS["jenga-host"]], tmp_path / "jenga.log", strategy
    )
    print(json.dumps({"stock": stock, "jenga": jenga, "tier": tier}))  # the RESULTS numbers
    assert "impl=JengaRadixCache" in (tmp_path / "jenga.log").read_text(errors="replace")
    assert [r.output for r in jenga] == [r.output for r in stock]
    assert jenga[4].cached >= least > stock[4].cached  # the first session, back from host
    assert tier["host_hit_tokens_total"] > 0 and tier["host_loaded_bytes_total"] > 0
    assert tier["host_stored_bytes_total"] >= tier["host_loaded_bytes_total"]
    assert jenga[6].cached == stock[6].cached == 0  # flushed: nothing left, device or host


@pytest.mark.full
def test_host_tier_serves_a_window_models_evicted_session_as_stock_would(
    tiny_window_model: Path, tmp_path: Path
) -> None:
    """The same on the tiny gpt-oss: full and window KV go to host and come back, and the
    window layers read the loaded window KV through SGLang's full-to-window mapping (a wrong
    one would change the outputs)."""
    run = {"budget": WINDOW_BUDGET, "env": window_events.SERVER_ENV}
    stock, _ = serve(tiny_window_model, [], tmp_path / "stock.log", **run)
    jenga, tier = serve(tiny_window_model, [*VARIANTS["jenga-host"]], tmp_path / "jenga.log", **run)
    print(json.dumps({"stock": stock, "jenga": jenga, "tier": tier}))  # the RESULTS numbers
    assert [r.output for r in jenga] == [r.output for r in stock]
    assert jenga[4].cached >= 200 > stock[4].cached  # the first session, back from host
    assert tier["host_hit_tokens_total"] > 0 and tier["host_loaded_bytes_total"] > 0
    assert jenga[6].cached == stock[6].cached == 0  # flushed: nothing left, device or host


@pytest.mark.full  # the baseline, not ours (about 105 s); its shim's copies: test_cpu_hicache.py
def test_stock_hicache_serves_on_cpu_through_the_test_shim(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Stock SGLang's own HiCache, live on CPU (jenga_sglang/cpu_hicache.py: no pinning, its
    direct copies in torch), is the baseline the sessions study runs beside our tier
    (sessions_cpu.py `stock-hicache`, 1 GB of host memory). The same requests: the evicted
    first session comes back from HiCache's host pools as SGLang reports it, with stock's
    outputs (copies that moved other bytes would change them)."""
    stock, _ = serve(tiny_model, [], tmp_path / "stock.log")
    hicache, tier = serve(tiny_model, [*VARIANTS["stock-hicache"]], tmp_path / "hicache.log")
    print(json.dumps({"stock": stock, "hicache": hicache, "tier": tier}))
    log = (tmp_path / "hicache.log").read_text(errors="replace")
    assert "hicache_attached=True" in log
    assert [r.output for r in hicache] == [r.output for r in stock]
    assert hicache[4].cached > stock[4].cached  # the first session, back from host
    assert tier["sglang_host_cached_tokens"] > 0
    assert hicache[6].cached == 0  # flushed


def _drafted(url: str, ids: list[int]) -> tuple[int, list[int], int]:
    """Cached tokens, output and verify rounds of a greedy 16-token request."""
    from tests.test_e2e_namespaces import post

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    answer = post(url, "/generate", body)
    meta = answer["meta_info"]
    return int(meta["cached_tokens"]), list(answer["output_ids"]), int(meta["spec_verify_ct"])


@pytest.mark.full
def test_a_draft_models_kv_comes_back_from_host_with_the_targets(
    tiny_spec: Path, tmp_path: Path
) -> None:
    """STANDALONE speculative decoding (make tiny-spec's target and draft, which agree
    often) with the host tier: the first session leaves the device for host memory and its
    second turn loads it back, the draft's KV with the target's: in the same rows on the Jenga
    pool, from the draft's own SGLang pool with --no-jenga-pool. A draft that read rows the
    host did not restore would propose other tokens: the verify rounds equal stock's, whose
    second turn recomputes everything, say it read them right."""
    from jenga_sglang.bench.studies.speculative_cpu import algorithm_flags

    spec = algorithm_flags("standalone", str(tiny_spec / "draft"))
    runs = {}
    host = [*VARIANTS["jenga-host"]]
    for name, flags in (("stock", []), ("jenga", host), ("no-pool", [*host, "--no-jenga-pool"])):
        log = tmp_path / f"{name}.log"
        with LocalServer(
            str(tiny_spec / "target"), [*BUDGET, *spec, *flags], log=log, ready_timeout_s=600
        ) as server:
            first = _drafted(server.url, PROMPT)
            others = [_drafted(server.url, ids) for ids in OTHERS]
            again = _drafted(server.url, PROMPT + first[1] + MESSAGE)
            tier = host_metrics(server.url) if flags else {}
        runs[name] = ([first, *others, again], tier)
    print(json.dumps(runs))  # the RESULTS numbers
    stock = runs.pop("stock")[0]
    for jenga, tier in runs.values():
        assert [r[1:] for r in jenga] == [r[1:] for r in stock]  # outputs and verify rounds
        assert jenga[4][0] >= 200 > stock[4][0]  # the first session, back from host
        assert tier["host_hit_tokens_total"] >= 200
