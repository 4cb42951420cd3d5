"""Test-session setup shared by every test module.

Triton reads TRITON_INTERPRET when it is first imported; any module (ours or sglang's) may import
it, so the CPU interpreter is switched on here, before collection. The rest of the interpreter
set-up lives in tests/triton_cpu.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_model.py's NemotronH, built once per test session (about 15 s)."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-model"
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_model.py"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    command = [sys.executable, str(script), "--out", str(out)]
    subprocess.run(command, check=True, env=env, timeout=300)
    return out
