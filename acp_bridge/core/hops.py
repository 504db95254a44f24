"""The agent processes of one client connection ("hops"), and where each session lives.

A client connection reaches one agent process or more; each is a hop, numbered as it
joins, and hop 0 (:data:`PRIMARY`) is the process started with the connection. A pooled
adapter adds others and says which session lives in which. :class:`Hops` owns

* each hop's requests in flight (:class:`~acp_bridge.core.pending.PendingTable`) and
  whether its process is gone, with its exit status;
* the session → hop table.

The rules:

* A hop's number is never given twice, so nothing recorded for a process that is gone is
  taken for a later one's.
* A client message goes to the hop its session (``params.sessionId``) was last placed in;
  one that names no session, or a session never placed, goes to the primary.
* Placing a session in the primary, or unplacing it (closed, deleted), sends its frames to
  the primary again.
* When a process is gone its sessions are forgotten with it: their frames go to the
  primary (and a session placed in it afterwards still does).

It does no I/O and calls nothing: the adapter says where a session lives through its
context, the runtime hands that over as values (:meth:`Hops.place`, :meth:`Hops.unplace`),
and routing a frame is a lookup here (:meth:`Hops.hop_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from acp_bridge.core.pending import PendingTable
from acp_bridge.wire.jsonrpc import JsonObject

PRIMARY: Final = 0


@dataclass(slots=True)
class Hop:
    """One agent connection: its requests in flight, and whether it is gone."""

    pending: PendingTable = field(default_factory=PendingTable)
    closed: bool = False
    status: int | None = None


class Hops:
    """The hops of one client connection (``hops[n]``, ``len(hops)``) and the session →
    hop table."""

    __slots__ = ("_hops", "_placed")

    def __init__(self) -> None:
        self._hops: dict[int, Hop] = {PRIMARY: Hop()}
        # Session id -> the hop it lives in, for sessions not in the primary.
        self._placed: dict[str, int] = {}

    def __getitem__(self, hop: int) -> Hop:
        return self._hops[hop]

    def __len__(self) -> int:
        return len(self._hops)

    def add(self) -> int:
        """A new agent process joins the connection; its hop number."""
        hop = max(self._hops) + 1
        self._hops[hop] = Hop()
        return hop

    def close(self, hop: int, status: int | None) -> Hop:
        """Agent process ``hop`` is gone with exit ``status``: its sessions are forgotten.
        The hop, whose pending requests the caller fails."""
        state = self._hops[hop]
        state.closed = True
        state.status = status
        self._placed = {name: at for name, at in self._placed.items() if at != hop}
        return state

    def place(self, session_id: str, hop: int) -> None:
        """Session ``session_id`` lives in agent process ``hop`` from now on: the client's
        frames naming it go there."""
        if hop == PRIMARY:
            self._placed.pop(session_id, None)
        else:
            self._placed[session_id] = hop

    def unplace(self, session_id: str) -> None:
        """Session ``session_id`` is gone (closed, deleted): its frames go to the primary."""
        self._placed.pop(session_id, None)

    def hop_for(self, message: JsonObject) -> int:
        """The hop a client message goes to: the one its session was placed in, else (or
        when that process is gone) the primary."""
        if not self._placed:
            return PRIMARY
        params = message.get("params")
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        hop = self._placed.get(session_id) if isinstance(session_id, str) else None
        if hop is None or self._hops[hop].closed:
            return PRIMARY
        return hop
