#!/usr/bin/env bash
# Copies what the GPU checks need of SGLang 0.5.23 (pure-Python Triton ops, ~1 MB) into DEST as a
# minimal `sglang` package, for a GPU machine with PyTorch and Triton but no SGLang: the attention
# kernels (scripts/sglang-attention-ops.sh, which this runs first), the Mamba2 SSD ops, and the
# FLA modules of the chunked Gated DeltaNet prefill. Their few outside imports are stubbed with
# what a CUDA machine answers. Nothing is copied into this repository.
# Usage, from the repository root where SGLang is installed:  scripts/sglang-gpu-ops.sh .gpu
# then, on the GPU machine:  PYTHONPATH=.:.gpu python -m jenga_sglang.bench.studies.kernel_bench
set -euo pipefail
dest=${1:?usage: sglang-gpu-ops.sh DEST}
"$(dirname "$0")/sglang-attention-ops.sh" "$dest" >/dev/null
src=$(.venv/bin/python -c 'import importlib.util,os; print(os.path.dirname(importlib.util.find_spec("sglang").origin))')
ops="$dest/sglang/kernels/ops"
mkdir -p "$ops/mamba/triton_ops" "$ops/attention/fla" "$dest/sglang/kernels/jit"
for d in mamba mamba/triton_ops attention/fla; do
  : > "$ops/$d/__init__.py"  # the originals pull in dispatchers and the server
done
: > "$dest/sglang/kernels/jit/__init__.py"
cp "$src"/kernels/ops/mamba/triton_ops/*.py "$ops/mamba/triton_ops/"
: > "$ops/mamba/triton_ops/__init__.py"
for m in chunk chunk_delta_h chunk_fwd chunk_o cumsum index l2norm op utils wy_fast; do
  cp "$src/kernels/ops/attention/fla/$m.py" "$ops/attention/fla/"
done
cat > "$dest/sglang/srt/utils/common.py" <<'PY'
"""Stub: the torch release tuple FLA's utils read."""
import torch
from packaging import version as _version

torch_release = _version.parse(torch.__version__).release
PY
cat > "$dest/sglang/kernels/jit/utils.py" <<'PY'
"""Stub: programmatic dependent launch is a Hopper feature."""
import functools

import torch


@functools.cache
def is_arch_support_pdl() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
PY
du -sh "$dest/sglang"
