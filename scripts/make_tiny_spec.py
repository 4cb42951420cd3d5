"""Write a tiny target and drafts that agree with it often, for speculative decoding on CPU.

    .venv/bin/python scripts/make_tiny_spec.py [--target data/tiny-model] [--out data/tiny-spec]

A random draft agrees with the random tiny NemotronH on almost no token, so a test of its
acceptance could not tell a draft reading the right KV from one reading garbage. This writes,
from scripts/make_tiny_model.py's NemotronH at `--target`:

* ``target/``: the same model with its Mamba2 layers' output projections scaled by 0.01 and its
  MLP's down projection zeroed, so its one attention layer decides most tokens (its states
  still decide about a quarter of them: the cache's Mamba rules still show in its outputs);
* ``draft/``: a one-layer Llama (STANDALONE's draft) whose attention is the target's attention
  layer, with the target's embeddings, final norm and head, a zero MLP, and RoPE slowed to near
  identity (NemotronH's attention has no RoPE; linear scaling 4096 over 512 positions);
* ``mtp/``: ``target/`` with one NemotronH MTP layer (NEXTN's draft, pattern "*"), that same
  attention layer again behind the MTP's input projection, which passes the normed token
  embedding through and drops the target's hidden state;
* ``eagle/``: the same layer as an EAGLE head (`LlamaForCausalLMEagle`): its `fc` passes the
  token embedding through, scaled to stand in for the input norm the head lacks, and drops the
  target's hidden state.

The Llama draft proposes the target's own next token about 3 times in 4 (greedy, checked with
transformers on random prompts); the EAGLE head and the MTP layer are accepted less often (on
one prompt served on CPU, 1.3 tokens per verify round against the Llama's 3). Each proposes
only through its attention over its own KV: a draft whose KV were wrong would propose other
tokens and be accepted less. The tokenizer is the target's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

MAMBA_OUT_SCALE = 0.01
ROPE = {"rope_type": "linear", "factor": 4096.0}
DRAFT_POSITIONS = 512


def _attention_layer(config: dict[str, Any]) -> int:
    """The target's first attention layer ('*' in NemotronH's layer pattern)."""
    return str(config["hybrid_override_pattern"]).index("*")


def _projections(target: dict[str, Any], layer: int, prefix: str) -> dict[str, Any]:
    """The target's attention layer `layer`'s q/k/v/o projections, renamed `prefix`.{p}_proj."""
    src = f"model.layers.{layer}.mixer"
    return {f"{prefix}.{p}_proj.weight": target[f"{src}.{p}_proj.weight"] for p in "qkvo"}


def _pass_through(hidden: int, scale: float = 1.0) -> Any:
    """A [hidden, 2 x hidden] projection that keeps the first input (times `scale`) and drops
    the second: the token embedding through, the target's hidden state out."""
    import torch

    return torch.cat([torch.eye(hidden) * scale, torch.zeros(hidden, hidden)], dim=1)


def quiet_target(tensors: dict[str, Any]) -> dict[str, Any]:
    """The target's tensors with Mamba outputs scaled down and the MLP's output zeroed."""
    out = dict(tensors)
    for name, value in tensors.items():
        if name.endswith("mixer.out_proj.weight"):
            out[name] = value * MAMBA_OUT_SCALE
        elif name.endswith("mixer.down_proj.weight"):
            out[name] = value * 0
    return out


def draft_tensors(target: dict[str, Any], layer: int, config: dict[str, Any]) -> dict[str, Any]:
    """A one-layer Llama checkpoint of the target's attention layer `layer`."""
    import torch

    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    src = f"model.layers.{layer}"
    out = {
        "model.embed_tokens.weight": target["model.embeddings.weight"],
        "model.norm.weight": target["model.norm_f.weight"],
        "lm_head.weight": target["lm_head.weight"],
        "model.layers.0.input_layernorm.weight": target[f"{src}.norm.weight"],
        "model.layers.0.post_attention_layernorm.weight": torch.ones(hidden),
        "model.layers.0.mlp.gate_proj.weight": torch.zeros(inter, hidden),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(inter, hidden),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(hidden, inter),
    }
    return out | _projections(target, layer, "model.layers.0.self_attn")


def eagle_tensors(draft: dict[str, Any]) -> dict[str, Any]:
    """The draft as an EAGLE head: names without `model.`, and `fc` = [I / r | 0], r the
    embeddings' mean RMS. SGLang's EAGLE layer 0 has no input norm, so `fc` stands in for
    the target's (weights 1: a division by the token's RMS, which varies by about 10 %
    between tokens); no final norm either, which greedy proposals do not see (a positive
    scale per token)."""
    import torch

    out = {k.removeprefix("model."): v for k, v in draft.items() if k != "model.norm.weight"}
    out.pop("layers.0.input_layernorm.weight")
    embed = draft["model.embed_tokens.weight"]
    hidden = embed.shape[1]
    rms = float(embed.pow(2).mean(dim=1).sqrt().mean())
    out["fc.weight"] = _pass_through(hidden, 1 / rms)
    out["fc.bias"] = torch.zeros(hidden)
    return out


def mtp_tensors(target: dict[str, Any], layer: int) -> dict[str, Any]:
    """NemotronH's MTP layer (pattern "*": SGLang's `NemotronHForCausalLMMTP`) as the target's
    attention layer `layer`: `eh_proj` = [I | 0] passes the normed token embedding through and
    drops the normed hidden state; the norms are 1."""
    import torch

    hidden = target["model.embeddings.weight"].shape[1]
    src, dst = f"model.layers.{layer}", "mtp.layers.0"
    out = {
        f"{dst}.enorm.weight": torch.ones(hidden),
        f"{dst}.hnorm.weight": torch.ones(hidden),
        f"{dst}.eh_proj.weight": _pass_through(hidden),
        f"{dst}.norm.weight": target[f"{src}.norm.weight"],
        f"{dst}.final_layernorm.weight": torch.ones(hidden),
    }
    return out | _projections(target, layer, f"{dst}.mixer")


def llama_config(target: dict[str, Any], architecture: str) -> dict[str, Any]:
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "pad_token_id", "bos_token_id", "eos_token_id",
            "torch_dtype", "tie_word_embeddings")  # fmt: skip
    return {
        **{k: target[k] for k in keep},
        "architectures": [architecture],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "rms_norm_eps": target["layer_norm_epsilon"],
        "max_position_embeddings": DRAFT_POSITIONS,
        "rope_scaling": ROPE,
        "hidden_act": "silu",
    }


def _write(out: Path, source: Path, config: dict[str, Any], tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    contiguous = {k: v.clone().contiguous() for k, v in tensors.items()}  # none shared
    save_file(contiguous, str(out / "model.safetensors"), metadata={"format": "pt"})


def make_tiny_spec(target: Path, out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    config = json.loads((target / "config.json").read_text())
    tensors = load_file(str(target / "model.safetensors"))
    layer = _attention_layer(config)
    quiet = quiet_target(tensors)
    _write(out / "target", target, config, quiet)
    mtp = {**config, "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*"}
    _write(out / "mtp", target, mtp, {**quiet, **mtp_tensors(tensors, layer)})
    draft = draft_tensors(tensors, layer, config)
    _write(out / "draft", target, llama_config(config, "LlamaForCausalLM"), draft)
    eagle = eagle_tensors(draft)
    _write(out / "eagle", target, llama_config(config, "LlamaForCausalLMEagle"), eagle)
    return {"out": str(out), "attention_layer": layer, "mamba_out_scale": MAMBA_OUT_SCALE}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", default="data/tiny-model", help="make_tiny_model's NemotronH")
    parser.add_argument("--out", default="data/tiny-spec", help="output directory")
    args = parser.parse_args(argv)
    print(json.dumps(make_tiny_spec(Path(args.target), Path(args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
