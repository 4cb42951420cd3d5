"""bench/drivers/process.py: stopping a loopback process takes its whole process group. And
bench/drivers/server.py's ports for servers that bind them later."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jenga_sglang.bench.drivers import server
from jenga_sglang.bench.drivers.process import LoopbackProcess, ServerError


class _Probe(LoopbackProcess):
    name = "probe"

    def __init__(self, script: str, log: Path, ready: bool = True) -> None:
        super().__init__(["bash", "-c", script], log=log, ready_timeout_s=6, env={})
        self.ready = ready

    def _ready(self) -> bool:
        return self.ready


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits there for PID 1 to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _gone(pid: int) -> bool:
    for _ in range(50):  # bounded: 5 s
        if not _running(pid):
            return True
        time.sleep(0.1)
    return False


def _child(pidfile: Path) -> int:
    for _ in range(50):  # bounded: 5 s
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.1)
    raise AssertionError("the child never started")


@pytest.mark.parametrize("launcher_exits", [False, True])
def test_stop_takes_the_children_even_when_the_launcher_is_gone(
    tmp_path: Path, launcher_exits: bool
) -> None:
    pidfile, go = tmp_path / "child.pid", tmp_path / "go"
    # The launcher exits only once told to (bounded: 10 s), after the probe is ready: exiting
    # before the readiness poll is a start-up failure, which another test covers.
    tail = (
        f"for _ in $(seq 100); do [ -e {go} ] && exit 0; sleep 0.1; done"
        if launcher_exits
        else "wait"
    )
    probe = _Probe(f"sleep 300 & echo $! > {pidfile}; {tail}", tmp_path / "log")
    with probe:
        child = _child(pidfile)
        assert _running(child)
        if launcher_exits:
            go.touch()
            assert probe._proc is not None
            assert probe._proc.wait(timeout=5) == 0
    assert probe.pid is None
    assert _gone(child)


def test_a_process_that_never_gets_ready_is_stopped_and_quoted(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    probe = _Probe(f"echo starting; sleep 300 & echo $! > {pidfile}; wait", tmp_path / "log", False)
    with pytest.raises(ServerError, match=r"probe not ready after 6 s(.|\n)*starting"):
        probe.__enter__()
    assert probe.pid is None
    assert _gone(_child(pidfile))


def test_a_launcher_that_exits_before_ready_is_reported_with_its_log(tmp_path: Path) -> None:
    probe = _Probe("echo bad flag; exit 3", tmp_path / "log", ready=False)
    with pytest.raises(
        ServerError, match=r"probe exited with 3 before it was ready(.|\n)*bad flag"
    ):
        probe.__enter__()
    assert probe.pid is None


def test_sigterm_to_the_caller_stops_what_it_holds(tmp_path: Path) -> None:
    """A study killed with SIGTERM unwinds and stops its server: the server runs in a session
    of its own, which a signal to the study's group would not reach."""
    pidfile = tmp_path / "child.pid"
    script = f"""
import sys, time
from pathlib import Path
from jenga_sglang.bench.drivers.process import LoopbackProcess

class Probe(LoopbackProcess):
    def _ready(self):
        return True

with Probe(["bash", "-c", "sleep 300 & echo $! > {pidfile}; wait"], log=Path("{tmp_path}/log"),
           ready_timeout_s=6, env={{}}):
    print("held", flush=True)
    time.sleep(60)
"""
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert caller.stdout is not None and caller.stdout.readline().strip() == b"held"
        child = _child(pidfile)
        assert _running(child)
        caller.send_signal(signal.SIGTERM)
        assert caller.wait(timeout=40) == 128 + signal.SIGTERM
        assert _gone(child)
    finally:
        caller.kill()
        caller.wait(timeout=10)


def test_server_ports_avoid_the_ephemeral_range_and_are_never_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port that a server binds only later must not be one an outgoing connection can take
    meanwhile (the ephemeral range), nor one SGLang picks for its own ports (22000 up); one
    held by a listener or handed out before is skipped, and none left is an error."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [server.free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    assert all(15000 <= p < min(22000, ephemeral_low) for p in ports), ports
    first = ports[0]
    monkeypatch.setattr(server, "_PORT_RANGE", (first, first + 2))  # handed out, held, free
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", first + 1))
        held.listen()
        monkeypatch.setattr(server, "_handed_out", {first})
        assert server.free_port() == first + 2
        with pytest.raises(OSError, match="no free port"):
            server.free_port()
