"""The CPU test shim for prefill-decode disaggregation (jenga_sglang/cpu_transfer.py): Mooncake's
transfer engine calls over loopback TCP. Two engines in one process stand for the prefill and
decode sides; the server-level run is tests/test_e2e_pd.py."""

from __future__ import annotations

import logging

import pytest
import torch

from jenga_sglang.cpu_transfer import TcpTransferEngine, received_bytes


def _engine() -> TcpTransferEngine:
    engine = TcpTransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return engine


def test_a_batch_write_lands_in_the_peers_registered_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jenga_sglang.cpu_transfer")
    sender, receiver = _engine(), _engine()
    source = torch.arange(64, dtype=torch.float32)
    target = torch.zeros(64, dtype=torch.float32)
    assert receiver.register_memory(target.data_ptr(), target.numel() * 4) == 0
    peer = f"127.0.0.1:{receiver.get_rpc_port()}"
    runs = [(0, 8), (20, 4), (60, 4)]  # element offset, count: three runs of one batch
    status = sender.batch_transfer_sync_write(
        peer,
        [source.data_ptr() + 4 * start for start, _ in runs],
        [target.data_ptr() + 4 * start for start, _ in runs],
        [4 * count for _, count in runs],
    )
    assert status == 0
    assert received_bytes(caplog.text) == 4 * 16  # what pd_cpu reports as moved
    expected = torch.zeros(64)
    for start, count in runs:
        expected[start : start + count] = source[start : start + count]
    assert torch.equal(target, expected)
    assert sender.send_probe(peer) == 0  # an empty batch: the peer answers


def test_a_write_outside_registered_memory_is_refused_and_writes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jenga_sglang.cpu_transfer")
    sender, receiver = _engine(), _engine()
    source = torch.ones(16)
    target = torch.zeros(16)
    receiver.register_memory(target.data_ptr(), 8 * 4)  # only the first half
    peer = f"127.0.0.1:{receiver.get_rpc_port()}"
    inside_then_outside = sender.batch_transfer_sync_write(
        peer,
        [source.data_ptr(), source.data_ptr()],
        [target.data_ptr(), target.data_ptr() + 6 * 4],  # the second run crosses the end
        [4 * 4, 4 * 4],
    )
    assert inside_then_outside == -1
    assert target[:4].eq(1).all() and target[4:].eq(0).all()  # the refused run wrote nothing
    assert received_bytes(caplog.text) == 4 * 4  # only the run inside counts
    assert receiver.unregister_memory(target.data_ptr()) == 0
    assert sender.transfer_sync_write(peer, source.data_ptr(), target.data_ptr(), 4) == -1


def test_an_unreachable_peer_is_a_failed_write() -> None:
    sender, closed = _engine(), _engine()
    port = closed.get_rpc_port()
    assert closed._server is not None
    closed._server.shutdown()
    closed._server.server_close()
    source = torch.ones(4)
    assert sender.transfer_sync_write(f"127.0.0.1:{port}", source.data_ptr(), 0, 16) == -1


def test_two_ranks_fill_one_peers_rows_half_by_half_at_once() -> None:
    """What a prefill TP 2 -> decode TP 1 transfer asks of the shim: two senders, at the same
    time, each write its half of every row (a head slice) as its own short run, at byte
    offsets that are no element's; every byte lands where it was sent."""
    from concurrent.futures import ThreadPoolExecutor

    rows, width, half = 96, 70, 35  # bytes: rows of 70, halves of 35
    senders, receiver = [_engine(), _engine()], _engine()
    sources = [torch.randint(0, 256, (rows, half), dtype=torch.uint8) for _ in senders]
    target = torch.zeros(rows, width, dtype=torch.uint8)
    assert receiver.register_memory(target.data_ptr(), target.numel()) == 0
    peer = f"127.0.0.1:{receiver.get_rpc_port()}"

    def send(rank: int) -> int:
        src = sources[rank]
        return senders[rank].batch_transfer_sync_write(
            peer,
            [src.data_ptr() + r * half for r in range(rows)],
            [target.data_ptr() + r * width + rank * half for r in range(rows)],
            [half] * rows,
        )

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(send, (0, 1))) == [0, 0]
    assert torch.equal(target, torch.cat(sources, dim=1))
