"""Test-session setup shared by every test module.

Triton reads TRITON_INTERPRET when it is first imported; any module (ours or sglang's) may import
it, so the CPU interpreter is switched on here, before collection. The rest of the interpreter
set-up lives in tests/triton_cpu.py.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
