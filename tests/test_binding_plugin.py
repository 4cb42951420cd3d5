"""Plugin discovery and flags through SGLang's own launch path, in fresh processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

_PROBE = textwrap.dedent(
    """
    import multiprocessing as mp
    import pickle
    import sys

    from sglang.srt.plugins import load_plugins


    def scheduler_side(blob, queue):
        # A fresh (spawned) process, like SGLang's scheduler: plugins load again.
        load_plugins()
        from sglang.srt.managers.schedule_policy import PrefillAdder
        from sglang.srt.mem_cache.registry import get_radix_cache_factory
        args = pickle.loads(blob)
        queue.put((args.radix_cache_backend, repr(args._jenga_options),
                   get_radix_cache_factory("jenga") is not None,
                   PrefillAdder.add_one_req.__module__, PrefillAdder.add_chunked_req.__name__,
                   getattr(PrefillAdder.add_chunked_req, "__wrapped__", None) is not None))


    if __name__ == "__main__":
        load_plugins()
        from sglang.srt.server_args import prepare_server_args
        args = prepare_server_args(["--model-path", "dummy", "--enable-jenga",
                                    "--jenga-alpha", "0.5", "--jenga-eviction", "flop-aware",
                                    "--no-jenga-prompt-end", "--jenga-ghost-tokens", "1000"])
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=scheduler_side, args=(pickle.dumps(args), queue))
        child.start()
        print("CHILD", queue.get(timeout=120))
        child.join()
        for argv in (["--enable-jenga", "--disable-radix-cache"],
                     ["--enable-jenga", "--radix-cache-backend", "jenga"],
                     ["--enable-jenga", "--attention-backend", "fa3"]):
            try:
                prepare_server_args(["--model-path", "dummy", *argv])
                print("OK", argv)
            except ValueError as exc:
                print("ERROR", exc)
    """
)


def _run(args: list[str], tmp_path: Path) -> str:
    # cwd is a clean folder: a stray module in the caller's cwd must not shadow the stdlib.
    out = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_flags_in_help(tmp_path: Path) -> None:
    text = _run(["-m", "sglang.launch_server", "--help"], tmp_path)
    flags = ("--enable-jenga", "--jenga-admission", "--jenga-eviction", "--jenga-alpha")
    others = (
        "--jenga-prompt-end",
        "--no-jenga-prompt-end",
        "--no-jenga-pool",
        "--jenga-ghost-tokens",
        "--jenga-host-gb",
        "--jenga-host-bw",
        "--jenga-prefill-tflops",
    )
    for flag in (*flags, *others):
        assert flag in text
    assert "FLOP efficiency against recency" in text


def test_flags_reach_scheduler_process_and_conflicts_fail(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    text = _run([str(probe)], tmp_path)
    assert (
        "CHILD ('jenga', \"JengaOptions(enabled=True, policy=PolicyRecord(admission='jenga', "
        "eviction='flop-aware', alpha=0.5, tuner='sliding', prompt_end=False, ghost_tokens=1000, "
        "lock_prefix=True), pool=True, capture='in-pass', host_gb=0.0, host_ratio=0.0, "
        "host_bw=25.0, "
        'prefill_tflops=494.5)", '
        "True, "
        "'sglang.srt.managers.schedule_policy', 'add_chunked_req', True)"
    ) in text
    assert "ERROR --enable-jenga conflicts with --disable-radix-cache" in text
    assert "OK ['--enable-jenga', '--radix-cache-backend', 'jenga']" in text
    assert (
        "ERROR --jenga-pool (on with --enable-jenga) conflicts with --attention-backend fa3" in text
    )


_REFUSALS_PROBE = textwrap.dedent(
    """
    import json
    import sys

    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.server_args import prepare_server_args

    for argv in json.loads(sys.argv[1]):
        try:
            prepare_server_args(["--model-path", "dummy", "--enable-jenga", *argv])
            print("OK", argv)
        except ValueError as exc:
            print("ERROR", exc)
    """
)

#: A value for each refused flag that takes one (the others are switches).
_VALUES = {"--mamba-full-memory-ratio": "0.5", "--speculative-algorithm": "EAGLE3"}


def test_every_refused_flag_fails_at_start_up_naming_itself_and_why(tmp_path: Path) -> None:
    """Through SGLang's own argument parsing and our plugin, as `launch_server` runs them:
    each refused flag fails with a message that names it and gives the reason."""
    import json

    from jenga_sglang.binding.refusals import WITH_JENGA, WITH_POOL, refusal_message

    cases = [(r, "--enable-jenga") for r in WITH_JENGA]
    cases += [(r, "--jenga-pool (on with --enable-jenga)") for r in WITH_POOL]
    argvs = [[r.flag, *([_VALUES[r.flag]] if r.flag in _VALUES else [])] for r, _ in cases]
    probe = tmp_path / "probe.py"
    probe.write_text(_REFUSALS_PROBE)
    lines = _run([str(probe), json.dumps(argvs)], tmp_path).splitlines()
    errors = [line.removeprefix("ERROR ") for line in lines if line.startswith(("ERROR", "OK"))]
    assert len(errors) == len(cases), lines
    for (refusal, prefix), got in zip(cases, errors, strict=True):
        assert got == refusal_message(prefix, refusal)


_HICACHE_PROBE = textwrap.dedent(
    """
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.server_args import prepare_server_args

    for argv in ([], ["--hicache-size", "3"], ["--hicache-ratio", "1.5"],
                 ["--hicache-storage-backend", "file"], ["--jenga-host-gb", "2"],
                 ["--hicache-ratio", "0"]):
        try:
            args = prepare_server_args(["--model-path", "dummy", "--enable-jenga",
                                        "--enable-hierarchical-cache", *argv])
            o = args._jenga_options
            print("OK", args.enable_hierarchical_cache, o.host_gb, o.host_ratio)
        except ValueError as exc:
            print("ERROR", exc)
    """
)


def test_hierarchical_cache_is_served_by_our_host_tier(tmp_path: Path) -> None:
    """`--enable-jenga --enable-hierarchical-cache`: SGLang's HiCache is turned off and our
    tier takes its place, sized by --hicache-size (GB) or --hicache-ratio (SGLang's default
    2.0); what our tier cannot honour fails naming the flag."""
    probe = tmp_path / "probe.py"
    probe.write_text(_HICACHE_PROBE)
    out = _run([str(probe)], tmp_path)
    lines = [line for line in out.splitlines() if line.startswith(("OK", "ERROR"))]
    assert lines[:3] == ["OK False 0.0 2.0", "OK False 3.0 0.0", "OK False 0.0 1.5"], lines
    assert "drop --hicache-storage-backend file" in lines[3], lines
    assert "--jenga-host-gb and --enable-hierarchical-cache both size" in lines[4], lines
    assert "--hicache-ratio 0.0: the host tier needs a ratio > 0" in lines[5], lines


_STAND_IN_PROBE = textwrap.dedent(
    """
    import logging

    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    for argv in (["--enable-jenga", "--enable-unified-memory"],
                 ["--enable-jenga", "--mamba-full-memory-ratio", "0.5"],
                 ["--enable-jenga", "--no-jenga-pool", "--enable-unified-memory",
                  "--mamba-full-memory-ratio", "0.5"]):
        args = prepare_server_args(["--model-path", "dummy", *argv])
        print("OK", args.enable_unified_memory, args.mamba_full_memory_ratio)
    """
)


def test_flags_the_pool_stands_in_for_are_dropped_with_a_warning(tmp_path: Path) -> None:
    """`--enable-unified-memory` and `--mamba-full-memory-ratio` ask for what the Jenga pool
    does: with the pool on they are dropped before SGLang reads them, each with a warning
    naming it; with `--no-jenga-pool` SGLang keeps them."""
    from jenga_sglang.binding.refusals import POOL_STANDS_IN, stand_in_message

    probe = tmp_path / "probe.py"
    probe.write_text(_STAND_IN_PROBE)
    out = subprocess.run(
        [sys.executable, str(probe)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("OK")]
    assert lines[0].split()[1] == "False" and lines[1].split()[2] == "None", lines
    assert lines[2].split()[1:] == ["True", "0.5"], lines
    logged = out.stderr.splitlines()  # SGLang's log format: a timestamp, then the message
    for stand_in in POOL_STANDS_IN:
        said = [line for line in logged if line.endswith(stand_in_message(stand_in))]
        assert len(said) == 1, (stand_in.flag, logged[-20:])


_INT8_PROBE = textwrap.dedent(
    """
    import sys

    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.server_args import prepare_server_args

    for argv in (["--enable-jenga", "--enable-int8-mamba-checkpoint"],
                 ["--radix-cache-backend", "jenga", "--enable-int8-mamba-checkpoint"],
                 ["--enable-int8-mamba-checkpoint", "--enable-lmcache"]):
        try:
            args = prepare_server_args(["--model-path", sys.argv[1], "--device", "cpu",
                                        "--mamba-radix-cache-strategy", "no_buffer",
                                        "--disable-overlap-schedule", *argv])
            args.resolve_once()  # what launch_server runs next: SGLang's int8 check is here
            print("OK", args.radix_cache_backend, args.enable_int8_mamba_checkpoint)
        except ValueError as exc:
            print("ERROR", exc)
    """
)


def test_int8_checkpoints_pass_sglangs_check_with_our_cache_only(
    tiny_model: Path, tmp_path: Path
) -> None:
    """SGLang refuses `--enable-int8-mamba-checkpoint` beside any other radix-cache backend
    (a check of its model-dependent argument resolution: a real model path); ours stores int8
    checkpoints (binding/cache/mamba_state.py), so it passes, with the arguments unchanged,
    while SGLang's other int8 checks still run."""
    probe = tmp_path / "probe.py"
    probe.write_text(_INT8_PROBE)
    out = _run([str(probe), str(tiny_model)], tmp_path)
    lines = [line for line in out.splitlines() if line.startswith(("OK", "ERROR"))]
    assert lines[:2] == ["OK jenga True", "OK jenga True"], lines
    assert lines[2].startswith("ERROR") and "LMCache is not int8-aware" in lines[2], lines
