"""One policy record for every driver: named bundles, the builder, the server's flags, and the
cache under test as its own `jenga-bench` option (no sglang imported here)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from radix_helpers import hybrid_spec

from jenga_sglang.bench.cli.main import main
from jenga_sglang.bench.runs.runner import RunConfig, validate
from jenga_sglang.binding.cache.policy import build_tuner as server_tuner
from jenga_sglang.binding.options import (
    SERVER_POLICY,
    JengaFlagError,
    add_jenga_args,
    check_conflicts,
    options_from_namespace,
)
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bundles import build_policies
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.reference_eviction import MarconiEviction
from jenga_sglang.policies.registry import BUNDLES, PolicyRecord, bundle
from jenga_sglang.policies.tuners import MarconiTuner, SlidingTuner

#: What each bundle built before the registry (policies/bundles.py at 64209a0).
BEFORE = {
    "vllm-blocks": (EveryBlockAdmission, LruEviction, type(None), True),
    "sglang-lru": (SpeculativeAdmission, LruEviction, type(None), True),
    "sglang-lru-faithful": (SpeculativeAdmission, LruEviction, type(None), False),  # new
    "marconi": (SpeculativeAdmission, MarconiEviction, MarconiTuner, False),
    "marconi-linear": (SpeculativeAdmission, FlopAwareEviction, MarconiTuner, True),
    "marconi-faithful": (SpeculativeAdmission, MarconiEviction, MarconiTuner, False),  # new
    "marconi-postevict": (SpeculativeAdmission, MarconiEviction, MarconiTuner, False),
    "jenga": (BranchLearningAdmission, JengaEviction, SlidingTuner, True),
}


@pytest.mark.parametrize("name", list(BUNDLES))
def test_every_bundle_builds_what_it_built_before(name: str) -> None:
    admission, eviction, tuner, lock = BEFORE[name]
    record = bundle(name)
    built = build_policies(record, hybrid_spec())
    assert type(built.admission) is admission and type(built.eviction) is eviction
    assert type(built.tuner) is tuner and record.lock_prefix is lock
    assert getattr(built.eviction, "alpha", 0.0) == 0.0  # auto starts at 0
    if isinstance(built.admission, SpeculativeAdmission):
        assert built.admission.prompt_end is False  # traces resend replies verbatim
    assert built.admission.plans_on_sequence is name.endswith("-faithful")
    if isinstance(built.tuner, MarconiTuner) and name == "marconi-postevict":
        assert built.tuner.multiplier == 2 and not built.tuner.from_start


def test_records_reject_unknown_kinds_and_bad_alphas() -> None:
    with pytest.raises(ValueError, match="unknown eviction 'lfu'"):
        PolicyRecord(eviction="lfu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        PolicyRecord(alpha=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        bundle("marconi@nan")
    assert bundle("marconi@0.5") == PolicyRecord(
        "speculative", "marconi", 0.5, "none", lock_prefix=False
    )


def test_the_server_tuner_replays_in_the_background_whatever_the_record() -> None:
    from jenga_sglang.binding.options import JengaOptions

    marconi = JengaOptions(enabled=True, policy=bundle("marconi"))
    tuner = server_tuner(marconi)
    assert isinstance(tuner, MarconiTuner) and tuner.background is not None
    assert build_policies(bundle("marconi"), hybrid_spec()).tuner.background is None  # type: ignore[union-attr]


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_jenga_args(parser)
    args = parser.parse_args(list(argv))
    check_conflicts(args)
    return args


def test_server_flags_start_from_a_named_bundle_and_override_it() -> None:
    assert options_from_namespace(_flags("--enable-jenga")).policy == SERVER_POLICY
    assert replace(bundle("jenga"), prompt_end=True) == SERVER_POLICY
    marconi = options_from_namespace(_flags("--enable-jenga", "--jenga-policy", "marconi"))
    assert marconi.policy == replace(bundle("marconi"), prompt_end=True)
    fixed = _flags("--enable-jenga", "--jenga-policy", "marconi@0.5", "--jenga-alpha", "auto")
    assert options_from_namespace(fixed).policy.alpha is None  # 'auto' overrides a fixed alpha
    lru = _flags("--enable-jenga", "--jenga-policy", "sglang-lru", "--no-jenga-prompt-end")
    assert options_from_namespace(lru).policy == bundle("sglang-lru")
    with pytest.raises(JengaFlagError, match="--jenga-policy given without --enable-jenga"):
        _flags("--jenga-policy", "marconi")
    with pytest.raises(SystemExit):
        _flags("--enable-jenga", "--jenga-policy", "lfu")


def test_sglang_caches_are_an_option_not_a_policy() -> None:
    def config(policy: str, **kw: object) -> RunConfig:
        return RunConfig("t.jsonl", "marconi-7b", 2.0, policy, **kw)  # type: ignore[arg-type]

    validate(config("", cache="sglang-native"))
    validate(config("marconi", via="sglang"))  # every bundle runs through SGLang
    cases = {
        "needs --cache jenga": config("jenga", cache="sglang-native"),
        "is SGLang's own": config("", cache="sglang-native-unified", via="sglang"),
        r"--cache sglang-native\)": config("sglang-native"),  # the old spelling says the new
        "--mode sequential only": config("jenga", via="sglang", mode="engine"),
        "unknown cache": config("jenga", cache="vllm"),
    }
    for needle, bad in cases.items():
        with pytest.raises(ValueError, match=needle):
            validate(bad)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("replay", "--trace", "t", "--cache-gb", "2"), "needs --policy"),
        (
            (
                "sweep",
                "--trace",
                "t",
                "--cache-gb",
                "2",
                "--caches",
                "sglang-native",
                "--policies",
                "jenga",
            ),
            "--policies applies to --caches jenga",
        ),
        (("sweep", "--trace", "t", "--cache-gb", "2", "--caches", "lfu"), "unknown caches"),
    ],
)
def test_bad_cache_options_exit_2_with_one_line(
    argv: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
