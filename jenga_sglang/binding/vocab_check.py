"""Reject token ids outside the vocabulary before they reach the scheduler.

SGLang 0.5.23 checks a /generate request's length in `TokenizerManager._validate_one_request`
but not its token ids: an id >= the vocabulary size reaches the embedding, whose IndexError kills
the scheduler process (stock and Jenga alike). With `--enable-jenga` the plugin registers a
BEFORE hook on that method: an id outside `[0, vocab_size)` raises the same `ValueError` SGLang
raises for an overlong input, which its HTTP layer answers with 400, naming the first bad id and
its position. The request never reaches the scheduler, so the server stays up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jenga_sglang.binding.options import options_of

TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def first_out_of_vocab(ids: Sequence[int], vocab_size: int) -> tuple[int, int] | None:
    """(position, id) of the first id outside `[0, vocab_size)`, or None."""
    for position, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            return position, int(token)
    return None


def before_validate_one_request(manager: Any, obj: Any, input_ids: Any, *a: Any, **k: Any) -> None:
    if input_ids is None or not options_of(manager.server_args).enabled:
        return
    vocab_size = int(manager.model_config.vocab_size)
    bad = first_out_of_vocab(input_ids, vocab_size)
    if bad is not None:
        position, token = bad
        raise ValueError(
            f"input_ids[{position}] = {token} is outside the vocabulary: token ids must be in "
            f"[0, {vocab_size})"
        )


def register(registry: Any, hook_type: Any) -> None:
    registry.register(
        f"{TOKENIZER_MANAGER}._validate_one_request", before_validate_one_request, hook_type.BEFORE
    )
