"""Our command-line flags: definition, parsing and conflict checks (no sglang import).

SGLang's `ServerArgs.from_cli_args` keeps only its own fields, so the plugin parses ours from the
argparse namespace with `options_from_namespace` and carries them on the record as a bookkeeping
attribute (`JENGA_ATTR`), which `ServerArgs.__reduce__` pickles into every scheduler process;
`options_of` reads them back there.

The policy flags produce one `PolicyRecord` (policies/registry.py): `--jenga-policy` names the
bundle it starts from (default `jenga`), and `--jenga-admission`, `--jenga-eviction`,
`--jenga-alpha`, `--[no-]jenga-prompt-end` and `--jenga-ghost-tokens` override its fields.

The Jenga pool hands SGLang's attention kernels per-layer KV views whose row stride is a whole
KV page, or one token of every layer (pool/layout.py), so it serves only the attention backends
checked to read such views (`POOL_ATTENTION_BACKENDS`); with no backend named on a GPU it picks
Triton (`pool_attention_default`), and any other backend, named or resolved by SGLang, fails at
start-up naming it (`check_conflicts`, `check_pool_attention`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any, Literal

from jenga_sglang.binding.refusals import (
    DRAFTLESS_SPECULATIVE,
    POOL_STANDS_IN,
    WITH_JENGA,
    WITH_POOL,
    refusal_message,
    stand_in_message,
)
from jenga_sglang.policies.branching import GHOST_TOKENS
from jenga_sglang.policies.registry import (
    EVICTIONS,
    SERVER_ADMISSIONS,
    PolicyRecord,
    bundle,
    bundle_names,
)

BACKEND_NAME = "jenga"
JENGA_ATTR = "_jenga_options"

CAPTURES = ("in-pass", "cut")

#: The server's record when no policy flag is given: the `jenga` bundle with the state at each
#: prompt's end kept, since a chat client's next turn may re-render the reply it resends.
SERVER_POLICY = replace(bundle("jenga"), prompt_end=True)

# SGLang's attention flags, as (prefill, decode) resolve them: a split flag wins over the base.
_ATTENTION_FLAGS: tuple[tuple[str, str], ...] = (
    ("attention_backend", "--attention-backend"),
    ("prefill_attention_backend", "--prefill-attention-backend"),
    ("decode_attention_backend", "--decode-attention-backend"),
    ("speculative_draft_attention_backend", "--speculative-draft-attention-backend"),
)

#: Attention backends that read the Jenga pool's strided KV views right: Triton's extend,
#: deterministic-extend and decode kernels, bit for bit against contiguous buffers under the
#: interpreter (tests/test_attention_views.py), and torch_native, which reads them by torch
#: indexing (the CPU servers of tests/test_e2e_server.py). fa3, flashinfer, trtllm_mha and the
#: others are not checked on these views (docs/sglang.md "The Jenga pool behind SGLang's pools").
POOL_ATTENTION_BACKENDS = ("triton", "torch_native")

#: What the pool runs when no attention backend is named on a GPU, where SGLang would pick one
#: it does not serve (fa3 on Hopper, trtllm_mha on Blackwell, flashinfer elsewhere).
POOL_DEFAULT_ATTENTION = "triton"


class JengaFlagError(ValueError):
    """Conflicting or malformed flags; the message names the flags."""


@dataclass(frozen=True)
class JengaOptions:
    """What `--enable-jenga` and its options asked for.

    `policy` is the record the policy flags produced (admission, eviction, alpha or auto, the
    prompt-end state, ghost tokens; policies/registry.py), built by policies/bundles.py.
    `pool` puts the Jenga pool behind SGLang's KV and Mamba pools (binding/pools/hook.py).
    `capture` is how planned SSM checkpoints inside a prefill chunk are taken: 'in-pass' (the
    forward writes them, binding/capture/forward.py) or 'cut' (the chunk ends there and the
    next round goes on, binding/capture/prefill_cut.py); 'cut' is also what models whose state
    layers the in-pass hooks do not cover get.
    `host_gb` > 0 puts the live host tier under the tree (binding/host/), whose decisions weigh
    loads over `host_bw` GB/s against recomputing at `prefill_tflops` TFLOP/s; `host_ratio` > 0
    sizes it instead as that multiple of the device pools' bytes (`--enable-hierarchical-cache`
    with `--hicache-ratio` or SGLang's default ratio: `hicache_tier`).
    """

    enabled: bool = False
    policy: PolicyRecord = SERVER_POLICY
    pool: bool = True
    capture: str = "in-pass"
    host_gb: float = 0.0
    host_ratio: float = 0.0
    host_bw: float = 25.0
    prefill_tflops: float = 494.5


def options_of(server_args: Any) -> JengaOptions:
    """Our options as carried on a ServerArgs record (defaults when the plugin did not parse)."""
    found = getattr(server_args, JENGA_ATTR, None)
    return found if isinstance(found, JengaOptions) else JengaOptions()


def parse_alpha(text: str) -> float | Literal["auto"]:
    """`auto` or a non-negative float."""
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        msg = f"--jenga-alpha: expected 'auto' or a float, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"--jenga-alpha must be >= 0, got {text!r}")
    return value


def parse_policy(text: str) -> str:
    """The name of a bundle (policies/registry.py)."""
    try:
        record = bundle(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--jenga-policy: {exc}") from None
    if record.admission not in SERVER_ADMISSIONS:
        raise argparse.ArgumentTypeError(
            f"--jenga-policy: {text!r} plans checkpoints where input + output leaves the tree, "
            "which a server cannot know before it prefills (a simulator-only baseline)"
        )
    return text


def parse_ghost_tokens(text: str) -> int:
    """A non-negative number of tokens."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--jenga-ghost-tokens: expected a number of tokens, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--jenga-ghost-tokens must be >= 0, got {text!r}")
    return value


def parse_amount(flag: str, positive: bool) -> Any:
    """A parser of a float that is >= 0 (> 0 when `positive`) for `flag`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a number, got {text!r}") from None
        if not (value > 0 if positive else value >= 0) or value == float("inf"):
            bound = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"{flag} must be finite and {bound}, got {text!r}")
        return value

    return parse


def add_jenga_args(parser: argparse.ArgumentParser) -> None:
    """Add our flags to SGLang's parser (idempotent: a second call adds nothing)."""
    if any("--enable-jenga" in action.option_strings for action in parser._actions):
        return
    group = parser.add_argument_group("jenga-sglang (hybrid-model prefix cache)")
    group.add_argument(
        "--enable-jenga",
        action="store_true",
        help="Use the jenga-sglang radix cache: exact SSM checkpoints at branch points and at "
        "the last decoded token, FLOP-aware eviction. Selects --radix-cache-backend jenga.",
    )
    group.add_argument(
        "--jenga-policy",
        type=parse_policy,
        default=None,
        metavar="NAME",
        help="Named policy bundle the other --jenga-* policy flags start from (default "
        f"'jenga'): {', '.join(bundle_names())} (policies/README.md). The prompt-end state "
        "stays on unless --no-jenga-prompt-end.",
    )
    group.add_argument(
        "--jenga-admission",
        choices=SERVER_ADMISSIONS,
        default=None,
        help="Which SSM states enter the cache: 'jenga' (branch points, skipping short ones, "
        "and the last decoded token; default), 'speculative' (Marconi), 'every-block'.",
    )
    group.add_argument(
        "--jenga-eviction",
        choices=EVICTIONS,
        default=None,
        help="Eviction order: 'jenga' (FLOP-aware, superseded checkpoints first; default), "
        "'flop-aware' (Marconi), 'marconi' (Marconi as its reference simulator computes it), "
        "'lru'.",
    )
    group.add_argument(
        "--jenga-alpha",
        type=parse_alpha,
        default=None,
        metavar="auto|FLOAT",
        help="Weight of FLOP efficiency against recency in eviction: 'auto' tunes it online "
        "(default), a float fixes it.",
    )
    group.add_argument(
        "--jenga-pool",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Hold KV and Mamba states in one Jenga pool (one buffer, pages carved per type on "
        "demand) instead of SGLang's static split (default: on). Serves the triton and "
        "torch_native attention backends (triton on a GPU when none is named); conflicts with "
        "--enable-unified-memory and --mamba-full-memory-ratio.",
    )
    group.add_argument(
        "--jenga-prompt-end",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Also keep the SSM state at the end of each prompt (default: on). A chat client's "
        "next turn repeats the prompt but may re-render the reply, so the state after the last "
        "decoded token can miss where the prompt-end state hits.",
    )
    group.add_argument(
        "--jenga-ghost-tokens",
        type=parse_ghost_tokens,
        default=None,
        metavar="N",
        help="Token ids of finished requests the 'jenga' admission remembers (4 bytes each, "
        f"host memory; default {GHOST_TOKENS}), to checkpoint where a request leaves an "
        "evicted history (agents that rewrite old turns). 0 turns it off.",
    )
    group.add_argument(
        "--jenga-capture",
        choices=CAPTURES,
        default=None,
        help="How SSM checkpoints inside a prefill chunk are taken: 'in-pass' (the prefill "
        "forward writes them, no extra round; default for Mamba2-mixer models) or 'cut' (the "
        "chunk ends at each checkpoint: one more prefill round each).",
    )
    group.add_argument(
        "--jenga-host-gb",
        type=parse_amount("--jenga-host-gb", False),
        default=None,
        metavar="GB",
        help="Host memory (GB) for a second tier under the tree: what device eviction would "
        "drop moves there when its load beats its recompute, and a hit there is loaded back "
        "(docs/host-tier.md). One budget for KV and states. Default 0: no tier.",
    )
    group.add_argument(
        "--jenga-host-bw",
        type=parse_amount("--jenga-host-bw", True),
        default=None,
        metavar="GB/S",
        help="Host-device bandwidth the tier's decisions assume (default 25, PCIe 4 x16).",
    )
    group.add_argument(
        "--jenga-prefill-tflops",
        type=parse_amount("--jenga-prefill-tflops", True),
        default=None,
        metavar="TFLOPS",
        help="Prefill throughput the tier weighs recompute at (default 494.5: an H100's dense "
        "bf16 peak at 50%% MFU).",
    )


def check_conflicts(args: argparse.Namespace) -> None:
    """Raise JengaFlagError naming the flags when ours contradict SGLang's."""
    enabled = bool(getattr(args, "enable_jenga", False))
    if not enabled:
        given = [
            flag
            for attr, flag in (
                ("jenga_policy", "--jenga-policy"),
                ("jenga_admission", "--jenga-admission"),
                ("jenga_eviction", "--jenga-eviction"),
                ("jenga_alpha", "--jenga-alpha"),
                ("jenga_prompt_end", "--[no-]jenga-prompt-end"),
                ("jenga_pool", "--[no-]jenga-pool"),
                ("jenga_ghost_tokens", "--jenga-ghost-tokens"),
                ("jenga_capture", "--jenga-capture"),
                ("jenga_host_gb", "--jenga-host-gb"),
                ("jenga_host_bw", "--jenga-host-bw"),
                ("jenga_prefill_tflops", "--jenga-prefill-tflops"),
            )
            if getattr(args, attr, None) is not None
        ]
        if given:
            raise JengaFlagError(f"{', '.join(given)} given without --enable-jenga")
        return
    for refusal in WITH_JENGA:
        if refusal.given(args):
            raise JengaFlagError(refusal_message("--enable-jenga", refusal))
    backend = getattr(args, "radix_cache_backend", None)
    if backend not in (None, BACKEND_NAME):
        raise JengaFlagError(
            f"--enable-jenga conflicts with --radix-cache-backend {backend} "
            f"(it selects --radix-cache-backend {BACKEND_NAME})"
        )
    check_disaggregation(args)
    hicache_tier(args)
    if getattr(args, "jenga_pool", None) is False:
        return
    for refusal in WITH_POOL:
        if refusal.given(args):
            raise JengaFlagError(refusal_message("--jenga-pool (on with --enable-jenga)", refusal))
    for attr, flag in _ATTENTION_FLAGS:
        backend = getattr(args, attr, None)
        if backend is not None and backend not in POOL_ATTENTION_BACKENDS:
            raise JengaFlagError(_unserved(f"conflicts with {flag} {backend}", flag))


#: SGLang's host/device ratio for HiCache when neither --hicache-ratio nor --hicache-size is
#: given (arg_groups/hicache_hook.py, host memory mode "cache").
HICACHE_DEFAULT_RATIO = 2.0


def drop_pool_stand_ins(args: argparse.Namespace) -> list[str]:
    """With `--enable-jenga` and the pool on, unset the SGLang flags the pool stands in for
    (refusals.py `POOL_STANDS_IN`) in the namespace SGLang reads; the warnings to log."""
    if not getattr(args, "enable_jenga", False) or getattr(args, "jenga_pool", None) is False:
        return []
    dropped = [s for s in POOL_STANDS_IN if s.given(args)]
    for stand_in in dropped:
        setattr(args, stand_in.attr, stand_in.unset)
    return [stand_in_message(s) for s in dropped]


def hicache_tier(args: argparse.Namespace) -> tuple[float, float] | None:
    """`--enable-hierarchical-cache` with `--enable-jenga`: our host tier stands in for SGLang's
    HiCache, sized by SGLang's flags. (host GB, host/device ratio), one of them 0, or None
    without the flag. Raises JengaFlagError for what our tier cannot honour."""
    if not getattr(args, "enable_hierarchical_cache", False):
        return None
    storage = getattr(args, "hicache_storage_backend", None)
    if storage is not None:
        raise JengaFlagError(
            f"--enable-jenga serves --enable-hierarchical-cache with its own host tier, which "
            f"has no storage backend: drop --hicache-storage-backend {storage}"
        )
    if getattr(args, "hicache_host_memory_mode", "cache") == "buffer_only":
        raise JengaFlagError(
            "--enable-jenga serves --enable-hierarchical-cache with its own host tier, which "
            "keeps what it holds: drop --hicache-host-memory-mode buffer_only"
        )
    if getattr(args, "jenga_host_gb", None) is not None:
        raise JengaFlagError(
            "--jenga-host-gb and --enable-hierarchical-cache both size the host tier under "
            "--enable-jenga: give one (with HiCache's, --hicache-size or --hicache-ratio)"
        )
    size = float(getattr(args, "hicache_size", 0) or 0)
    if size > 0:
        return size, 0.0
    ratio = getattr(args, "hicache_ratio", None)
    if ratio is not None and float(ratio) <= 0:
        raise JengaFlagError(f"--hicache-ratio {ratio}: the host tier needs a ratio > 0")
    return 0.0, float(ratio) if ratio is not None else HICACHE_DEFAULT_RATIO


def check_disaggregation(args: argparse.Namespace) -> None:
    """Prefill-decode disaggregation with `--enable-jenga`: what is refused, naming the fallback.

    * The Jenga pool registers one region per page type, a whole page per row, paired with the
      peer's by an id of its own (binding/pools/transfer.py). That addressing is checked for
      SGLang's Mooncake backend only (its generic transfer: pointer + row x item length, runs
      merged), so another `--disaggregation-transfer-backend` is refused with the pool, as is
      `--enable-pd-role-switch` (a worker that changes sides keeps both sides' pools), and so
      is speculative decoding with a draft model (its KV in the target's pages: untested).
    * Our tree on the decode side (`--disaggregation-decode-enable-radix-cache`) matches on the
      KV alone, since the state arrives from prefill (binding/cache/factory.py). It keeps
      nothing in host memory: with a host tier on that side it is refused.
    """
    mode = getattr(args, "disaggregation_mode", None) or "null"
    switch = bool(getattr(args, "enable_pd_role_switch", False))
    if mode == "null" and not switch:
        return
    backend = getattr(args, "disaggregation_transfer_backend", None) or "mooncake"
    if getattr(args, "jenga_pool", None) is not False and (switch or backend != "mooncake"):
        what = (
            "--enable-pd-role-switch" if switch else f"--disaggregation-transfer-backend {backend}"
        )
        raise JengaFlagError(
            f"--jenga-pool (on with --enable-jenga) conflicts with {what}: the pool's page "
            "regions are checked with SGLang's mooncake transfer backend on fixed prefill and "
            "decode workers only; pass --no-jenga-pool (SGLang's pools under our tree; "
            "docs/sglang.md, 'Prefill-decode disaggregation')"
        )
    algorithm = str(getattr(args, "speculative_algorithm", None) or "").upper()
    drafted = algorithm not in ("", *DRAFTLESS_SPECULATIVE)  # a draft model's KV in the pages
    if getattr(args, "jenga_pool", None) is not False and drafted:
        raise JengaFlagError(
            f"--jenga-pool (on with --enable-jenga) conflicts with --speculative-algorithm "
            f"{algorithm} under --disaggregation-mode {mode}: the draft's KV rides in the "
            "target's KV pages, and a PD transfer of a draft's pool is not checked on them; "
            "pass --no-jenga-pool (docs/sglang.md, 'Prefill-decode disaggregation')"
        )
    decode_tree = mode == "decode" and getattr(
        args, "disaggregation_decode_enable_radix_cache", False
    )
    tier = getattr(args, "enable_hierarchical_cache", False) or getattr(args, "jenga_host_gb", None)
    if decode_tree and tier:
        raise JengaFlagError(
            "--enable-jenga on a decode worker with --disaggregation-decode-enable-radix-cache "
            "keeps its tree on device only: drop --enable-hierarchical-cache / --jenga-host-gb "
            "there (SGLang's decode-side restore from host is not served by our tier)"
        )


def _unserved(what: str, flag: str) -> str:
    served = " and ".join(POOL_ATTENTION_BACKENDS)
    cpu = "" if flag == "--speculative-draft-attention-backend" else " (torch_native on CPU)"
    return (
        f"--jenga-pool (on with --enable-jenga) {what}: of SGLang's attention backends only "
        f"{served} are checked to read the pool's strided KV views; pass {flag} "
        f"{POOL_DEFAULT_ATTENTION}{cpu}, or --no-jenga-pool to keep SGLang's pools"
    )


def pool_attention_default(args: argparse.Namespace, cuda_available: bool) -> str | None:
    """The attention backend to set when the Jenga pool is on, a GPU serves (`--device cuda`,
    or no device and CUDA available) and a prefill or decode backend is left to SGLang, which
    would pick one the pool does not serve; None otherwise (SGLang's CPU choice, torch_native
    without AMX, stays)."""
    named = {attr: getattr(args, attr, None) for attr, _ in _ATTENTION_FLAGS}
    if (
        not getattr(args, "enable_jenga", False)
        or getattr(args, "jenga_pool", None) is False
        or named["attention_backend"] is not None
        or None not in (named["prefill_attention_backend"], named["decode_attention_backend"])
    ):
        return None
    device = getattr(args, "device", None)
    on_gpu = str(device).startswith("cuda") or (device is None and cuda_available)
    return POOL_DEFAULT_ATTENTION if on_gpu else None


def check_pool_attention(prefill: str | None, decode: str | None) -> None:
    """Raise JengaFlagError naming the flag when a backend SGLang resolved for the Jenga pool
    (after its defaults and model overrides) is not one that reads the pool's views right."""
    sides = {"--prefill-attention-backend": prefill, "--decode-attention-backend": decode}
    if prefill == decode:
        sides = {"--attention-backend": prefill}
    for flag, backend in sides.items():
        if backend is not None and backend not in POOL_ATTENTION_BACKENDS:
            raise JengaFlagError(_unserved(f"does not serve {flag} {backend}", flag))


def options_from_namespace(args: argparse.Namespace) -> JengaOptions:
    """Our options from a parsed namespace (after `check_conflicts`)."""
    return JengaOptions(
        enabled=bool(getattr(args, "enable_jenga", False)),
        policy=policy_from_namespace(args),
        pool=getattr(args, "jenga_pool", None) is not False,
        capture=getattr(args, "jenga_capture", None) or "in-pass",
        host_gb=getattr(args, "jenga_host_gb", None) or 0.0,
        host_ratio=getattr(args, "jenga_host_ratio", None) or 0.0,
        host_bw=getattr(args, "jenga_host_bw", None) or JengaOptions.host_bw,
        prefill_tflops=getattr(args, "jenga_prefill_tflops", None) or JengaOptions.prefill_tflops,
    )


def policy_from_namespace(args: argparse.Namespace) -> PolicyRecord:
    """The named bundle (`SERVER_POLICY` when none), the prompt-end state on, and then every
    policy flag given."""
    name = getattr(args, "jenga_policy", None)
    record = SERVER_POLICY if name is None else replace(bundle(name), prompt_end=True)
    changes: dict[str, Any] = {}
    for attr, key in (
        ("jenga_admission", "admission"),
        ("jenga_eviction", "eviction"),
        ("jenga_prompt_end", "prompt_end"),
        ("jenga_ghost_tokens", "ghost_tokens"),
    ):
        value = getattr(args, attr, None)
        if value is not None:
            changes[key] = value
    alpha = getattr(args, "jenga_alpha", None)
    if alpha is not None:
        changes["alpha"] = None if alpha == "auto" else float(alpha)
    return replace(record, **changes)


def pool_wanted(configurator: Any, req_to_token_pool: Any) -> bool:
    """Whether the Jenga pool replaces SGLang's pools for this KV cache configurator:
    `--enable-jenga` with `--jenga-pool`, the target worker (a draft shares its pools) and no
    request pool handed in. Which models it fits is the hooks' (pool_hook, swa_pool_hook)."""
    options = options_of(configurator.server_args)
    return (
        options.enabled
        and options.pool
        and not configurator.is_draft_worker
        and req_to_token_pool is None
    )
