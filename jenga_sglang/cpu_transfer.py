"""CPU-only test shim: a transfer engine for prefill-decode disaggregation over loopback TCP.

SGLang 0.5.23's PD transfer backends cannot start on this CPU machine: `mooncake-transfer-engine`
loads CUDA's runtime and `libibverbs`, `nixl` needs `nixl-cu12`, and the `fake` backend is
decode-only (docs/sglang.md, "Prefill-decode disaggregation"). SGLang's Mooncake backend
drives its engine through a handful of calls (`mooncake.engine.TransferEngine`: initialize,
register memory, a synchronous batch write of (local address, peer address, length) triples
to a peer named "host:port"), and everything else of PD (the bootstrap server, the
handshakes, the prefill and decode queues, the Mamba state's transfer) is SGLang's Python.

`TcpTransferEngine` is that engine over TCP: each process serves its registered memory on a
port, and a write sends the bytes to the peer, which copies them into its own memory after
checking that they land inside a region it registered. So the bytes SGLang asks to move do
move, and a decode server's outputs can be compared with a single server's. It is slow
(Python sockets) and for tests only; RDMA, NVLink and GPU memory are out of scope.

Installed in the plugin's CPU interpreter mode only (no CUDA, ``TRITON_INTERPRET=1``), and only
when `mooncake.engine` does not import: the stand-in module is `mooncake.engine` in
`sys.modules`, and `MC_FORCE_TCP=1` (SGLang's switch for Mooncake's TCP transport) keeps
SGLang from looking for InfiniBand devices; once initialized, the engine has SGLang's
Mooncake sender take the index path of its other backends (its pinned-memory one records a CUDA
event). On a GPU machine nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import socket
import socketserver
import struct
import sys
import threading
import types
from collections.abc import Sequence

_HEAD = struct.Struct("!I")  # writes in the batch
_ITEM = struct.Struct("!QQ")  # peer address, length
_ACK_OK, _ACK_BAD = b"\x01", b"\x00"
_TIMEOUT_S = 60.0
_log = logging.getLogger(__name__)
#: The line each received batch logs (`received_bytes` sums them from a server's log).
_RECEIVED = "cpu-transfer received {} bytes in {} runs"


class TcpTransferEngine:
    """`mooncake.engine.TransferEngine`'s calls SGLang makes, over loopback TCP."""

    def __init__(self) -> None:
        self._regions: dict[int, int] = {}  # registered address -> length
        self._lock = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None

    # ------------------------------------------------------------------ set-up

    def initialize(self, hostname: str, metadata: str, protocol: str, device: str) -> int:
        """Serve this process's registered memory on a free port of `hostname`."""
        from sglang.srt.disaggregation.mooncake import conn as mooncake_conn

        # The sender's pinned-memory index path records a CUDA event; on CPU the indices are
        # host tensors already, so it takes the path of SGLang's other backends.
        mooncake_conn.MooncakeKVSender.supports_host_tensor_indices = False
        engine = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                engine._receive(self.request)

        server = socketserver.ThreadingTCPServer((hostname, 0), Handler)
        server.daemon_threads = True
        threading.Thread(
            target=server.serve_forever, name="jenga-cpu-transfer", daemon=True
        ).start()
        self._server = server
        return 0

    def get_rpc_port(self) -> int:
        if self._server is None:
            raise RuntimeError("TcpTransferEngine: initialize() first")
        return int(self._server.server_address[1])

    def get_engine(self) -> TcpTransferEngine:
        return self

    def register_memory(self, ptr: int, length: int) -> int:
        with self._lock:
            self._regions[int(ptr)] = int(length)
        return 0

    def unregister_memory(self, ptr: int) -> int:
        with self._lock:
            return 0 if self._regions.pop(int(ptr), None) is not None else -1

    def batch_register_memory(self, ptrs: Sequence[int], lengths: Sequence[int]) -> int:
        for ptr, length in zip(ptrs, lengths, strict=True):
            self.register_memory(ptr, length)
        return 0

    def batch_unregister_memory(self, ptrs: Sequence[int]) -> int:
        return min((self.unregister_memory(p) for p in ptrs), default=0)

    def send_probe(self, peer: str) -> int:
        return self.batch_transfer_sync_write(peer, [], [], [])

    # ------------------------------------------------------------------ writes

    def transfer_sync_write(self, peer: str, buffer: int, peer_address: int, length: int) -> int:
        return self.batch_transfer_sync_write(peer, [buffer], [peer_address], [length])

    def batch_transfer_sync_write(
        self,
        peer: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
    ) -> int:
        """Write each local run to the peer's address; 0 once the peer has copied them all,
        -1 when it refused one (outside its registered memory) or could not be reached."""
        host, _, port = peer.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), _TIMEOUT_S) as conn:
                conn.sendall(_HEAD.pack(len(buffers)))
                for buffer, address, length in zip(buffers, peer_addresses, lengths, strict=True):
                    conn.sendall(_ITEM.pack(int(address), int(length)))
                    conn.sendall(ctypes.string_at(int(buffer), int(length)))
                return 0 if _exactly(conn, 1) == _ACK_OK else -1
        except OSError:
            return -1

    def _receive(self, conn: socket.socket) -> None:
        """One batch from a peer: copy each run into registered memory, then acknowledge."""
        conn.settimeout(_TIMEOUT_S)
        ok = True
        try:
            (count,) = _HEAD.unpack(_exactly(conn, _HEAD.size))
            total = 0
            for _ in range(count):
                address, length = _ITEM.unpack(_exactly(conn, _ITEM.size))
                data = _exactly(conn, length)
                if self._inside(address, length):
                    ctypes.memmove(address, data, length)
                    total += length
                else:
                    ok = False  # never write outside what this process registered
            if count:  # (a probe moves nothing)
                _log.info(_RECEIVED.format(total, count))
            conn.sendall(_ACK_OK if ok else _ACK_BAD)
        except OSError:  # ConnectionError included: the peer went away mid-batch
            return

    def _inside(self, address: int, length: int) -> bool:
        with self._lock:
            return any(s <= address and address + length <= s + n for s, n in self._regions.items())


def received_bytes(log: str) -> int:
    """Bytes the engine copied in, summed over a server log's lines."""
    pattern = re.escape(_RECEIVED).replace(r"\{\}", r"(\d+)")
    return sum(int(m.group(1)) for m in re.finditer(pattern, log))


def _exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed mid-transfer")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def install() -> bool:
    """Make `mooncake.engine.TransferEngine` this stand-in, in the CPU interpreter mode and
    only where Mooncake itself does not import; True when installed."""
    from jenga_sglang.cpu_interpreter import sglang_needs_cpu_patches

    if not sglang_needs_cpu_patches():
        return False
    engine = sys.modules.get("mooncake.engine")
    if getattr(engine, "TransferEngine", None) is TcpTransferEngine:
        return True
    try:
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        return False  # a real Mooncake: leave it
    package = types.ModuleType("mooncake")
    package.__path__ = []
    package.__doc__ = module_doc = "jenga_sglang CPU test stand-in (jenga_sglang/cpu_transfer.py)"
    module = types.ModuleType("mooncake.engine", module_doc)
    module.TransferEngine = TcpTransferEngine  # type: ignore[attr-defined]
    package.engine = module  # type: ignore[attr-defined]
    sys.modules["mooncake"], sys.modules["mooncake.engine"] = package, module
    os.environ.setdefault("MC_FORCE_TCP", "1")  # SGLang then asks for no InfiniBand device
    return True
