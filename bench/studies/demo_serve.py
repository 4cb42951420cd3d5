"""The serving half of `make demo`: the tiny model served stock and with `--enable-jenga`.

Each server (bench/drivers/server.py `LocalServer`, CPU flags, `no_buffer`) gets the same short
shared-prefix load: `GROUPS` groups of `PER_GROUP` token-id prompts, each a 160-token head shared
in its group plus a 24-token question of its own, streamed 3 at a time with 8 greedy output
tokens. Printed side by side: requests served, cached tokens (SGLang's `cached_tokens` in each
reply), prefill rounds and tokens prefilled (SGLang's "Prefill batch" log lines) and TTFT.
Stock `no_buffer` keeps Mamba states only at prefill ends, so a head shared by prompts that
differ after it is never a hit; with Jenga the second prompt of a group reveals the branch point
and its prefill pass checkpoints the state there, so the third prompt of each group hits the head
(measured: 0 vs 480 cached tokens, 1656 vs 1176 tokens prefilled, mean TTFT 5.05 vs 3.85 s).
A few minutes on 2 cores, most of it the two server starts; progress on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import stream_generate
from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies.bench_serving_cpu import prefill_figures

GROUPS, PER_GROUP, HEAD, QUESTION, OUTPUT = 3, 3, 160, 24, 8


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def prompts() -> list[list[int]]:
    """Group-major: the first prompt of each group arrives before its siblings."""
    out = []
    for q in range(PER_GROUP):
        for g in range(GROUPS):
            head = [(37 * g + 11 * j) % 500 + 1 for j in range(HEAD)]
            out.append(head + [(53 * g + 29 * q + 7 * j) % 500 + 1 for j in range(QUESTION)])
    return out


def ensure_model(path: Path) -> None:
    if (path / "model.safetensors").exists():
        return
    _say(f"building the tiny model in {path} (a few seconds)")
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_model.py"
    subprocess.run([sys.executable, str(script), "--out", str(path)], check=True, timeout=600)


def serve_once(model: Path, jenga: bool, out: Path) -> dict[str, Any]:
    name = "jenga" if jenga else "stock"
    log = out / f"serve-{name}.log"
    _say(f"{name}: starting the server (log {log})")
    start = time.monotonic()
    flags = ["--enable-jenga"] if jenga else []
    with LocalServer(str(model), flags, log=log, ready_timeout_s=600) as server:
        _say(f"{name}: ready in {time.monotonic() - start:.0f} s; {GROUPS * PER_GROUP} requests")
        batch = prompts()
        results = []
        # The first prompt of each group alone, then the rest 3 at a time: the heads are in the
        # tree (or not) before their siblings arrive.
        with ThreadPoolExecutor(3) as pool:
            for i in range(0, len(batch), 3):
                chunk = batch[i : i + 3]
                calls = [pool.submit(stream_generate, server.url, p, OUTPUT) for p in chunk]
                results += [c.result(timeout=600) for c in calls]
                _say(f"{name}: {len(results)}/{len(batch)} done")
    figures = prefill_figures(log.read_text(errors="replace"))
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    return {
        "server": name,
        "served": sum(1 for r in results if r.status == 200 and r.chunks),
        "cached_tokens": sum(r.cached_tokens for r in results),
        **figures,
        "ttft_mean_s": round(statistics.fmean(ttfts), 2) if ttfts else None,
        "ttft_max_s": round(max(ttfts), 2) if ttfts else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    keys = ["served", "cached_tokens", "prefill_rounds", "new_tokens", "ttft_mean_s", "ttft_max_s"]
    lines = ["| | " + " | ".join(r["server"] for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(r[k]) for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def run_serve_demo(model: str | Path = "data/tiny-model", out_dir: str | Path = "out/demo") -> int:
    out, model = Path(out_dir), Path(model)
    out.mkdir(parents=True, exist_ok=True)
    ensure_model(model)
    rows = [serve_once(model, jenga, out) for jenga in (False, True)]
    print(
        f"\nThe tiny NemotronH on CPU, {GROUPS} groups x {PER_GROUP} prompts sharing a "
        f"{HEAD}-token head (SGLang 0.5.23, no_buffer):\n"
    )
    print(table(rows))
    return 0 if all(r["served"] == GROUPS * PER_GROUP for r in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/tiny-model", help="built when missing")
    parser.add_argument("--out", default="out/demo", help="server logs and the table")
    args = parser.parse_args(argv)
    return run_serve_demo(args.model, args.out)


if __name__ == "__main__":
    sys.exit(main())
