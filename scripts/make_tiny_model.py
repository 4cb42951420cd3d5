"""Write a tiny random-weight model (default NemotronH) to data/tiny-model/.

    .venv/bin/python scripts/make_tiny_model.py [--out data/tiny-model] [--seed 0]
        [--family nemotron_h|falcon_h1|granite_moe_hybrid|mamba2|qwen3_5|gpt_oss|gemma3|llama]

`--family` picks one of bench/drivers/tiny_families.py's configs (docs/models.md); the text below
describes the default, the others differ only in config.json and tensor names.

Everything is made here, offline and reproducibly (same seed, same bytes):

* ``config.json``: a 4-layer NemotronH, pattern ``M*M-`` (Mamba2, attention, Mamba2, MLP), hidden
  64, written with the legacy field names (``hybrid_override_pattern``, ``mamba_n_groups``...)
  that both SGLang 0.5.23's and transformers' NemotronH configs accept.
* ``model.safetensors``: tensor names and shapes taken from transformers' NemotronH module (the
  checkpoint layout SGLang's loader reads), values drawn from our own seeded generator.
* ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE trained in-process on the text
  below, with chat special tokens and a chat template, loadable by ``AutoTokenizer`` offline.

NemotronH by default rather than Falcon-H1: SGLang's NemotronH has no muP multipliers or parallel
attention+Mamba blocks, so it is the smaller surface for SGLang's CPU path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.tiny_families import DEFAULT_FAMILY, FAMILIES, family_config

SPECIALS = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BPE_VOCAB = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# Built-in training text: a few KB of plain English so common words become single tokens.
CORPUS = """\
The cache keeps the state of every conversation so that the next turn does not start over.
A hybrid model mixes attention layers with state space layers. Attention keeps one key and one
value for every token; a state space layer keeps one fixed-size state for the whole sequence.
When a user sends a second message, the server looks up the longest prefix it has already seen.
If the prefix ends where a state was saved, the prefill starts from that state and skips work.
Memory is shared between pages of keys and values and slots of states. Eviction frees the least
useful entries first: old ones, short ones, and ones whose recomputation is cheap.
Please answer the question in one short sentence. What is the capital of France? Paris is the
capital of France. How many legs does a spider have? A spider has eight legs. Which planet is
the largest? Jupiter is the largest planet. Translate good morning into French: bonjour.
You are a helpful assistant. You answer briefly and you say when you do not know the answer.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024.
def add(a, b): return a + b
for i in range(10): print(i)
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
"""


def model_config(vocab_size: int, family: str = DEFAULT_FAMILY) -> dict[str, Any]:
    """The tiny config of `family` (bench/drivers/tiny_families.py) for `vocab_size`
    embedding rows."""
    return family_config(family, vocab_size)


def build_tokenizer(out: Path) -> int:
    """Train a byte-level BPE on CORPUS, save tokenizer files; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(  # type: ignore[no-untyped-call]
        vocab_size=BPE_VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    for want, name in enumerate(SPECIALS):
        got = tok.token_to_id(name)
        if got != want:  # config.json's pad/bos/eos ids depend on this order
            raise RuntimeError(f"special token {name!r} got id {got}, expected {want}")
    tok.save(str(out / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return int(tok.get_vocab_size())


def _shapes(config: dict[str, Any], family: str) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes, from transformers' module of the family on meta."""
    import torch
    import transformers

    spec = FAMILIES[family]
    config_class = getattr(transformers, spec.config_class)
    model_class = getattr(transformers, spec.model_class)
    with torch.device("meta"):
        model = model_class(config_class(**config))
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _tensor(name: str, shape: tuple[int, ...], gen: Any) -> Any:
    """A value for one tensor: norms 1, Mamba A/D/dt as in Mamba2's init, the rest N(0, 0.02)."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":  # A in [1, 16]: every head decays, at different rates
        return torch.log(torch.linspace(1.0, 16.0, shape[0]))
    if leaf == "D":
        return torch.ones(shape)
    if leaf == "dt_bias":  # softplus^-1 of dt in [1e-3, 1e-1]
        dt = torch.exp(torch.rand(shape, generator=gen) * (2 * torch.log(torch.tensor(10.0))))
        dt = dt * 1e-3
        return dt + torch.log(-torch.expm1(-dt))
    if "norm" in name and len(shape) == 1:
        return torch.ones(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    # Larger than 0.02 so a 4-layer random model still gives peaked, input-dependent logits.
    return torch.randn(shape, generator=gen) * 0.1


def build_weights(
    config: dict[str, Any], out: Path, seed: int, family: str = DEFAULT_FAMILY
) -> int:
    """Write model.safetensors with seeded values; returns the parameter count."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: _tensor(name, shape, gen).to(torch.float32).contiguous()
        for name, shape in sorted(_shapes(config, family).items())
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def make_tiny_model(out: Path, seed: int = 0, family: str = DEFAULT_FAMILY) -> dict[str, Any]:
    """Write config, weights and tokenizer of `family` to ``out``; returns a short summary."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    padded = -(-vocab // 64) * 64  # embedding rows a multiple of 64, >= the tokenizer's ids
    config = model_config(padded, family)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen_config = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    (out / "generation_config.json").write_text(json.dumps(gen_config, indent=2) + "\n")
    params = build_weights(config, out, seed, family)
    return {
        "family": family,
        "out": str(out),
        "vocab_size": padded,
        "tokenizer_vocab": vocab,
        "params": params,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default="data/tiny-model", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    parser.add_argument(
        "--family", choices=sorted(FAMILIES), default=DEFAULT_FAMILY, help="model family"
    )
    args = parser.parse_args(argv)
    print(json.dumps(make_tiny_model(Path(args.out), args.seed, args.family)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
