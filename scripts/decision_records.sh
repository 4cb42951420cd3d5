#!/usr/bin/env bash
# Records whose cache decisions must not change across a refactor: the 36-configuration ShareGPT
# grid (4 bundles), the agent sweep, the via-SGLang replays and the robustness grid.
# Run it at two commits and compare with scripts/compare_records.py (timings are ignored).
#   scripts/decision_records.sh OUT_DIR       (JENGA_BENCH overrides the jenga-bench command)
# Needs the six ShareGPT traces out/sharegpt-R.jsonl.gz and the agent trace (README).
set -euo pipefail
out=$1
bench=${JENGA_BENCH:-.venv/bin/jenga-bench}
mkdir -p "$out"
grid=()
for r in 0.25 0.5 1 2 5 10; do grid+=(--trace "out/sharegpt-$r.jsonl.gz"); done
agent=data/traces/agent-e65e885ce70e.jsonl.gz
sharegpt=out/sharegpt-1.jsonl.gz
$bench sweep "${grid[@]}" --model marconi-7b --cache-gb 1,2,3,4,5,10 \
    --policies jenga,marconi,sglang-lru,vllm-blocks --json --jobs 2 --out "$out/grid.jsonl"
$bench sweep --trace $agent --model marconi-7b --cache-gb 5,10,15,20,40 --caches jenga,sglang-native \
    --policies jenga,marconi,sglang-lru --json --jobs 2 --out "$out/agent.jsonl"
$bench replay --json --trace $sharegpt --cache-gb 2 --policy jenga --via sglang > "$out/via-sharegpt.jsonl"
$bench sweep --trace $sharegpt --cache-gb 2 --caches sglang-native,sglang-native-unified \
    --json --jobs 2 --out "$out/native-sharegpt.jsonl"
$bench replay --json --trace $agent --cache-gb 5 --policy jenga --via sglang > "$out/via-agent.jsonl"
$bench robustness --jobs 2 --out "$out/robustness" > /dev/null || true   # exit 1 = a target missed
