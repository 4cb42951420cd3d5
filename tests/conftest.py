"""Test-session setup shared by every test module.

Triton reads TRITON_INTERPRET when it is first imported; any module (ours or sglang's) may import
it, so the CPU interpreter is switched on here, before collection. The rest of the interpreter
set-up lives in tests/triton_cpu.py.

Tests marked `full` are long live variants beside a CI-sized one (another family of a cache
kind, the other Mamba strategy of a load test, another page size or checkpoint format of a
live host-tier test): `make test` skips them, saying so, and
`make test-full` (`pytest --full -m full`) runs them.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", help="also run tests marked `full`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="a long live variant beside a CI-sized one: make test-full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def _tiny(tmp_path_factory: pytest.TempPathFactory, name: str, *family: str) -> Path:
    """scripts/make_tiny_model.py's model (`family`: `--family F`, default NemotronH)."""
    out = tmp_path_factory.mktemp("tiny") / name
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_model.py"
    command = [sys.executable, str(script), *family, "--out", str(out)]
    subprocess.run(command, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=300)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_model.py's NemotronH, built once per test session (about 15 s)."""
    return _tiny(tmp_path_factory, "tiny-model")


@pytest.fixture(scope="session")
def tiny_spec(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_spec.py's models made from `tiny_model`: target/, draft/ (STANDALONE's),
    eagle/ (an EAGLE head) and mtp/ (target/ with its own MTP layer, NEXTN's draft)."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-spec"
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_spec.py"
    command = [sys.executable, str(script), "--target", str(tiny_model), "--out", str(out)]
    subprocess.run(command, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=300)
    return out


@pytest.fixture(scope="session")
def tiny_window_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_tiny_model.py's gpt-oss: sliding-window and full attention layers, with
    SGLang's separate window pool."""
    return _tiny(tmp_path_factory, "tiny-gpt_oss", "--family", "gpt_oss")
