"""The requests in flight on one connection (one hop), and the ids they travel under.

Each agent connection has one :class:`PendingTable`. A request keeps the id its sender
gave it unless that id is already in flight on the connection it goes to; only then is it
sent under a fresh ``acp-bridge-N`` id, and the response is matched back through the table.
Requests the bridge itself sends (an adapter's own calls, an intercepted request forwarded
by its hook) are in the same table, so no two requests in flight on a connection can ever
share an id.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TypeAlias

from acp_bridge.wire.jsonrpc import RequestId


@dataclass(frozen=True, slots=True)
class FromClient:
    """A client request relayed as it came: its answer goes back to the client."""

    client_id: RequestId


@dataclass(frozen=True, slots=True)
class ForWaiter:
    """A request the runtime waits on (an adapter's own, or an intercepted one)."""

    waiter: int


Origin: TypeAlias = FromClient | ForWaiter


class PendingTable:
    """Wire id -> who waits for the answer, for the requests in flight on one connection."""

    def __init__(self, prefix: str = "acp-bridge-") -> None:
        self._entries: dict[RequestId, Origin] = {}
        self._prefix = prefix
        self._counter = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, wire_id: object) -> bool:
        return wire_id in self._entries

    def fresh_id(self) -> str:
        while True:
            candidate = f"{self._prefix}{next(self._counter)}"
            if candidate not in self._entries:
                return candidate

    def register(self, preferred: RequestId, origin: Origin) -> RequestId:
        """Record a request; return the id it must be sent under (``preferred`` if free)."""
        wire_id = self.fresh_id() if preferred in self._entries else preferred
        self._entries[wire_id] = origin
        return wire_id

    def get(self, wire_id: RequestId) -> Origin | None:
        """Who waits for the answer to ``wire_id``, leaving it in flight."""
        return self._entries.get(wire_id)

    def resolve(self, wire_id: RequestId) -> Origin | None:
        """The answer to ``wire_id`` arrived: who gets it (None: not a request in flight)."""
        return self._entries.pop(wire_id, None)

    def drain(self) -> list[Origin]:
        """The connection is gone: every request in flight, in the order they were sent."""
        origins = list(self._entries.values())
        self._entries.clear()
        return origins
