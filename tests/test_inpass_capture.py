"""In-pass SSM checkpoints through SGLang's real model forward on CPU (tests/inpass_probe.py).

The probe serves a tiny model with SGLang's ModelRunner and our cache in a subprocess (the
NemotronH, whose Mamba2 layers it runs once per Mamba strategy; the Qwen3.5, whose Gated
DeltaNet layers take a lean set of positions, its prefill costing several times more under the
interpreter), and compares every captured state with the state after prefilling
[0, p) alone the same way (from scratch, chunked, or resumed from the cached state): SSM state
within 1e-5 (fp32). Conv state: every capture is bit for bit the conv inputs its forward used
(checked inside the forward). Against the prefix-alone conv state: at SGLang's default bf16 conv
dtype (no_buffer) equal, or apart by at most one bf16 rounding step plus 1e-5 where the
prefix-alone prefill's own in_proj GEMM (over p tokens instead of the whole row) rounds an fp32
input differently and the bf16 store then rounds it to the neighbouring value (CPU BLAS kernels
vary with the matrix shape and the instruction set, so which elements, if any, depends on the
machine; near-cancelling sums make the fp32 part); extra_buffer on CPU
needs fp32 conv states (an fp32 model; bench/drivers/server.py), where the same GEMM difference
shows as a few fp32 ulps (within 1e-5; within 1e-4 for the Qwen3.5, whose conv inputs come
from a wider projection whose sums cancel more). Positions cover p below the conv width,
before, at and after a chunk boundary (64), several rows of one batch starting mid-chunk, a resumed
request, the second and third chunk of a chunked prefill, and the admission's own plan.
The pure parts (geometry, slot bookkeeping) are tested here directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.binding.cache.captures import Capture, PendingCaptures
from jenga_sglang.binding.capture.geometry import plan_mamba2
from jenga_sglang.kernels.conv_gather import NO_INIT
from jenga_sglang.kernels.ssd_capture import NO_STATE

ROOT = Path(__file__).resolve().parents[1]
FP32_TOL = 1e-5
GDN_CONV_TOL = 1e-4  # module doc: the prefix-alone projection GEMM rounds differently


# ---------------------------------------------------------------- geometry and bookkeeping


def test_geometry_rolls_from_the_last_boundary_inside_the_row() -> None:
    # Rows packed at 0, 50, 140 (chunk 64); prefix of row 1 cached, rows 0 and 2 from scratch.
    caps = (Capture(0, 2, 10), Capture(1, 14, 11), Capture(1, 78, 12), Capture(2, 60, 13))
    g = plan_mamba2(caps, [0, 30, 0], [50, 90, 130], 64, 20)
    assert g.dst == (10, 11, 12, 13)
    assert g.conv_start == (0, 50, 50, 140) and g.conv_count == (2, 14, 78, 60)
    assert g.conv_init_row == (NO_INIT, 1, 1, NO_INIT)
    # f = 2: no boundary inside row 0 before it, from the row's (zero) start state;
    # f = 64 and 128 lie on boundaries inside row 1: chunks 1 and 2, no token to apply;
    # f = 200 (row 2) applies 8 tokens from boundary 192.
    assert g.chunk_src == (NO_STATE, 1, 2, 3) and g.row_src == (NO_STATE,) * 4
    assert g.ssm_start == (0, 64, 128, 192) and g.ssm_count == (2, 0, 0, 8)
    assert not g.reads_row_states


def test_geometry_uses_the_row_start_state_not_a_boundary_at_the_row_start() -> None:
    g = plan_mamba2((Capture(1, 5, 3),), [0, 7], [64, 10], 64, 8)
    assert g.chunk_src == (NO_STATE,) and g.row_src == (1,) and g.reads_row_states
    assert g.ssm_start == (64,) and g.ssm_count == (5,)


def test_geometry_rejects_captures_outside_their_row_and_bad_slots() -> None:
    with pytest.raises(ValueError, match="outside its row"):
        plan_mamba2((Capture(0, 11, 1),), [0], [10], 64, 4)
    with pytest.raises(ValueError, match="dst_idx"):
        plan_mamba2((Capture(0, 3, 9),), [0], [10], 64, 4)
    with pytest.raises(ValueError, match="both name slot"):
        plan_mamba2((Capture(0, 3, 1), Capture(0, 4, 1)), [0], [10], 64, 4)


def test_pending_captures_hand_over_only_what_the_forward_wrote() -> None:
    free_list = [5, 6, 7]
    freed: list[int] = []
    pending = PendingCaptures(lambda: free_list.pop(0) if free_list else None, freed.extend)
    # a: chunk [10, 40): 5 is cached already, 60 lies in a later chunk; b: the pool runs dry.
    a, b = list(range(100, 160)), list(range(8))
    batch = pending.plan([("a", 10, 40, (5, 20, 40, 60), a), ("b", 0, 8, (8,), b)])
    assert batch is not None and [(c.row, c.offset, c.slot) for c in batch.captures] == [
        (0, 10, 5),
        (0, 30, 6),
        (1, 8, 7),
    ]
    assert pending.skipped == 0 and pending.held() == 3
    assert sorted((p, t[0]) for p, t in pending.in_flight()) == [(8, 0), (20, 100), (40, 100)]
    assert pending.plan([("c", 0, 4, (2,), b)]) is None and pending.skipped == 1
    batch.layers, batch.written = 3, 2  # the forward stopped short of the last state layer
    assert not batch.served
    batch.written = 3
    assert pending.take("a", 20).states == {20: 5} and pending.held() == 2
    pending.drop("a")  # aborted before its next checkpoint: the capture at 40 goes back
    assert freed == [6] and "a" not in pending
    batch.written = 0  # a forward that did not write them (not our mixer)
    taken = pending.take("b", 8)
    assert taken.states == {} and taken.unserved == 1 and freed == [6, 7]
    assert pending.held() == 0 and pending.unserved == 1


# ---------------------------------------------------------------- the real forward


def _make_model(tmp: pytest.TempPathFactory, family: str) -> Path:
    out = tmp.mktemp("inpass") / f"tiny-{family}"
    script = str(ROOT / "scripts" / "make_tiny_model.py")
    subprocess.run(
        [sys.executable, script, "--family", family, "--out", str(out)],
        check=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_model(tmp_path_factory, "nemotron_h")


def _probe(model: Path, strategy: str, *extra: str, env: Any = ()) -> dict[str, dict[str, Any]]:
    from jenga_sglang.bench.drivers.server import STRATEGY_ENV

    done = subprocess.run(
        [sys.executable, "-m", "tests.inpass_probe", "--model", str(model), "--strategy",
         strategy, *extra],
        cwd=ROOT,
        env=dict(os.environ, **STRATEGY_ENV[strategy], **dict(env)),
        capture_output=True,
        text=True,
        timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["scenario"]: row for row in rows}


@pytest.mark.sglang
@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_inpass_states_equal_prefix_alone_prefill(tiny_model: Path, strategy: str) -> None:
    found = _probe(tiny_model, strategy)
    # bf16 conv states but with extra_buffer (bench/drivers/server.py STRATEGY_ENV)
    _check_probe(found, strategy, None if strategy == "extra_buffer" else FP32_TOL)
    assert found["slots"]["captures"] >= 36


@pytest.mark.sglang
@pytest.mark.slow
def test_gated_deltanet_states_equal_prefix_alone_prefill(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same through the tiny Qwen3.5's Gated DeltaNet layers (SGLang's chunked FLA
    prefill), served as make e2e-models serves it: float32 conv states."""
    model = _make_model(tmp_path_factory, "qwen3_5")
    from jenga_sglang.bench.drivers.tiny_families import FAMILIES

    found = _probe(model, "no_buffer", "--lean", env=FAMILIES["qwen3_5"].serve_env)
    _check_probe(found, "no_buffer", None, conv_tol=GDN_CONV_TOL)
    assert found["slots"]["captures"] >= 17


def _check_probe(
    found: dict[str, dict[str, Any]], strategy: str, step_tol: float | None,
    conv_tol: float = FP32_TOL,
) -> None:  # fmt: skip
    """Every planned position captured, its state equal to the prefix-alone prefill's; conv
    within `conv_tol` (fp32 conv states) or, with `step_tol`, within one bf16 rounding step
    plus `step_tol` (fp32 GEMM rounding of cancelling sums)."""
    scenarios = ["single", "batch-row0", "batch-row1", "batch-row2", "resumed", "chunked"]
    scenarios += ["tail-row0", "tail-row1"]  # prompt ends alone: copied, no kernel
    for name in [*scenarios, "natural"]:
        for row in found[name]["rows"]:
            where = f"{strategy} {name} p={row['p']}"
            assert row["captured"], where
            assert row["temporal_err"] <= FP32_TOL, where
            if step_tol is None:
                assert row["conv_err"] <= conv_tol, where
            else:
                assert row["conv_beyond_step"] <= step_tol, where
    assert found["resumed"]["hit"] == 100  # it started from the cached state
    assert found["natural"]["planned"] == [70, 120]  # branch point, prompt end
    assert found["logits"]["unchanged"]  # capturing does not perturb the forward
    assert found["slots"]["settled"]  # every capture slot taken or freed
    assert found["gather"]["calls"] > 0 and found["gather"]["mismatches"] == 0
    assert found["tails"]["launches"] == 0
    counted = found["slots"]  # what jenga:inpass_captures / _lost / prefill_cuts export
    assert counted["lost"] == 0 and counted["cuts"] == 0


@pytest.mark.sglang
def test_mamba2_mixer_architectures_match_sglangs_model_files() -> None:
    """The in-pass list is exactly the architectures whose model files build MambaMixer2."""
    import importlib.util
    import re

    from jenga_sglang.binding.cache.factory import MAMBA2_MIXER_ARCHS

    spec = importlib.util.find_spec("sglang.srt.models")
    assert spec is not None and spec.submodule_search_locations
    models = Path(next(iter(spec.submodule_search_locations)))
    found: set[str] = set()
    for source in models.glob("*.py"):
        text = source.read_text()
        if "MambaMixer2(" not in text:
            continue
        entry = re.search(r"^EntryClass\s*=\s*\[?([^\]\n]+)\]?", text, re.MULTILINE)
        assert entry is not None, source
        found |= {name.strip() for name in entry.group(1).split(",") if name.strip()}
    assert found == set(MAMBA2_MIXER_ARCHS)
