"""scripts/make_tiny_model.py: the tiny NemotronH loads offline with transformers/safetensors."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_model.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tiny_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub
    out = tmp_path_factory.mktemp("tiny") / "model"
    return out, _script().make_tiny_model(out, seed=0)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tokenizer_loads_offline_with_chat_template(tiny: tuple[Path, dict[str, Any]]) -> None:
    from transformers import AutoTokenizer

    out, summary = tiny
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    config = json.loads((out / "config.json").read_text())
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (
        config["pad_token_id"],
        config["bos_token_id"],
        config["eos_token_id"],
    )
    assert len(tok) == summary["tokenizer_vocab"] <= config["vocab_size"]
    text = "The cache keeps the state, 42 times: déjà vu!"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level: every string round-trips
    assert len(ids) < len(text.encode())  # trained merges compress the built-in words
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>hi</s><|assistant|>yo</s><|assistant|>"
    chat_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert chat_ids[0] == tok.bos_token_id and tok.convert_ids_to_tokens(chat_ids[1]) == "<|user|>"


_LOAD_AND_RUN = """
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM

out = sys.argv[1]
config = AutoConfig.from_pretrained(out, local_files_only=True)
model, info = AutoModelForCausalLM.from_pretrained(
    out, local_files_only=True, output_loading_info=True
)
ids = torch.tensor([[1, 3, 40, 41, 42, 43, 2, 4]])
with torch.no_grad():
    logits = model(ids).logits
print(json.dumps({
    "model_type": config.model_type,
    "blocks": len(config.layers_block_type),
    "hidden": config.hidden_size,
    "vocab": config.vocab_size,
    "missing": sorted(info["missing_keys"]),
    "unexpected": sorted(info["unexpected_keys"]),
    "params": sum(p.numel() for p in model.parameters()),
    "shape": list(logits.shape),
    "finite": bool(torch.isfinite(logits).all()),
    "distinct_argmax": len(set(logits[0].argmax(-1).tolist())),
}))
"""


def test_weights_match_the_nemotron_h_layout_and_run(tiny: tuple[Path, dict[str, Any]]) -> None:
    # A fresh interpreter: other test modules install CPU placeholders for mamba-ssm's and
    # causal-conv1d's CUDA extensions, and transformers would then pick those packages' kernels.
    out, summary = tiny
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_RUN, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["model_type"] == "nemotron_h"
    assert got["blocks"] == 4 and got["hidden"] == 64
    assert not got["missing"] and not got["unexpected"]
    assert got["params"] == summary["params"]
    assert got["shape"] == [1, 8, got["vocab"]] and got["finite"]
    # Random weights, yet the next token depends on the input (not a constant model).
    assert got["distinct_argmax"] > 1


def test_same_seed_same_bytes_other_seed_other_weights(
    tiny: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = tiny
    script = _script()
    again, other = tmp_path / "again", tmp_path / "other"
    script.make_tiny_model(again, seed=0)
    script.make_tiny_model(other, seed=1)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert _digest(out / name) == _digest(again / name), name
    assert _digest(out / "model.safetensors") != _digest(other / "model.safetensors")
    assert _digest(out / "tokenizer.json") == _digest(other / "tokenizer.json")
