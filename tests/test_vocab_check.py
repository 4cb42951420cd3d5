"""binding/vocab_check.py without a server (the live 400s: tests/test_serve_faults.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jenga_sglang.binding.options import JENGA_ATTR, JengaOptions
from jenga_sglang.binding.vocab_check import before_validate_one_request, first_out_of_vocab


def _manager(enabled: bool) -> SimpleNamespace:
    args = SimpleNamespace(**{JENGA_ATTR: JengaOptions(enabled=enabled)})
    return SimpleNamespace(server_args=args, model_config=SimpleNamespace(vocab_size=10))


def test_first_out_of_vocab() -> None:
    assert first_out_of_vocab([0, 9, 3], 10) is None
    assert first_out_of_vocab([1, 10, 11], 10) == (1, 10)
    assert first_out_of_vocab([-1], 10) == (0, -1)
    assert first_out_of_vocab([], 10) is None


def test_hook_raises_the_value_error_sglang_answers_with_400() -> None:
    with pytest.raises(ValueError, match=r"input_ids\[2\] = 12 is outside the vocabulary"):
        before_validate_one_request(_manager(True), object(), [1, 2, 12])
    before_validate_one_request(_manager(True), object(), [1, 2, 9])  # in range: passes
    before_validate_one_request(_manager(True), object(), None)  # text input: not ours to check
    before_validate_one_request(_manager(False), object(), [99])  # stock: SGLang's behaviour
