"""The requests in flight on one connection (one hop), and the ids they travel under.

Each agent connection has one :class:`PendingTable`. A request keeps the id its sender
gave it unless that id is already in flight on the connection it goes to; only then is it
sent under a fresh ``acp-bridge-N`` id, and the response is matched back through the table.
Requests the bridge itself sends (an adapter's own calls, an intercepted request forwarded
by its hook) are in the same table, so no two requests in flight on a connection can ever
share an id. :class:`AgentRequests` does the same for the requests agent processes send
the client.
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

    def awaited(self) -> bool:
        """Whether the runtime itself waits for an answer in flight here (an adapter's own
        request, or an intercepted one)."""
        return any(isinstance(origin, ForWaiter) for origin in self._entries.values())

    def drain(self) -> list[Origin]:
        """The connection is gone: every request in flight, in the order they were sent."""
        origins = list(self._entries.values())
        self._entries.clear()
        return origins


class AgentRequests:
    """The requests agent processes sent the client, under the ids the client knows them by.

    Processes pick their ids alone, so two may use one id at once: the second is sent to
    the client under a fresh id (the client's side is one more :class:`PendingTable`), its
    answer goes back to its own process under the process's id, and a cancel the process
    sends for it is translated the same way.
    """

    def __init__(self) -> None:
        self._client_ids = PendingTable()
        self._by_client: dict[RequestId, tuple[int, RequestId]] = {}
        self._by_agent: dict[tuple[int, RequestId], RequestId] = {}

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._by_client

    def register(self, hop: int, agent_id: RequestId) -> RequestId:
        """A request of process ``hop``: the id the client gets it under."""
        client_id = self._client_ids.register(agent_id, FromClient(agent_id))
        self._by_client[client_id] = (hop, agent_id)
        self._by_agent[(hop, agent_id)] = client_id
        return client_id

    def get(self, client_id: RequestId) -> tuple[int, RequestId] | None:
        """The process and its own id of the request the client knows as ``client_id``."""
        return self._by_client.get(client_id)

    def client_id(self, hop: int, agent_id: RequestId) -> RequestId:
        """The id the client knows a request of ``hop`` by (its own, if not one pending)."""
        return self._by_agent.get((hop, agent_id), agent_id)

    def resolve(self, client_id: RequestId) -> tuple[int, RequestId] | None:
        """The client answered ``client_id``: the process and id the answer goes to."""
        target = self._by_client.pop(client_id, None)
        if target is not None:
            self._client_ids.resolve(client_id)
            self._by_agent.pop(target, None)
        return target

    def drop_hop(self, hop: int) -> None:
        """Process ``hop`` is gone: forget its requests."""
        for client_id, (owner, _) in list(self._by_client.items()):
            if owner == hop:
                self.resolve(client_id)
