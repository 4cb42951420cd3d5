"""The optional mypyc build (scripts/build_compiled.py): it must never change a decision.

The build-and-compare test compiles a copy of the package in a temporary folder (this checkout
is never touched), then replays one small trace through every bundle, sequential and engine
mode, with the copy and with a pure-Python copy, and runs the tree/policy/replay tests against
the compiled copy. It is skipped where mypyc or a C compiler is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import jenga_sglang.radix.tree
from jenga_sglang.bench.runs.runner import RunConfig, run
from jenga_sglang.bench.traces.trace import Request, sort_requests, write_trace
from jenga_sglang.compiled import MODULES, compiled, source

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"wall_s", "tuning_s", "cpu_s", "tuning_cpu_s", "compiled", "trace"}


def load_registry(package: Path) -> ModuleType:
    spec = spec_from_file_location("_compiled_copy", package / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_listed_module_has_a_source() -> None:
    for module in MODULES:
        assert source(module).is_file(), module


def test_records_say_whether_compiled_modules_ran(tiny_trace: Path) -> None:
    record = run(RunConfig(trace=str(tiny_trace), model="marconi-7b", cache_gb=1, policy="jenga"))
    is_ext = str(jenga_sglang.radix.tree.__file__).endswith(tuple(EXTENSION_SUFFIXES))
    assert record["compiled"] is compiled() is is_ext


def _fake_package(tmp_path: Path) -> Path:
    """A package whose compiled modules' sources differ from the build's (a stale build)."""
    package = tmp_path / "jenga_sglang"
    for module in MODULES:
        path = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {module}\n")
    shutil.copy(ROOT / "jenga_sglang" / "compiled.py", package / "compiled.py")
    return package


def test_a_stale_build_is_refused(tmp_path: Path) -> None:
    package = _fake_package(tmp_path)
    reg = load_registry(package)
    reg.check_fresh()  # no build: nothing to check
    fake = package / "radix" / f"tree{EXTENSION_SUFFIXES[0]}"
    fake.write_bytes(b"")
    with pytest.raises(ImportError, match="stale"):
        reg.check_fresh()  # a build without a stamp
    reg.STAMP.write_text(reg.source_digest() + "\n")
    reg.check_fresh()
    (package / "radix" / "tree.py").write_text("# edited after the build\n")
    with pytest.raises(ImportError, match="make accelerate"):
        reg.check_fresh()


def test_a_stale_build_is_set_aside_at_import(tmp_path: Path) -> None:
    """Importing the package with a stale build warns and finds every compiled module at its
    source from then on (the build is used by default, so an edit must not break a run)."""
    package = _fake_package(tmp_path)
    (package / "radix" / f"tree{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    reg = load_registry(package)
    reg.STAMP.write_text("an older digest\n")
    before = list(sys.meta_path)
    try:
        with pytest.warns(UserWarning, match="stale"):
            reg.use_fresh_build()
        finder = sys.meta_path[0]
        spec = finder.find_spec("jenga_sglang.radix.tree", None)
        assert spec is not None and spec.origin == str(reg.source("jenga_sglang.radix.tree"))
        assert finder.find_spec("jenga_sglang.binding.cache.backend", None) is None
        reg.prefer_sources()
        assert len(sys.meta_path) == len(before) + 1  # one finder, however often asked
    finally:
        sys.meta_path[:] = before


def chat_trace(path: Path, sessions: int = 100, turns: int = 5, seed: int = 0) -> Path:
    """Multi-turn sessions with a shared system prompt, arriving interleaved: enough requests
    and evictions for both tuners to snapshot, pickle and replay the cache."""
    rng = np.random.default_rng(seed)
    system = rng.integers(100, 32_000, 80).tolist()
    reqs = []
    for sid in range(sessions):
        history, ts = list(system), float(rng.exponential(1.0) + sid)
        for turn in range(turns):
            inp = history + rng.integers(100, 32_000, int(rng.integers(20, 120))).tolist()
            out = rng.integers(100, 32_000, int(rng.integers(5, 60))).tolist()
            reqs.append(Request(sid, turn, ts, inp, out))
            history, ts = inp + out, ts + float(rng.exponential(3.0))
    write_trace(path, sort_requests(reqs))
    return path


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    return chat_trace(tmp_path / "chat.jsonl", sessions=4, turns=2)


_REPLAYS = """
import json, sys
from jenga_sglang.bench.runs.runner import RunConfig, run
from jenga_sglang.compiled import compiled
for mode in ("sequential", "engine"):
    for policy in ("jenga", "marconi", "sglang-lru", "vllm-blocks"):
        config = RunConfig(trace=sys.argv[1], model="marconi-7b", cache_gb=0.15, policy=policy,
                           mode=mode, check=True)
        print(json.dumps(run(config)))
for policy in ("jenga", "sglang-lru", "vllm-blocks"):  # a host tier under them (radix/host.py)
    config = RunConfig(trace=sys.argv[1], model="marconi-7b", cache_gb=0.1, policy=policy,
                       host_gb=0.2, check=True)
    print(json.dumps(run(config)))
print(json.dumps({"compiled": compiled()}))
"""


def replays(package_root: Path, trace: Path) -> tuple[list[dict[str, Any]], bool]:
    done = subprocess.run(
        [sys.executable, "-c", _REPLAYS, str(trace)],
        cwd=package_root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *records, last = [json.loads(line) for line in done.stdout.splitlines()]
    return records, bool(last["compiled"])


def decisions(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in TIMING}


@pytest.mark.slow
def test_compiled_build_decides_like_pure_python(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    pytest.importorskip("mypyc")
    copy = tmp_path / "copy"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_compiled.stamp")
    shutil.copytree(ROOT / "jenga_sglang", copy / "jenga_sglang", ignore=skip)  # links resolved
    shutil.copytree(ROOT / "scripts", copy / "scripts", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", copy)  # mypy's settings for the build
    trace = chat_trace(tmp_path / "chat.jsonl")

    pure, was_compiled = replays(copy, trace)
    assert not was_compiled
    build = subprocess.run(
        [sys.executable, "scripts/build_compiled.py"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    if "skipped" in build.stdout:
        pytest.skip(build.stdout.strip().splitlines()[-1])
    fast, was_compiled = replays(copy, trace)
    assert was_compiled and all(r["compiled"] for r in fast)
    assert [decisions(r) for r in fast] == [decisions(r) for r in pure]
    tuned = {
        r["policy"]: r["tunings"] for r in pure if r["mode"] == "sequential" and not r["host_gb"]
    }
    assert tuned["jenga"] > 0 and tuned["marconi"] > 0  # snapshots were pickled and replayed

    # The tree, policy and replay tests against the compiled copy (found first from its cwd).
    tests = [
        "test_radix_tree.py",
        "test_policies.py",
        "test_replay.py",
        "test_background_tuning.py",
        "test_host_tier.py",
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *(str(ROOT / "tests" / t) for t in tests),
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
