#!/usr/bin/env bash
# CPU install recipe for jenga-sglang (see docs/install.md and DESIGN "Environment facts").
# Creates .venv when missing and installs, in order:
#   1. torch 2.14.1 + torchvision 0.29.1 (sglang 0.5.23 pins torch; torchvision is a hard import)
#   2. sglang 0.5.23 without its GPU dependency closure, then the pure-Python deps it imports
#   3. mamba-ssm / causal-conv1d as CPU-only source builds (used as independent test references)
#   4. this project, editable, with its dev extras
# A stamp file keyed on this script and pyproject.toml makes re-runs instant.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.jenga-install-stamp"
want=$(cat scripts/install-cpu.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip setuptools wheel
pip install -q torch==2.14.1 torchvision==0.29.1
pip install -q --no-deps sglang==0.5.23
pip install -q orjson IPython pydantic aiohttp transformers==5.19.0 tokenizers==0.23.2 dill \
  apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf openai==2.8.0 \
  partial-json-parser msgspec pybase64 pillow starlette pyzmq
pip install -q einops ninja "kernels>=0.14.1,<0.15"
# What sglang's HTTP server imports on the CPU path (docs/e2e-cpu.md).
pip install -q fastapi==0.165.0 uvicorn==0.54.0 uvloop==0.23.0 python-multipart==0.0.34 \
  setproctitle==1.3.8 prometheus-client==0.26.0 interegular==0.3.3 xxhash==4.1.0 \
  jsonschema==4.26.0 xgrammar==0.2.7 soundfile==0.13.1
# SGLang's benchmark client (`python -m sglang.bench_serving`) imports datasets.
pip install -q datasets==5.2.0
# The router (smg, the SGLang model gateway) and SGLang's gRPC worker mode that streams KV events
# to it, for the scale-out runs (`jenga-bench scale-dp`); binary wheels.
pip install -q smg==1.13.0 smg-grpc-servicer==0.14.1
# Only the tokenizer data file of mistral-common is used; its own dependency tree is not needed.
pip install -q --no-deps mistral-common==1.13.1
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE \
CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
  pip install -q --no-build-isolation --no-deps mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0
pip install -q -e '.[dev]'
echo "$want" > "$STAMP"
