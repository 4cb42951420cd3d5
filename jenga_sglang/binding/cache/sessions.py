"""Radix sessions (`--enable-session-radix-cache`): an open session keeps its last paths.

SGLang's scheduler opens a session when a client calls /open_session (`open_radix_session`),
stamps each request of it with the session's generation (`ensure_session_generation`), and
releases it at /close_session or when the session times out (`release_radix_session`). In
between, the path a finished, not aborted, request of the session inserted stays locked in the
tree, so the session's next turn finds its history and the state at its end whatever the
eviction policy would drop; SGLang's own components keep their session leaves the same way.

A session holds one lock per leaf it reached: a finish whose path extends a held leaf moves that
lock down to its own node (the new lock covers the old path, since a lock protects a node and
its ancestors), a finish that branches off adds one. A finish after the close, or one stamped
with an earlier incarnation of a reused session id, locks nothing. Every lock a session holds is
released at its close, so a session cannot outlive it: locked KV and states count as protected
in SGLang's usage figures and idle check, as a running request's do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from jenga_sglang.radix.node import Node

#: Closed session ids remembered so that a late finish does not lock again (SGLang keeps 8192).
CLOSED_REMEMBERED = 8192


class SessionLocks:
    """Tree locks held for open radix sessions. `lock(node)` / `unlock(lock)` are the
    backend's (`BasePrefixCache.lock`: a lock on a node protects it and its ancestors)."""

    def __init__(self, lock: Callable[[Node], Any], unlock: Callable[[Any], None]) -> None:
        self._lock, self._unlock = lock, unlock
        self._incarnations = 0
        self._generation: dict[str, int] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._held: dict[str, list[tuple[Node, Any]]] = {}

    def open(self, session_id: str | None) -> int | None:
        """A new incarnation of `session_id` (a reused id starts over); None for no id."""
        if session_id is None:
            return None
        self._closed.pop(session_id, None)
        self._incarnations += 1
        self._generation[session_id] = self._incarnations
        return self._incarnations

    def generation(self, session_id: str) -> int:
        """The open incarnation of `session_id`, opening one if there is none."""
        current = self._generation.get(session_id)
        return current if current is not None else int(self.open(session_id) or 0)

    def release(self, session_id: str | None) -> int:
        """Close `session_id`: its locks go; the number released."""
        if session_id is None or session_id in self._closed:
            return 0
        self._closed[session_id] = None
        while len(self._closed) > CLOSED_REMEMBERED:
            self._closed.popitem(last=False)
        self._generation.pop(session_id, None)
        held = self._held.pop(session_id, [])
        for _, lock in held:
            self._unlock(lock)
        return len(held)

    def release_all(self) -> int:
        """Close every open session (a flushed cache): the number of locks released."""
        open_ = sorted({*self._generation, *self._held})  # one order on every TP rank
        return sum(self.release(session_id) for session_id in open_)

    def keep(self, req: Any, node: Node) -> None:
        """A finished request inserted its path down to `node`: lock it for the request's
        session, if the request belongs to the open incarnation of one."""
        session_id = getattr(req, "session_id", None)
        if session_id is None and getattr(req, "session", None) is not None:
            session_id = req.session.session_id
        if session_id is None or node.parent is None:
            return
        stamped = getattr(req, "session_generation", None)
        if stamped is None or self._generation.get(session_id) != stamped:
            return  # closed, never opened, or a request of an earlier incarnation
        held = self._held.setdefault(session_id, [])
        if any(n is node for n, _ in held):
            return
        ancestors = {id(n) for n in node.path_from_root()}
        for covered in [h for h in held if id(h[0]) in ancestors]:
            held.remove(covered)
            self._unlock(covered[1])  # the new lock covers its path
        held.append((node, self._lock(node)))

    def locks(self) -> int:
        """Locks held for every open session."""
        return sum(len(v) for v in self._held.values())
