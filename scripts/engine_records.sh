#!/usr/bin/env bash
# Engine-mode records whose decisions must not change across a refactor: the fragmentation
# study (smoke and full), a long-context batch and the ShareGPT engine replay on two memories.
# Run it at two commits and compare the JSON outputs field by field (timings aside), as
# scripts/compare_records.py does for scripts/decision_records.sh.
#   scripts/engine_records.sh OUT_DIR       (PY overrides the interpreter)
# Needs out/sharegpt-1.jsonl.gz (`jenga-bench traces build sharegpt --rate 1 --out ...`).
set -euo pipefail
out=$1
py=${PY:-.venv/bin/python}
bench="$py -m jenga_sglang.bench.cli.main"
mkdir -p "$out"
$bench fragmentation --requests 6 --min-tokens 3000 --max-tokens 9000 --decode-tokens 200 \
    --chunk-tokens 1024 --jobs 1 --json > "$out/frag-smoke.jsonl"
$bench fragmentation --jobs 1 --json > "$out/frag-full.jsonl"
$bench long-batch --cache-gb 8 --min-output 50 --max-output 100 \
    --memories jenga,sglang-split,bytes --json > "$out/long-batch-short.jsonl"
for memory in bytes jenga; do
    $bench replay --json --trace out/sharegpt-1.jsonl.gz --cache-gb 2 --policy jenga \
        --mode engine --memory $memory > "$out/sharegpt-engine-$memory.jsonl"
done
