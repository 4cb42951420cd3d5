"""The CPU interpreter mode's speculative stand-ins (jenga_sglang/cpu_speculative.py) against
SGLang's own kernels, run in Triton's interpreter, or the contract their docstrings state."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from jenga_sglang import cpu_speculative

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def torch() -> Any:
    import torch

    return torch


def test_cache_locs_gather_what_sglangs_kernel_writes(torch: Any) -> None:
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    gen = torch.Generator().manual_seed(0)
    req_to_token = torch.randint(1, 1000, (6, 64), generator=gen, dtype=torch.int32)
    rows = torch.tensor([4, 1, 3], dtype=torch.int64)
    start = torch.tensor([0, 17, 60], dtype=torch.int64)
    n = 4
    want = torch.empty(len(rows) * n, dtype=torch.int64)
    assign_extend_cache_locs[(len(rows),)](
        rows, req_to_token, start, start + n, want, req_to_token.shape[1], 4
    )
    got = cpu_speculative.assign_extend_cache_locs(
        rows, req_to_token, start, start + n, len(rows), n, "cpu"
    )
    assert got.dtype == torch.int64 and torch.equal(got, want)


def test_greedy_verify_accepts_the_longest_agreeing_chain(torch: Any) -> None:
    """Two chains of 4 (root + 3 drafts): the target agrees with 2 drafts of the first and all
    3 of the second; the accepted positions are flattened batch indices."""
    candidates = torch.tensor([[7, 8, 9, 10], [1, 2, 3, 4]])
    target = torch.tensor([[8, 9, 5, 6], [2, 3, 4, 11]])
    chain = torch.tensor([[1, 2, 3, -1]] * 2)
    accept = torch.full((2, 4), -1, dtype=torch.int32)
    correct = torch.full((2,), 99, dtype=torch.int32)
    predicts = torch.zeros(8, dtype=torch.int32)
    cpu_speculative.verify_tree_greedy(
        predicts,
        accept,
        correct,
        candidates,
        torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]),
        chain,
        torch.full((2, 4), -1),
        target,
    )
    assert accept.tolist() == [[0, 1, 2, -1], [4, 5, 6, 7]]
    assert correct.tolist() == [2, 3]
    assert predicts[accept[0, :3].long()].tolist() == [8, 9, 5]  # drafts 8, 9, then the bonus


def test_the_state_commit_copies_the_chosen_step_into_each_slot(torch: Any) -> None:
    """Rows (scratch) and slots (pool) differ; a negative step copies nothing; the track copy
    takes its own step; conv and temporal alike."""
    from types import SimpleNamespace

    layers, slots, rows, steps = 2, 6, 3, 4
    scratch = torch.arange(layers * rows * steps * 5, dtype=torch.float32)
    caches = SimpleNamespace(
        temporal=torch.zeros(layers, slots, 5),
        intermediate_ssm=scratch.view(layers, rows, steps, 5),
        conv=[torch.zeros(layers, slots, 5)],
        intermediate_conv_window=[scratch.view(layers, rows, steps, 5) + 0.5],
    )
    live, last = torch.tensor([5, 2, 4]), torch.tensor([1, -1, 3])
    track, to_track = torch.tensor([1, 3, 0]), torch.tensor([0, -1, -1])
    cpu_speculative.scatter_mamba_states_after_verify(caches, live, last, track, to_track)
    view = scratch.view(layers, rows, steps, 5)
    assert torch.equal(caches.temporal[:, 5], view[:, 0, 1])
    assert torch.equal(caches.temporal[:, 4], view[:, 2, 3])
    assert torch.equal(caches.temporal[:, 1], view[:, 0, 0])  # the track copy of row 0
    assert torch.equal(caches.conv[0][:, 4], view[:, 2, 3] + 0.5)
    for untouched in (0, 2, 3):
        assert not caches.temporal[:, untouched].any() and not caches.conv[0][:, untouched].any()


def test_ngram_imports_with_the_stand_in_op_and_rebuilds_a_chain(torch: Any) -> None:
    """With the `sgl_kernel.speculative` stand-in, NGRAM's worker imports, and its tree
    metadata for a causal chain links each draft to the next."""
    added = cpu_speculative.stub_sgl_kernel_speculative()
    try:
        from sglang.kernels.ops.speculative.reconstruct_tree import (
            reconstruct_indices_from_tree_mask_func,
        )
        from sglang.srt.speculative import ngram_worker

        assert ngram_worker.NGRAMWorker is not None
        n = 4
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).flatten()
        positions = torch.empty(n, dtype=torch.int64)
        index = torch.empty((1, n), dtype=torch.int64)
        following = torch.empty((1, n), dtype=torch.int64)
        sibling = torch.empty((1, n), dtype=torch.int64)
        reconstruct_indices_from_tree_mask_func(
            mask, torch.tensor([10]), positions, index, following, sibling, 1, n
        )
        assert positions.tolist() == [10, 11, 12, 13]
        assert following.tolist() == [[1, 2, 3, -1]] and sibling.tolist() == [[-1] * n]
    finally:
        if added:
            del sys.modules["sgl_kernel.speculative"]


def test_a_draft_models_chain_becomes_a_verify_chain(torch: Any) -> None:
    """The tree build stand-in, fed as SGLang's draft loop feeds it (topk 1, 3 steps: its own
    `select_top_k_tokens` and `organize_draft_results`): each draft token follows the one
    before, one position further, and sees the prefix and the drafts before it."""
    from sglang.srt.speculative import eagle_utils
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    steps, hidden = 3, torch.zeros(2, 8)
    scores, tokens, parents = None, [], []
    scores_list = []
    for i in range(steps):
        topk_p = torch.full((2, 1), 0.5)
        topk_index = torch.tensor([[10 + i], [20 + i]])
        _, hidden, scores, tree = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, 1)
        scores_list.append(tree[0])
        tokens.append(tree[1])
        parents.append(tree[2])
    parent_list, top_index, drafts = eagle_utils.organize_draft_results(
        scores_list, tokens, parents, steps + 1
    )
    seq_lens = torch.tensor([5, 9])
    mask = torch.full((int(seq_lens.sum()) * 4 + 4 * 4 * 2,), True)
    positions = torch.empty(8, dtype=torch.long)
    retrieve = torch.full((3, 2, 4), -1, dtype=torch.long)
    cpu_speculative.build_tree(
        parent_list, top_index, seq_lens, mask, positions, *retrieve, 1, steps, 4,
        eagle_utils.TreeMaskMode.FULL_MASK,
    )  # fmt: skip
    assert drafts.tolist() == [[10, 11, 12], [20, 21, 22]]
    assert positions.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert retrieve[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert retrieve[1].tolist() == [[1, 2, 3, -1]] * 2 and retrieve[2].tolist() == [[-1] * 4] * 2
    rows = mask[: 4 * (5 + 4)].view(4, 5 + 4)  # request 0: each row sees prefix + its chain
    assert bool(rows[:, :5].all())
    assert rows[:, 5:].tolist() == torch.tril(torch.ones(4, 4, dtype=torch.bool)).tolist()


def test_an_mtp_draft_takes_the_targets_embedding_and_head_without_cuda(torch: Any) -> None:
    """NemotronH's swap as the MTP draft's set-up calls it: the draft's own tensors go, the
    target's are shared (the same objects), and nothing asks for a GPU."""
    from types import SimpleNamespace

    draft = SimpleNamespace(
        model=SimpleNamespace(embed_tokens=torch.nn.Embedding(8, 4)),
        lm_head=torch.nn.Linear(4, 8, bias=False),
    )
    embed, head = torch.nn.Parameter(torch.ones(8, 4)), torch.nn.Parameter(torch.zeros(8, 4))
    cpu_speculative.set_embed_and_head(draft, embed, head)
    assert draft.model.embed_tokens.weight is embed and draft.lm_head.weight is head
