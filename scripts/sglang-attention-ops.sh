#!/usr/bin/env bash
# Copies SGLang 0.5.23's Triton attention kernels (extend, deterministic extend, decode: three
# pure-Python files, ~200 KB) from the installed wheel into DEST as a minimal `sglang` package
# that imports on a GPU machine with PyTorch and Triton but no SGLang. Their outside imports
# (`sglang.srt.environ.envs`, four platform probes of `sglang.srt.utils`) are stubbed with the
# values a CUDA machine gives; `runtime_context`, which only their ROCm MLA path imports, is not.
# Nothing is copied into this repository. Usage, from the repository root, where SGLang is
# installed:  scripts/sglang-attention-ops.sh DEST   then, on the GPU machine:
#   PYTHONPATH=DEST python scripts/gpu_attention_views.py
set -euo pipefail
dest=${1:?usage: sglang-attention-ops.sh DEST}
src=$(.venv/bin/python -c 'import importlib.util,os; print(os.path.dirname(importlib.util.find_spec("sglang").origin))')
rm -rf "$dest/sglang"
ops="$dest/sglang/kernels/ops/attention"
mkdir -p "$ops" "$dest/sglang/srt/utils"
for d in sglang sglang/kernels sglang/kernels/ops sglang/kernels/ops/attention sglang/srt; do
  : > "$dest/$d/__init__.py"  # the originals register kernel inventories and pull in the server
done
cp "$src"/kernels/ops/attention/{decode_attention,extend_attention,score_mod}.py "$ops/"
cat > "$dest/sglang/srt/environ.py" <<'PY'
"""Stub: every SGLang environment flag unset (the kernels read only ROCm / tuning switches)."""


class _Unset:
    def get(self):
        return None


class _Envs:
    def __getattr__(self, name):
        return _Unset()


envs = _Envs()
PY
cat > "$dest/sglang/srt/utils/__init__.py" <<'PY'
"""Stub: the platform probes the attention kernels import, as SGLang answers them."""
import torch


def is_hip() -> bool:
    return torch.version.hip is not None


def is_cuda() -> bool:
    return torch.cuda.is_available() and not is_hip()


def is_gfx95_supported() -> bool:
    return False


def is_gfx1250_supported() -> bool:
    return False


def get_device_core_count(device_id: int = 0) -> int:
    return torch.cuda.get_device_properties(device_id).multi_processor_count
PY
du -sh "$dest/sglang"
