"""Our top-level folders never shadow installed packages of the same name.

sglang depends on the PyPI package `kernels`; our `kernels/` folder (like `radix/`, `policies/`
and `bench/`) has no __init__.py, so from the repository root Python treats it as a namespace
portion, which loses to any installed regular package. Our code is reached only as
`jenga_sglang.<name>`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import importlib.util, json, sys
out = {}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    out[name] = None if spec is None else spec.origin
print(json.dumps(out))
"""


def run_in_root(code: str, *args: str) -> str:
    """stdout of `python -c code args` run from the repository root, as a user would."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def probe(*names: str) -> dict[str, str | None]:
    result: dict[str, str | None] = json.loads(run_in_root(_PROBE, *names))
    return result


def test_import_kernels_from_the_repo_root_gets_the_pypi_package():
    origin = Path(run_in_root("import kernels; print(kernels.__file__)").strip()).resolve()
    assert "site-packages" in origin.parts
    assert ROOT / "kernels" not in origin.parents


@pytest.mark.parametrize("name", ["kernels", "radix", "policies", "bench"])
def test_no_top_level_folder_is_a_regular_package(name: str):
    assert not (ROOT / name / "__init__.py").exists()
    origin = probe(name)[name]  # None for a namespace portion; else an installed package
    assert origin is None or ROOT / name not in Path(origin).resolve().parents


def test_our_code_is_reached_through_the_jenga_sglang_namespace():
    found = probe("jenga_sglang.radix.tree", "jenga_sglang.kernels.roll_forward")
    for name, origin in found.items():
        assert origin is not None, name
        # .py, or the optional mypyc build's extension module next to it (scripts/build_compiled.py)
        assert Path(origin).name.endswith((".py", *EXTENSION_SUFFIXES)), origin
        assert ROOT / name.split(".")[1] in Path(origin).resolve().parents
