"""The server's policies: its options' record (binding/options.py) through the one builder.

The server differs from the simulator only in where a tuner replays: in a background process,
off the request path (policies/background.py), and with tensor parallelism only on the leader
rank, whose outcome `channel` gives every rank (binding/cache/tp_share.py).
"""

from __future__ import annotations

from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies import bundles
from jenga_sglang.policies.background import BackgroundReplay, ShareChannel
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy


def build_admission(options: JengaOptions, spec: ModelSpec) -> AdmissionPolicy:
    return bundles.build_admission(options.policy, spec)


def build_eviction(options: JengaOptions) -> EvictionPolicy:
    return bundles.build_eviction(options.policy)


def build_tuner(options: JengaOptions, channel: ShareChannel | None = None) -> AlphaTuner | None:
    """The record's tuner (none when alpha is fixed or the eviction reads none), replaying in a
    background worker that shares its outcome over `channel`."""
    return bundles.build_tuner(options.policy, BackgroundReplay(channel=channel))
