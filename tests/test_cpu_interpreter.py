"""The plugin's CPU interpreter mode: what it lets SGLang do on a CPU, and only there.

Fresh processes, because the patches act on process-wide state (torch, SGLang's modules):
with ``TRITON_INTERPRET=1`` on a machine without CUDA, SGLang's platform check for Mamba state
snapshots (the ``extra_buffer`` strategy) answers yes, ``Tensor.pin_memory`` is a no-op, and a
model dtype the conv snapshot cannot take fails at start-up with the fix named; without it all
stay SGLang's and torch's own. The live server with ``extra_buffer`` and overlap scheduling is
tests/test_e2e_server.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

_PROBE = textwrap.dedent(
    """
    import sys

    import torch
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.arg_groups import mamba_hook
    from sglang.srt.server_args import prepare_server_args

    print("SNAPSHOTS", mamba_hook._platform_supports_mamba_cache_extra_buffer())
    try:
        t = torch.arange(3)
        print("PINNED", t.pin_memory() is t)
    except RuntimeError as exc:
        print("PIN ERROR", type(exc).__name__)
    try:
        args = prepare_server_args(["--model-path", sys.argv[1], "--device", "cpu",
                                    "--dtype", "float32",
                                    "--mamba-radix-cache-strategy", "extra_buffer"])
        args.resolve_once()  # what the launcher does: SGLang's checks run here
        print("ARGS", args.mamba_radix_cache_strategy, args.disable_overlap_schedule)
    except (AssertionError, ValueError) as exc:
        print("ARGS ERROR", exc)
    """
)


def _probe(tmp_path: Path, model: Path, interpret: bool, conv: str | None = None) -> str:
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "SGLANG_MAMBA_CONV_DTYPE")
    }
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if conv is not None:
        env["SGLANG_MAMBA_CONV_DTYPE"] = conv
    out = subprocess.run(
        [sys.executable, str(probe), str(model)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the CPU mode is off where CUDA runs"
)
def test_interpreter_mode_allows_snapshots_and_unpinned_copies(
    tmp_path: Path, tiny_model: Path
) -> None:
    text = _probe(tmp_path, tiny_model, interpret=True, conv="float32")
    assert "SNAPSHOTS True" in text
    assert "PINNED True" in text
    assert "ARGS extra_buffer False" in text  # overlap scheduling stays on


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the CPU mode is off where CUDA runs"
)
def test_a_conv_dtype_the_snapshot_cannot_take_fails_at_start(
    tmp_path: Path, tiny_model: Path
) -> None:
    text = _probe(tmp_path, tiny_model, interpret=True)  # float32 model, bf16 conv states
    assert "ARGS ERROR" in text
    assert "the model runs in float32 but Mamba conv states are bfloat16" in text
    assert "SGLANG_MAMBA_CONV_DTYPE=float32" in text


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a CUDA machine snapshots by itself"
)
def test_without_the_interpreter_sglang_and_torch_answer_themselves(
    tmp_path: Path, tiny_model: Path
) -> None:
    text = _probe(tmp_path, tiny_model, interpret=False, conv="float32")
    assert "SNAPSHOTS False" in text
    assert "PIN ERROR RuntimeError" in text
    assert "ARGS ERROR extra_buffer requires platform support" in text
